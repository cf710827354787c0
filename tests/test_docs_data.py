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

import pytest
import yaml

from spectra_lab.blocks.common import sci

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


def test_h100_model_is_what_the_code_gives_today():
    # (its table is a generated block, data:gpu-model-h100)
    from spectra_lab.estimate.gpu_model import format_report, report

    stored = data("docs/data/gpu_model_h100.json")
    # the model is deterministic: the stored rows are what the code gives today
    fresh = report((30.0, 300.0), stored["efficiency"], stored["launch_us"])
    assert format_report(fresh) == format_report(stored)


# --------------------------------------------------------------------------- main job


def main_job() -> dict[str, dict[int, float]]:
    runs = data("results/main-job/results.json")["runs"]
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        out.setdefault(r["point"]["optimizer"], {})[r["seed"]] = r["val_loss"]
    return out


def test_readme_quick_start_prints_seed_1337s_run():
    import math

    # the quick start's printed line is seed 1337's Spectra-AdamW run (the main job's tables
    # are generated blocks: spectra_lab.pages, tests/test_docs_pages.py)
    s0 = main_job()["spectra-adamw"][1337]
    assert_quoted(f"val loss {s0:.4f} | val ppl {math.exp(s0):.2f}", "README.md")


# --------------------------------------------------------------------------- DDP split


def test_stored_traffic_counts_agree_with_the_model():
    # (the tables are generated blocks, data:bench-dist-*)
    stored = data("docs/data/bench_dist_traffic.json")
    for r in stored["traffic"]:
        got = sum(r["received"]) / len(r["received"])
        # counted and modelled agree to the finite checks' few bytes
        assert got == pytest.approx(r["model"], abs=16)
    for r in stored["traffic_model"]:
        assert r["fsdp2-gram"] < r["fsdp2-whole"]


# --------------------------------------------------------------------------- diagnostics


def test_the_monitored_runs_train_as_the_main_job():
    # (the diagnostics page's figures are generated blocks, data:diag-*)
    for name in ("adamw", "spectra-adamw"):
        s = data(f"results/diagnostics/{name}/summary.json")
        assert s["val_loss"] == main_job()[name][1337]  # the monitor changes nothing


# --------------------------------------------------------------------------- operators


def test_the_weight_norms_stay_within_two_percent():
    adamw, spectra = data("results/diagnostics/norms/norms.json")["runs"]
    drift = max(abs(b / a - 1) for a, b in zip(adamw["sum_weight_fro"], spectra["sum_weight_fro"],
                                               strict=True))  # fmt: skip
    assert drift < 0.02  # "within 2% of each other all along"


def test_readme_reproducibility_figures_are_the_stored_repeats():
    runs = main_job()
    repro = {n: data(f"results/main-job/repro/{n}/summary.json")["val_loss"]
             for n in ("adamw", "adamw-generic", "spectra-adamw-generic")}  # fmt: skip
    diag_adamw = data("results/diagnostics/adamw/summary.json")["val_loss"]
    assert repro["adamw"] == diag_adamw == runs["adamw"][1337]  # bit-reproducible
    assert data("results/diagnostics/spectra-adamw/summary.json")["val_loss"] == runs[
        "spectra-adamw"][1337]  # fmt: skip
    d_adamw = repro["adamw-generic"] - runs["adamw"][1337]
    d_spectra = repro["spectra-adamw-generic"] - runs["spectra-adamw"][1337]
    assert abs(d_spectra) < abs(d_adamw) / 100


@pytest.mark.parametrize("method", ["mixed", "chebyshev"])
def test_the_main_job_with_a_pinned_clip_is_the_stored_sweep(method):
    sweep = f"results/main-job-{method}"
    grid = yaml.safe_load(text(f"{sweep}/grid.yaml"))
    assert grid["base"]["optimizer_kwargs"] == {"clip_method": method}
    assert grid["seeds"] == [1337, 1338, 1339]
    pinned = {r["seed"]: r["val_loss"] for r in data(f"{sweep}/results.json")["runs"]}
    exact = main_job()["spectra-adamw"]
    d = [pinned[s] - exact[s] for s in (1337, 1338, 1339)]
    mean, sd = sum(d) / 3, statistics.stdev(d)
    t = mean / (sd / 3**0.5)
    m = statistics.fmean(pinned.values())
    verdict = "significant" if abs(t) > 4.303 else "not significant"
    assert_quoted(
        f"end at {m:.4f} ± {statistics.stdev(pinned.values()):.4f}, paired against `eigh` "
        f"{mean:+.4f} ± {sd:.4f} (t = {t:.1f}, {verdict})",
        "README.md",
    )


# --------------------------------------------------------------------------- synthetic


def test_synthetic_figures_are_the_stored_seed_0_run():
    fw = data("results/synth/fw_summary.json")
    worst = max(r["residual_final"] for r in fw["runs"] if r["mode"] == "full")
    assert worst <= 5e-6
    spikes = {c["method"]: c for c in data("results/synth/spikes_summary.json")["chosen"]
              if c["scale"] == 1000.0}  # fmt: skip
    assert f"{spikes['sgd_spectral_clip']['best_final_loss']:.0e}".replace("e-0", "e-") == "4e-3"
    for m in ("sgd", "sgd_global_clip"):
        assert round(spikes[m]["best_final_loss"], 2) in (0.66, 0.67)


# --------------------------------------------------------------------------- downstream


# --------------------------------------------------------------------------- step timings


def test_main_job_runs_step_ratio_is_the_stored_pairs():
    pairs = data("docs/data/main_job_step_ratio.json")["pairs"]
    assert [p["spectra"]["soft_clip_auto"] for p in pairs] == ["mixed", "mixed"]
    # (the page's phrase is a generated block, data:step-ratio-main-job)
    for p in pairs:
        added = p["spectra"]["optimizer_ms"] - p["base"]["optimizer_ms"]
        assert p["by_optimizer_time"] == pytest.approx(1 + added / p["base"]["step_ms"])


# --------------------------------------------------------------------------- optimizer step


def test_the_peers_figures_on_the_cpu_are_the_stored_run():
    # the page names the fastest of torch's three AdamW steps: the one the stored run gives
    rows = {r["method"]: r for r in data("docs/data/bench_optim_peers_cpu_2threads.json")["rows"]}
    kinds = {"torch-adamw": "foreach", "torch-adamw-fused": "fused",
             "torch-adamw-loop": "per-parameter loop"}  # fmt: skip
    fastest = min(kinds, key=lambda m: rows[m]["step_s"])
    assert rows[fastest]["step_s"] < min(rows[m]["step_s"] for m in kinds if m != fastest)
    assert f"the {kinds[fastest]} step is the fastest of the three" in text("docs/optimizers.md")
    assert rows["torch-adamw-fused"]["time_ratio"] == pytest.approx(
        rows["torch-adamw-fused"]["step_s"] / rows["torch-adamw"]["step_s"], rel=1e-9
    )


def test_memory_claims_hold_on_the_stored_runs():
    def rows(name):
        return {r["method"]: r for r in data(f"docs/data/{name}.json")["rows"]}

    big, mem = rows("bench_optim_cpu_2threads"), rows("bench_optim_memory_cpu_2threads")

    def ratio(r, m, base):
        return r[m]["peak_bytes"] / r[base]["peak_bytes"]

    # the targets the docs state: within 1.10x of torch's AdamW on the path that runs
    assert ratio(mem, "spectra-adamw", "torch-adamw") <= 1.10
    assert ratio(big, "spectra-adamw", "torch-adamw") <= 1.10
    assert ratio(mem, "spectra-adamw-chunked", "torch-adamw-loop") <= 1.10


# --------------------------------------------------------------------------- the study


def test_the_runs_of_the_path_without_bf16_units_took_it():
    # the pages quote these for a CPU without bf16 units: each took that path on purpose
    names = ("bench_ops_cpu", "bench_ops_cpu_recorded", "bench_ops_cpu_synthetic",
             "bench_ssc_vs_orth_cpu", "main_job_clip_step_no_bf16",
             "main_job_clip_step_avx2", "main_job_clip_step_signum_no_bf16",
             "main_job_clip_step_avx2_epyc", "main_job_clip_step_signum_avx2_epyc")  # fmt: skip
    for name in names:
        assert data(f"docs/data/{name}.json")["cpu_bf16"].startswith("emulated"), name


# --------------------------------------------------------------------------- the GPU check


def test_gpu_check_without_cuda_is_one_line_and_success(monkeypatch, capsys):
    import torch

    from spectra_lab.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "gpu-check", "--out", "/nonexistent/gpu"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA GPU here" in out


def test_gpu_check_skips_a_part_with_less_than_four_fifths_of_its_limit_left(
    monkeypatch, tmp_path, capsys
):
    # a fake clock: each part that runs takes 65 s of the 200-second budget
    import argparse
    import json

    import torch

    from spectra_lab.gpucheck import check as gpu_check

    now = [0.0]
    ran: list[tuple[str, float]] = []

    def part(name: str):
        def run(out, timeout):
            ran.append((name, timeout))
            now[0] += 65.0
            return {"status": "passed", "tests": 1, "passed": 1}

        return run

    parts = {"tests": (part("tests"), 100.0), "a": (part("a"), 100.0),
             "b": (part("b"), 100.0), "c": (part("c"), 50.0)}  # fmt: skip
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "about_machine", lambda: {
        "date": "d", "gpu": "g", "gpus": 1, "torch": "t", "cuda": "c", "python": "p",
        "commit": None})  # fmt: skip
    monkeypatch.setattr(gpu_check, "PARTS", parts)
    assert gpu_check.run(argparse.Namespace(budget=200.0, out=str(tmp_path))) == 0
    # 200 s left: tests runs (limit 100); 135 left: a runs; 70 left (< 0.8 * 100): b is skipped;
    # 70 left (>= 0.8 * 50): c runs, with its own limit
    assert ran == [("tests", 100.0), ("a", 100.0), ("c", 50.0)]
    index = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert index["b"] == {"status": "not run", "reason": "70 s of budget left"}
    capsys.readouterr()


def test_gpu_check_summary_has_the_780m_table_with_or_without_its_tf32_half(tmp_path):
    import json
    import shutil

    from spectra_lab.gpucheck.summary import markdown_summary

    stored = DATA / "gpu"
    heading = "Optimizer step at the 780M shapes"
    rows = {r["method"]: r for r in data("docs/data/gpu/bench_optim_780m.json")["rows"]}
    mixed = rows["spectra-adamw-mixed"]
    # the peers' table: step, × torch AdamW, × torch Muon; no paper wrapper nor memory there
    cells = f"{1e3 * mixed['step_s']:.1f} | {mixed['time_ratio']:.2f} | {mixed['vs_muon']:.2f}"
    line = f"| `spectra-adamw-mixed` | {cells} | – | – |"
    assert heading in markdown_summary(stored) and line in markdown_summary(stored)
    # without the TF32 half its column reads "–"; without the float32 half no table
    folder = shutil.copytree(stored, tmp_path / "gpu")
    index = json.loads((folder / "gpu_check.json").read_text())
    index["parts"]["bench_optim_780m_tf32"] = {"status": "not run", "reason": "budget"}
    (folder / "gpu_check.json").write_text(json.dumps(index))
    assert f"{line} – |" in markdown_summary(folder)
    index["parts"]["bench_optim_780m"] = {"status": "failed"}
    (folder / "gpu_check.json").write_text(json.dumps(index))
    summary = markdown_summary(folder)
    assert heading not in summary and "Optimizer step at the 124M shapes" in summary


# --------------------------------------------------------------------------- native bf16 CPU


def test_native_bf16_figures_are_the_stored_runs():

    ops = data("docs/data/bench_ops_cpu_native_bf16.json")
    assert ops["cpu_bf16"].startswith("native")
    cells = ops["cells"]

    def ratios(method: str, kind: str) -> list[float]:
        return [c["vs_paper_bf16"] for c in cells if c["method"] == method
                and (kind in c["input"] if kind == "@" else c["input"] == kind)]  # fmt: skip

    readme = text("docs/operators.md").splitlines()
    for kind in ("@", "sign", "adam_spike"):
        got = ratios("auto", kind)
        label = ops["cpu_bf16"].replace(" (", ", ").removesuffix(")")
        row = next(line for line in readme if f"| {label}" in line
                   and f"| {span(min(got), max(got))} |" in line)  # fmt: skip
        worst = max(c["rel_err"] for c in cells if c["method"] == "auto"
                    and (kind in c["input"] if kind == "@" else c["input"] == kind))  # fmt: skip
        assert f"| ≤ {sci(worst)} |" in row, row
    rate = ops["matmul_gflops"]["bf16"] / ops["matmul_gflops"]["fp32"]
    assert_quoted(f"run at {rate:.1f}× the float32 rate", "docs/operators.md")


def test_operators_page_native_bf16_tables_are_the_stored_runs():

    cells = data("docs/data/bench_ops_cpu_native_bf16.json")["cells"]
    doc = text("docs/operators.md")
    labels = {"adam_spike": "Adam-like spike", "sign": "sign"}
    for c in cells:
        if c["method"] != "auto" or c["input"] not in labels:
            continue
        mine = {
            x["method"]: x for x in cells if (x["shape"], x["input"]) == (c["shape"], c["input"])
        }
        ratios = " | ".join(f"{mine[m]['vs_paper_bf16']:.2f}" for m in ("auto", "eigh", "polar"))
        errs = " | ".join(
            f"{mine[m]['rel_err']:.1e}" for m in ("auto", "eigh", "polar", "paper_bf16")
        )
        shape = c["shape"].replace("x", "×")
        row = next(line for line in doc.splitlines()
                   if line.startswith(f"| {shape} | {labels[c['input']]}"))  # fmt: skip
        assert f"| {ratios} | {errs} |" in row, row
    for m in ("auto", "eigh", "polar", "mixed"):
        med = statistics.median(c["vs_paper_bf16"] for c in cells if c["method"] == m)
        assert_quoted(f"`{m}` {med:.2f}", "docs/operators.md")
    optim = {
        r["method"]: r for r in data("docs/data/bench_optim_cpu_native_bf16_2threads.json")["rows"]
    }
    for m, r in optim.items():
        assert_quoted(f"| `{m}` | {r['step_s']:.3f} |", "docs/operators.md")


def test_the_main_jobs_clip_held_to_avx2_is_the_stored_run():
    run = data("docs/data/main_job_clip_step_avx2.json")
    # the libraries were held to AVX2 and the operators took the path without bf16 units
    assert run["isa_limits"] == {
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "SPECTRA_CPU_BF16_UNITS": "0",
    }
    assert run["cpu_capability"] == "AVX2" and run["command"].startswith("MKL_ENABLE_INSTRUCTIONS=")
    rows = {r["row"]: r for r in run["rows"]}
    assert list(rows) == ["adamw", "spectra-adamw auto", "spectra-adamw eigh",
                          "spectra-adamw mixed", "spectra-adamw polar"]  # fmt: skip
    twin = rows["adamw"]
    for key, r in rows.items():
        line = (f"| {r['total_ms']:.1f} | {r['optimizer_ms']:.1f} | {r['ratio_by_steps']:.3f} "
                f"| {r['ratio_by_optimizer_time']:.3f} |")  # fmt: skip
        assert_quoted(line, "docs/operators.md")
        assert r["ratio_by_steps"] == r["total_ms"] / twin["total_ms"], key
        by_opt = 1 + (r["optimizer_ms"] - twin["optimizer_ms"]) / twin["total_ms"]
        assert abs(r["ratio_by_optimizer_time"] - by_opt) < 1e-12, key
    # the page's reading of it: the default (chebyshev on this path) at the target by optimizer
    # time, below eigh and mixed (the default there: tests/test_ops_chebyshev.py)
    auto, eigh, mixed = (rows[f"spectra-adamw {m}"]["ratio_by_optimizer_time"]
                         for m in ("auto", "eigh", "mixed"))  # fmt: skip
    assert round(auto, 2) <= 1.05 < eigh and auto < mixed
    assert_quoted(f"meets the `1.05×` target at {auto:.3f}×, against {eigh:.3f}× for `eigh` and "
                  f"{mixed:.3f}× for `mixed`", "docs/operators.md")  # fmt: skip
    assert_quoted(f"float32 products ran at {run['fp32_gflops']:.0f} GFLOP/s", "docs/operators.md")
    # "as fast as unrestricted": within 10% of the rate of the run without the ISA limits
    unrestricted = data("docs/data/main_job_clip_step_no_bf16.json")["fp32_gflops"]
    assert run["fp32_gflops"] >= 0.9 * unrestricted


def test_the_main_jobs_clip_on_an_avx2_only_cpu_is_the_stored_run():
    # measured on a CPU without bf16 units of its own: no AVX-512 BF16 or AMX flag, the probe's
    # plain "emulated" (no override) and nothing held back
    for name in ("main_job_clip_step_avx2_epyc", "main_job_clip_step_signum_avx2_epyc"):
        run = data(f"docs/data/{name}.json")
        assert run["cpu_flags"] == ["avx2"] and run["cpu_bf16"] == "emulated", name
        assert run["isa_limits"] == {} and run["cpu_capability"] == "AVX2", name
        assert run["runs"] == 3 and "SPECTRA_CPU_BF16_UNITS" not in run["command"], name
        rows = {r["row"]: r for r in run["rows"]}
        twin = run["rows"][0]
        for key, r in rows.items():
            # the runs' spread is that of the ratios stored beside it
            each = r["runs_ratio_by_optimizer_time"]
            assert len(each) == 3 and r["runs_mean"] == pytest.approx(statistics.mean(each))
            assert r["runs_std"] == pytest.approx(statistics.stdev(each), abs=1e-15)
            assert r["ratio_by_steps"] == r["total_ms"] / twin["total_ms"], key
            by_opt = 1 + (r["optimizer_ms"] - twin["optimizer_ms"]) / twin["total_ms"]
            assert abs(r["ratio_by_optimizer_time"] - by_opt) < 1e-12, key
            line = (f"| {r['total_ms']:.1f} | {r['optimizer_ms']:.1f} | {r['ratio_by_steps']:.3f} "
                    f"| {r['ratio_by_optimizer_time']:.3f} | {r['runs_mean']:.3f} ± "
                    f"{r['runs_std']:.3f} |")  # fmt: skip
            assert_quoted(line, "docs/operators.md")
    rows = {r["row"]: r for r in data("docs/data/main_job_clip_step_avx2_epyc.json")["rows"]}
    auto = rows["spectra-adamw auto"]
    # the 1.05x target of the step on such a CPU, by optimizer time, pooled and in every run
    assert round(auto["ratio_by_optimizer_time"], 2) <= 1.05
    assert max(auto["runs_ratio_by_optimizer_time"]) <= 1.05
    assert auto["ratio_by_optimizer_time"] < rows["spectra-adamw eigh"]["ratio_by_optimizer_time"]
    # the trainer's own timings of the main job there (experiments/step_ratio.py)
    ratio = data("docs/data/main_job_step_ratio_avx2_epyc.json")
    assert ratio["machine"]["cpu_bf16"] == "emulated" and len(ratio["pairs"]) == 2
    for p in ratio["pairs"]:
        added = p["spectra"]["optimizer_ms"] - p["base"]["optimizer_ms"]
        assert p["by_optimizer_time"] == pytest.approx(1 + added / p["base"]["step_ms"])
    quoted = " and ".join(f"{p['by_optimizer_time']:.3f}" for p in ratio["pairs"])
    assert_quoted(f"**{quoted}×** by optimizer time", "docs/operators.md")
    phrase = (f"meets the `1.05×` target at {auto['ratio_by_optimizer_time']:.3f}× (its runs: "
              f"{auto['runs_mean']:.3f} ± {auto['runs_std']:.3f}")  # fmt: skip
    assert_quoted(phrase, "docs/operators.md")


def test_the_main_jobs_clip_on_the_path_without_bf16_units_is_the_stored_run():
    run = data("docs/data/main_job_clip_step_no_bf16.json")
    assert run["cpu_bf16"].startswith("emulated (SPECTRA_CPU_BF16_UNITS=0; the CPU has ")
    rows = {r["row"]: r for r in run["rows"]}
    assert list(rows) == ["adamw", "spectra-adamw eigh/32", "spectra-adamw eigh",
                          "spectra-adamw mixed", "spectra-adamw auto"]  # fmt: skip
    for key, r in rows.items():
        line = (f"| {r['total_ms']:.1f} | {r['optimizer_ms']:.1f} | {r['ratio_by_steps']:.3f} "
                f"| {r['ratio_by_optimizer_time']:.3f} |")  # fmt: skip
        assert_quoted(line, "docs/operators.md")
        twin = rows["adamw"]
        assert r["ratio_by_steps"] == r["total_ms"] / twin["total_ms"], key
    before = rows["spectra-adamw eigh/32"]["ratio_by_optimizer_time"]
    after = rows["spectra-adamw eigh"]["ratio_by_optimizer_time"]
    assert_quoted(f"from {before:.2f}× to {after:.2f}× by optimizer time", "docs/operators.md")
    assert_quoted(f"at {run['fp32_gflops']:.0f} GFLOP/s (`fp32_gflops` in the file)",
                  "docs/operators.md")  # fmt: skip


def test_every_stored_gpu_run_is_listed_and_the_gpu_page_shows_the_list():
    # each run under docs/data/gpu/<gpu>/<date>/ holds the files runs.json lists, its index
    # names that GPU and date, and docs/gpu.md shows the table rendered from runs.json
    from spectra_lab.gpucheck.runs import runs_table

    runs = data("docs/data/gpu/runs.json")["runs"]
    assert runs
    for run in runs:
        folder = DATA / "gpu" / run["folder"]
        for name in run["files"] + list(run.get("also", {})):
            assert (folder / name).is_file(), (run["folder"], name)
        index = json.loads((folder / "gpu_check.json").read_text())
        assert (index["gpu"], index["date"], index["commit"]) == (
            run["gpu"],
            run["date"],
            run["commit"],
        )
    block = re.search(r"<!-- gpu:runs -->\n(.*?)\n<!-- /gpu:runs -->", text("docs/gpu.md"), re.S)
    assert block is not None and block.group(1) == runs_table(DATA / "gpu")


def test_stored_runs_that_later_code_changes_are_listed_as_a_warning():
    # not a failure: a GPU run can only be repeated where a GPU is lent, and a CPU timing wants
    # a quiet machine; the list (spectra docs --stale) says which figures describe older code
    import subprocess
    import warnings

    from spectra_lab.bench.machines import stale_runs

    if (ROOT / ".git").exists():  # every recorded commit is one of this history's
        for run in data("docs/data/gpu/runs.json")["runs"]:
            if run["commit"]:
                found = subprocess.run(["git", "cat-file", "-e", f"{run['commit']}^{{commit}}"],
                                       cwd=ROOT, capture_output=True, check=False)  # fmt: skip
                assert found.returncode == 0, run
    stale = stale_runs(ROOT)
    print("\n".join(["stale stored runs:", *stale]))
    for line in stale:
        warnings.warn(f"stale stored run: {line}", UserWarning, stacklevel=1)


def test_the_machines_page_lists_what_every_stored_measurement_records():
    from spectra_lab.bench.machines import machine_of, machines, machines_table

    block = re.search(
        r"<!-- data:machines -->\n(.*?)\n<!-- /data:machines -->", text("docs/machines.md"), re.S
    )
    assert block is not None and block.group(1) == machines_table(DATA)
    # every JSON report and every GPU run is in exactly one row
    listed = [f for files in machines(DATA).values() for f in files]
    assert sorted(listed) == sorted(
        [p.name for p in DATA.glob("*.json")]
        + [f"gpu/{r['folder']}/" for r in data("docs/data/gpu/runs.json")["runs"]]
    )
    # what a report written by today's benches records
    from spectra_lab.machine import device_about

    assert machine_of(device_about("cpu")).startswith(device_about("cpu")["cpu"])


def test_remeasure_runs_the_command_each_page_shows_for_its_report():
    # experiments/remeasure.py measures the stale reports again; each command it runs is the one
    # the page prints beside the report's table (the memory run's one thread is a variant the
    # page names in words, the symmetric Gram run and the step ratio are in their scripts)
    import importlib.util

    spec = importlib.util.spec_from_file_location("remeasure", ROOT / "experiments/remeasure.py")
    remeasure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(remeasure)
    shown = " ".join(text(str(p.relative_to(ROOT))) for p in [ROOT / "README.md",
                     *sorted((ROOT / "docs").glob("*.md"))])  # fmt: skip
    shown = re.sub(r"\s+", " ", re.sub(r"\\\n\s*", " ", shown)).replace("PYTHONPATH=src ", "")
    commands = dict(remeasure.COMMANDS)
    one_thread = commands.pop("bench_optim_memory_cpu_1thread")
    assert one_thread == commands["bench_optim_memory_cpu_2threads"].replace(
        "--threads 2", "--threads 1").replace("2threads.json", "1thread.json")  # fmt: skip
    elsewhere = {"symmetric_gram_cpu": "experiments/symmetric_gram.py",
                 "main_job_step_ratio": "experiments/step_ratio.py"}  # fmt: skip
    missing = [n for n, c in commands.items() if n not in elsewhere and c not in shown]
    assert missing == []
    for name, script in elsewhere.items():
        assert f"docs/data/{name}.json" in (ROOT / script).read_text()
    # every report the machines page lists as a CPU measurement is measured again by it, but the
    # one kept as a record of its moment (a busy machine)
    cpu = [f.removesuffix(".json") for m, files in __import__(
        "spectra_lab.bench.machines", fromlist=["machines"]).machines(DATA).items()
        if not m.startswith(("none", "NVIDIA")) for f in files]  # fmt: skip
    kept = {"symmetric_gram_cpu_busy"}
    assert sorted(set(cpu) - kept) == sorted(remeasure.COMMANDS)
