"""The generated blocks of README.md and docs/ (``spectra_lab.pages``, ``spectra docs``): every
block agrees with its data, every page lists the stored files its figures come from, and the
prose outside the blocks holds no measurement."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from spectra_lab import pages
from spectra_lab.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_every_block_of_the_pages_agrees_with_its_data():
    assert pages.problems(ROOT) == []


def test_no_page_holds_a_measurement_outside_its_blocks():
    # every figure is rendered from a stored file, a quote of the paper, or gone
    strays = {str(page.relative_to(ROOT)): pages.stray_numbers(page.read_text())
              for page in pages.pages(ROOT)}  # fmt: skip
    assert {page: found for page, found in strays.items() if found} == {}


PROSE = """\
Spectra-AdamW runs at 0.56× AdamW's tokens/s and ends at 4.234 ± 0.004; a step takes 105 s
and 12% of the memory, with an error of 3.2e-7.
<!-- data:x -->0.62×, 4.4782<!-- /data:x --> and `--lr 3.5e-3`, `0.9×`;
```
loss 4.4824
```
<!-- paper -->The paper's bf16 run reaches 2.13×.<!-- /paper -->
torch 2.13.0 on Python 3.11, c = 10.5, at lr 3.5e-3, tolerance 1e-5, the 3.3M preset, 16 × 256
tokens, t at the 95% level, [a link](docs/x-1.5.md).
"""


def test_stray_numbers_are_measurements_outside_blocks_code_and_quotes():
    found = pages.stray_numbers(PROSE)
    numbers = [s for s in ("0.56×", "4.234", "0.004", "105 s", "12%", "3.2e-7") if
               any(s in f for f in found)]  # fmt: skip
    assert numbers == ["0.56×", "4.234", "0.004", "105 s", "12%", "3.2e-7"]
    assert len(found) == 6, found  # nothing of the block, code, quote, versions or settings


def test_fill_and_extract_handle_line_and_inline_blocks():
    text = "a <!-- data:x -->1%<!-- /data:x --> b\n<!-- data:t -->\n| 1 |\n<!-- /data:t -->\n"
    assert pages.keys(text) == ["data:x", "data:t"]
    assert pages.extract(text, "data:x") == "1%" and pages.extract(text, "data:t") == "| 1 |"
    out = pages.fill(pages.fill(text, "data:x", "2%"), "data:t", "| 2 |\n| 3 |\n")
    assert out == ("a <!-- data:x -->2%<!-- /data:x --> b\n<!-- data:t -->\n| 2 |\n| 3 |\n"
                   "<!-- /data:t -->\n")  # fmt: skip
    with pytest.raises(ValueError, match="line breaks"):
        pages.fill(text, "data:x", "1\n2")
    # a table inside a list item keeps the item's indentation, closing marker included
    item = "* a list item:\n\n  <!-- data:t -->\n  <!-- /data:t -->\n"
    filled = pages.fill(item, "data:t", "| 1 |\n| 2 |")
    assert filled == "* a list item:\n\n  <!-- data:t -->\n  | 1 |\n  | 2 |\n  <!-- /data:t -->\n"
    assert pages.extract(filled, "data:t") == "| 1 |\n| 2 |"
    with pytest.raises(ValueError, match="no block"):
        pages.fill(text, "data:y", "1")


def _tree(tmp_path: Path) -> Path:
    """A copy of what the pages' blocks read: the pages and their data."""
    for rel in ("README.md", "docs", "results"):
        src, dst = ROOT / rel, tmp_path / rel
        if src.is_dir():
            skip = shutil.ignore_patterns("runs", "ckpt", "*.png", "*.pt", "*.csv.gz")
            shutil.copytree(src, dst, ignore=skip)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    return tmp_path


def test_spectra_docs_checks_and_rewrites_a_changed_figure(tmp_path, capsys):
    root = _tree(tmp_path)
    readme = (root / "README.md").read_text()
    assert "| 4.4824 | 88.45 |" in readme
    (root / "README.md").write_text(readme.replace("| 4.4824 | 88.45 |", "| 4.4825 | 88.45 |"))
    assert main(["docs", "--root", str(root), "--check"]) == 1
    out = capsys.readouterr().out
    assert "README.md: data:main-job: differs from the data" in out
    assert (
        "-| `adamw` (`clip_c=None`) | 4.4825" in out
        and "+| `adamw` (`clip_c=None`) | 4.4824" in out
    )
    assert main(["docs", "--root", str(root)]) == 0
    assert (root / "README.md").read_text() == readme
    assert main(["docs", "--root", str(root), "--check"]) == 0


def test_spectra_docs_reports_a_missing_data_file_and_a_bad_root_in_one_line(tmp_path, capsys):
    root = _tree(tmp_path)
    shutil.rmtree(root / "results" / "main-job-mixed")
    assert main(["docs", "--root", str(root), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "spectra docs: error: results/main-job-mixed/results.json is missing"
    assert main(["docs", "--root", str(tmp_path / "nowhere")]) == 2
    assert "no README.md there" in capsys.readouterr().err


def test_a_stored_run_goes_stale_when_a_later_commit_changes_the_code_it_measures(tmp_path):
    import json
    import subprocess

    from spectra_lab.bench.machines import stale_runs

    def git(*args: str) -> str:
        env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
               "GIT_COMMITTER_EMAIL": "a@b", "PATH": "/usr/bin:/bin"}  # fmt: skip
        out = subprocess.run(["git", *args], cwd=tmp_path, env=env, capture_output=True,
                             text=True, check=True)  # fmt: skip
        return out.stdout.strip()

    def commit(path: str, text: str) -> str:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
        git("add", path)
        git("commit", "-qm", path)
        return git("rev-parse", "--short", "HEAD")

    assert stale_runs(tmp_path) == []  # not a checkout: nothing to say
    git("init", "-q")
    first = commit("src/spectra/ops/x.py", "a = 1\n")
    cpu = {"cpu": "a CPU", "cpu_bf16": "native", "commit": first}
    commit("docs/data/recorded.json", json.dumps(cpu))
    stored = commit("docs/data/unrecorded.json", json.dumps({"cpu": "a CPU"}))
    commit("docs/data/model.json", json.dumps({"what": "a model, not a measurement"}))
    assert stale_runs(tmp_path) == []
    commit("src/spectra/optim/y.py", "b = 2\n")
    commit("README.md", "no code\n")
    assert stale_runs(tmp_path) == [
        f"docs/data/recorded.json (commit {first}): 1 later commits change src/spectra/ops, "
        "src/spectra/optim",
        f"docs/data/unrecorded.json (records no commit; stored at {stored}): 1 later commits "
        "change src/spectra/ops, src/spectra/optim",
    ]
