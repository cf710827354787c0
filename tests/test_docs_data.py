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


# --------------------------------------------------------------------------- diagnostics


def diag(name: str) -> dict:
    return data(f"results/diagnostics/{name}/spectra.json")


def records(name: str, layer_part: str, steps: tuple[int, ...]) -> list[dict]:
    return [r for layer, x in diag(name)["layers"].items() if layer_part in layer
            for r in x["records"] if r["step"] in steps]  # fmt: skip


def test_diagnostics_gradient_table_is_the_stored_adamw_run():
    doc = text("docs/diagnostics.md")
    for layer, x in diag("adamw")["layers"].items():
        cells = [f"{r['grad']['max_over_median']:.0f}" for r in x["records"]]
        row = f"| `{layer.removesuffix('.weight')}` | " + " | ".join(cells) + " |"
        assert row in doc, row


def test_diagnostics_update_ceilings_quoted_from_the_stored_runs():
    every = (1, 15, 150, 297)
    late = records("spectra-adamw", "attn.wq", (150, 297))
    late_mlp = records("spectra-adamw", "mlp.w1", (150, 297))
    warm = records("spectra-adamw", "attn.wq", (15,))
    warm_mlp = records("spectra-adamw", "mlp.w1", (15,))

    def rng(rs, key="sigma_max", part="update", fmt=".2f"):
        vals = [r[part][key] for r in rs]
        return f"{min(vals):{fmt}}–{max(vals):{fmt}}"

    assert_quoted(f"σ_max is {rng(late)} for `attn.wq`", "docs/diagnostics.md")
    assert_quoted(f"{rng(late_mlp, fmt='.1f')} for `mlp.w1`", "docs/diagnostics.md")
    assert_quoted(f"gives {rng(warm, fmt='.1f')} (bound 20) and {rng(warm_mlp, fmt='.1f')}",
                  "docs/diagnostics.md")  # fmt: skip
    adamw = records("adamw", "", every)
    sig = [r["update"]["sigma_max"] for r in adamw]
    assert_quoted(f"its σ_max runs from {min(sig):.1f} to {max(sig):.0f}", "docs/diagnostics.md")
    assert_quoted(f"AdamW's reach {min(sig):.1f}–{max(sig):.0f}", "README.md")
    assert_quoted(f"(σ_max {rng(late)} for the 192×192 attention matrices", "README.md")
    grad = [r["grad"]["max_over_median"] for r in adamw]
    upd = [r["update"]["max_over_median"] for r in adamw]
    assert_quoted(f"σ_max/median {min(upd):.0f}–{max(upd):.0f} against "
                  f"{min(grad):.0f}–{max(grad):.0f}", "docs/diagnostics.md")  # fmt: skip
    assert_quoted(f"stand {min(grad):.0f}–{max(grad):.0f}× above the median", "README.md")
    for name in ("adamw", "spectra-adamw"):
        s = data(f"results/diagnostics/{name}/summary.json")
        assert s["val_loss"] == main_job()[name][1337]  # the monitor changes nothing


# --------------------------------------------------------------------------- operators


def ops_cells(which: str, **match) -> list[dict]:
    cells = data(f"docs/data/bench_ops_cpu_{which}.json")["cells"]
    return [c for c in cells if all(c[k] in v for k, v in match.items())]


def sci(x: float) -> str:
    """``4.9e-6``: one decimal, the exponent without a leading zero."""
    mant, exp = f"{x:.1e}".split("e")
    return f"{mant}e{int(exp)}"


def test_readme_operator_table_is_the_stored_bench_ops_runs():
    def rng(cells, key, fmt):
        vals = [c[key] for c in cells]
        return f"{min(vals):{fmt}}–{max(vals):{fmt}}"

    def at_most(cells, key="rel_err"):
        return f"≤ {sci(max(c[key] for c in cells))}"

    rows = {
        "recorded training directions (36 cells)": ("recorded", {}),
        "synthetic sign / Gaussian, 768² to 2048²": ("synthetic", {"input": ("sign", "gauss")}),
        "stress: spike at σ = 10³·c": ("synthetic", {"input": ("adam_spike",)}),
    }
    readme = text("README.md")
    for label, (which, match) in rows.items():
        auto = ops_cells(which, method=("auto",), **match)
        fp32 = {m: ops_cells(which, method=(m,), dtype=("fp32",), **match)
                for m in ("auto", "paper_fp32", "paper_bf16")}  # fmt: skip
        row = next(line for line in readme.splitlines() if line.startswith(f"| {label} |"))
        cells = [c.strip() for c in row.split("|")[2:-1]]
        assert cells[0] == rng(auto, "vs_paper_bf16", ".2f"), row
        assert cells[1] == at_most(fp32["auto"]), row
        for cell, m in zip(cells[2:], ("paper_fp32", "paper_bf16"), strict=True):
            worst = max(c["rel_err"] for c in fp32[m])
            expect = at_most(fp32[m]) if worst < 1e-2 and m == "paper_fp32" else None
            if expect is None:
                lo = min(c["rel_err"] for c in fp32[m])
                expect = (f"{lo:.2f}–{worst:.2f}" if lo > 0.1
                          else f"{sci(lo)} – {sci(worst)}")  # fmt: skip
            assert cell == expect, (row, cell, expect)
    misses = [c for c in ops_cells("recorded", method=("paper_bf16",)) if c["rel_err"] > 1e-2]
    assert_quoted(f"misses the 1e-2 accuracy bar on {len(misses)} of the 36 recorded cells",
                  "README.md")  # fmt: skip
