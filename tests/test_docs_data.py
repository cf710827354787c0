"""Figures quoted in README.md and docs/ against the stored data they come from.

Each table or number below was typed from a file under ``docs/data/`` or ``results/``, written
by the command the docs show next to it. These tests recompute what the docs say from that
file (with the command's own formatter where it has one), so a figure cannot drift from its
data. The study's page has its own check (``experiments/study/report.py --check``, run by
``tests/test_study_report.py``).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"


def text(path: str) -> str:
    return (ROOT / path).read_text()


def data(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def flat(s: str) -> str:
    """Whitespace collapsed, so that a phrase may wrap across lines of the Markdown."""
    return re.sub(r"\s+", " ", s)


def assert_quoted(phrase: str, *docs: str) -> None:
    for doc in docs:
        assert flat(phrase) in flat(text(doc)), f"{doc} does not say {phrase!r}"


def span(lo: float, hi: float, fmt: str = ".2f") -> str:
    return f"{lo:{fmt}}–{hi:{fmt}}"


# --------------------------------------------------------------------------- H100 model


def test_h100_model_table_is_the_stored_report():
    from spectra_lab.bench.gpu_model import format_report, report

    stored = data("docs/data/gpu_model_h100.json")
    for line in format_report(stored).splitlines()[2:]:
        assert line in text("docs/operators.md")
    # the model is deterministic: the stored rows are what the code gives today
    fresh = report((30.0, 300.0), stored["efficiency"], stored["launch_us"])
    assert format_report(fresh) == format_report(stored)


def test_readme_quotes_the_h100_model_default_and_split_route():
    rows = data("docs/data/gpu_model_h100.json")["rows"]

    def ratios(method: str) -> list[float]:
        return [r["vs_paper_bf16"] for r in rows if r["method"] == method]

    fp32_780 = [r["vs_paper_bf16"] for r in rows if r["method"] == "polar-fp32"
                and r["model"] == "780m"]  # fmt: skip
    assert_quoted(span(min(ratios("polar-bf16x3")), max(ratios("polar-bf16x3"))), "README.md")
    assert_quoted(span(min(fp32_780), max(fp32_780)), "README.md")


# --------------------------------------------------------------------------- main job


def main_job() -> dict[str, dict[int, float]]:
    runs = data("results/main-job/results.json")["runs"]
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        out.setdefault(r["point"]["optimizer"], {})[r["seed"]] = r["val_loss"]
    return out


def test_readme_main_job_table_is_the_main_job_sweep():
    import math

    runs = main_job()
    assert sorted(runs) == ["adamw", "spectra-adamw"]
    readme = text("README.md")
    for name, vals in runs.items():
        assert sorted(vals) == [1337, 1338, 1339]
        seed0 = vals[1337]
        ms = f"{statistics.fmean(vals.values()):.3f} ± {statistics.stdev(vals.values()):.3f}"
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}` ("))
        cells = [c.strip().strip("*") for c in row.split("|")[2:-1]]
        assert cells == [f"{seed0:.4f}", f"{math.exp(seed0):.2f}", ms], row
    d = [runs["adamw"][s] - runs["spectra-adamw"][s] for s in sorted(runs["adamw"])]
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    t = mean / (sd / math.sqrt(len(d)))
    assert_quoted(f"Δ = AdamW − Spectra-AdamW = {mean:.3f} ± {sd:.3f} (t = {t:.1f}", "README.md")
    # the quick start's printed line is seed 1337's Spectra-AdamW run
    s0 = runs["spectra-adamw"][1337]
    assert_quoted(f"val loss {s0:.4f} | val ppl {math.exp(s0):.2f}", "README.md")


# --------------------------------------------------------------------------- DDP split


def test_distributed_tables_are_the_stored_bench_dist_run():
    stored = data("docs/data/bench_dist_cpu.json")
    doc = text("docs/distributed.md")
    for r in stored["timing"]:
        row = f"| {r['procs']} | {r['threads']} | {r['unsplit']:.3f} | {r['split']:.3f} | "
        assert row in doc, row
        assert f"{r['ratio']:.2f}" in doc.split(row, 1)[1].splitlines()[0]
    mib = 1 << 20
    for v in stored["volume"]:
        cells = [v["ddp_allreduce"], v["ddp_split"], v["fsdp2_own"], v["fsdp2_spectral"]]
        row = f"| {v['preset']} | {v['n']} | " + " | ".join(f"{c / mib:.0f} MiB" for c in cells)
        assert row in doc, row
