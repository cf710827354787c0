"""``spectra bench ops`` on a tiny run, and the ``bench`` dispatcher (no timing assertions)."""

from __future__ import annotations

import json
import sys
import types

from spectra_lab.bench import ops as bench_ops
from spectra_lab.cli import main


def test_bench_ops_quick_writes_a_complete_table(tmp_path, capsys):
    out = tmp_path / "ops.json"
    args = ["bench", "ops", "--quick", "--no-progress", "--inputs", "adam_spike", "sign"]
    rc = main([*args, "--out", str(out)])
    assert rc == 0
    payload = json.loads(out.read_text())
    cells = payload["cells"]
    names = set(bench_ops.methods(1.0))
    n_groups = len(bench_ops.QUICK_SHAPES) * len(bench_ops.DTYPES) * 2
    assert len(cells) == n_groups * len(names)
    assert {cell["method"] for cell in cells} == names
    for cell in cells:
        assert cell["time_ms"] > 0 and cell["runs"] == 1
        if cell["method"] == "paper_fp32":
            assert cell["vs_paper_fp32"] == 1.0
        if cell["method"] in ("auto", "polar", "eigh", "svd"):
            assert cell["rel_err"] <= 1e-2, cell
    # the paper's method fails on the spiked input, as documented
    spiked = [c for c in cells if c["input"] == "adam_spike" and c["method"] == "paper_fp32"]
    assert all(c["rel_err"] > 0.5 for c in spiked)
    printed = capsys.readouterr().out
    assert "| shape | dtype | input |" in printed
    assert not list(tmp_path.glob(".bench-*"))  # the temporary file was renamed away


def test_bench_ops_writes_markdown_for_other_suffixes(tmp_path):
    out = tmp_path / "ops.md"
    args = ["bench", "ops", "--quick", "--no-progress", "--dtypes", "fp32", "--inputs", "gauss"]
    assert main([*args, "--out", str(out)]) == 0
    text = out.read_text()
    assert text.count("\n| ") == len(bench_ops.QUICK_SHAPES) + 1  # header + one line per shape


def test_bench_ops_rejects_bad_repeats(capsys):
    assert main(["bench", "ops", "--repeats", "0"]) == 2
    assert "--repeats" in capsys.readouterr().err


def test_bench_ops_does_not_import_the_optimizer_benchmark(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "spectra_lab.bench.optim", raising=False)
    args = ["bench", "ops", "--quick", "--no-progress", "--dtypes", "fp32", "--inputs", "gauss"]
    assert main([*args, "--shapes", "768x768"]) == 0  # --quick overrides the shapes
    assert "spectra_lab.bench.optim" not in sys.modules


def test_bench_optim_is_dispatched_to_its_module(monkeypatch):
    calls = []
    stub = types.ModuleType("spectra_lab.bench.optim")
    stub.add_arguments = lambda parser: parser.add_argument("--steps", type=int, default=1)
    stub.run = lambda args: calls.append(args.steps) or 0
    monkeypatch.setitem(sys.modules, "spectra_lab.bench.optim", stub)
    assert main(["bench", "optim", "--steps", "7"]) == 0
    assert calls == [7]
