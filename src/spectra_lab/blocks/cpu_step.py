"""The main job's optimizer step with each clip method on CPUs without bf16 units, against its
unclipped twin: the tables and phrases of ``experiments/clip_method_step.py``'s runs
(``docs/data/main_job_clip_step_*.json``), as :data:`CPU_STEP`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from spectra_lab.blocks.common import STEP_TARGET, json_of, table

#: The run on a CPU that has no bf16 units itself (an AVX2-only EPYC), and Signum's there.
EPYC = "main_job_clip_step_avx2_epyc"
EPYC_SIGNUM = "main_job_clip_step_signum_avx2_epyc"

ADAMW_LABELS = {"adamw": "AdamW twin", "spectra-adamw auto": "`chebyshev` (the default)",
                "spectra-adamw eigh": "`eigh`", "spectra-adamw mixed": "`mixed`",
                "spectra-adamw polar": "`polar`"}  # fmt: skip
SIGNUM_LABELS = {"signum": "Signum twin", "spectra-signum eigh": "`eigh`",
                 "spectra-signum auto": "`chebyshev` (the default)"}  # fmt: skip


def clip_step_table(root: Path, name: str, labels: dict[str, str]) -> str:
    """The rows of an ``experiments/clip_method_step.py`` run (``docs/data/NAME.json``); with
    ``--runs N`` a last column gives each run's ratio by optimizer time as mean ± std."""
    stored = json_of(root, f"docs/data/{name}.json")
    runs = stored.get("runs", 1)
    rows = []
    for r in stored["rows"]:
        row = [labels[r["row"]], f"{r['total_ms']:.1f}", f"{r['optimizer_ms']:.1f}",
               f"{r['ratio_by_steps']:.3f}", f"{r['ratio_by_optimizer_time']:.3f}"]  # fmt: skip
        if runs > 1:
            row.append(f"{r['runs_mean']:.3f} ± {r['runs_std']:.3f}")
        rows.append(row)
    head = ["row", "step (ms)", "optimizer step (ms)", "× twin", "× twin by optimizer time"]
    if runs > 1:
        head.append(f"the same, {runs} runs (mean ± std)")
    return table(head, rows, "lrrrr" + "r" * (runs > 1))


def no_bf16_table(root: Path) -> str:
    """The clip without bf16 units by batch floor (``main_job_clip_step_no_bf16.json``)."""
    labels = {"adamw": "AdamW twin",
              "spectra-adamw eigh/32": "`eigh`, batches of 1/32 (before the floor)",
              "spectra-adamw eigh": "`eigh`, batches of at least 2¹⁸ elements",
              "spectra-adamw mixed": "`mixed`",
              "spectra-adamw auto": "`chebyshev` (the default)"}  # fmt: skip
    return clip_step_table(root, "main_job_clip_step_no_bf16", labels)


def no_bf16_floor(root: Path) -> str:
    """The default around the batch floor (``docs/data/main_job_clip_step_no_bf16.json``)."""
    rows = {r["row"]: r for r in json_of(root, "docs/data/main_job_clip_step_no_bf16.json")["rows"]}
    before, after = (
        rows[f"spectra-adamw {m}"]["ratio_by_optimizer_time"] for m in ("eigh/32", "eigh")
    )
    return f"from {before:.2f}× to {after:.2f}× by optimizer time"


def no_bf16_rate(root: Path) -> str:
    """This CPU's float32 rate (``docs/data/main_job_clip_step_no_bf16.json``)."""
    run = json_of(root, "docs/data/main_job_clip_step_no_bf16.json")
    return f"at {run['fp32_gflops']:.0f} GFLOP/s (`fp32_gflops` in the file)"


def avx2_table(root: Path) -> str:
    """The clip methods with the libraries held to AVX2 (``main_job_clip_step_avx2.json``)."""
    return clip_step_table(root, "main_job_clip_step_avx2", ADAMW_LABELS)


def verdict(root: Path, name: str) -> str:
    """The default against the ``1.05×`` target in run ``name``, beside ``eigh`` and ``mixed``
    (by optimizer time; with its runs' mean ± std where it has several)."""
    rows = {r["row"]: r for r in json_of(root, f"docs/data/{name}.json")["rows"]}
    auto, eigh, mixed = (rows[f"spectra-adamw {m}"] for m in ("auto", "eigh", "mixed"))
    ratio = auto["ratio_by_optimizer_time"]
    judged = auto.get("runs_mean", ratio)  # the runs' mean where there are several
    where = "meets" if round(max(ratio, judged), 2) <= STEP_TARGET else "misses"
    spread = ""
    if "runs_mean" in auto:
        each = auto["runs_ratio_by_optimizer_time"]
        spread = (f" (its runs: {judged:.3f} ± {auto['runs_std']:.3f}, each between "
                  f"{min(each):.3f} and {max(each):.3f})")  # fmt: skip
    return (f"{where} the `{STEP_TARGET:.2f}×` target at {ratio:.3f}×{spread}, against "
            f"{eigh['ratio_by_optimizer_time']:.3f}× for `eigh` and "
            f"{mixed['ratio_by_optimizer_time']:.3f}× for `mixed`")  # fmt: skip


def avx2_setting(root: Path) -> str:
    """What the AVX2 stand-in run held the libraries to, and its float32 rate."""
    run = json_of(root, "docs/data/main_job_clip_step_avx2.json")
    limits = " ".join(f"`{k}={v}`" for k, v in run["isa_limits"].items())
    return (
        f"{limits} (torch reports its CPU capability as `{run['cpu_capability']}`); "
        f"float32 products ran at {run['fp32_gflops']:.0f} GFLOP/s"
    )


def epyc_setting(root: Path) -> str:
    """The CPU of the run without bf16 units of its own: its flags and float32 rate."""
    run = json_of(root, f"docs/data/{EPYC}.json")
    flags = ", ".join(f"`{f}`" for f in run["cpu_flags"]) or "none"
    return (f"a {run['threads']}-thread {run['cpu']} whose flags among AVX2, AVX-512, "
            f"AVX-512 BF16 and AMX are {flags} (torch: `{run['cpu_capability']}`, bf16 "
            f"{run['cpu_bf16']}, nothing held back), float32 products at "
            f"{run['fp32_gflops']:.0f} GFLOP/s; medians of {run['steps']} steps, "
            f"{run['runs']} runs")  # fmt: skip


def epyc_rates(root: Path) -> str:
    """That CPU's float32 rate against the stand-in's."""
    real = json_of(root, f"docs/data/{EPYC}.json")["fp32_gflops"]
    stand_in = json_of(root, "docs/data/main_job_clip_step_avx2.json")["fp32_gflops"]
    return f"{real:.0f} GFLOP/s against the stand-in's {stand_in:.0f}"


def signum_no_bf16(root: Path) -> str:
    """Spectra-Signum's clip without bf16 units, ``eigh`` against the default (``chebyshev``)."""
    return clip_step_table(root, "main_job_clip_step_signum_no_bf16", SIGNUM_LABELS)


def signum_verdict(root: Path) -> str:
    """Which clip Spectra-Signum steps faster with on the EPYC run, by optimizer time."""
    rows = {r["row"]: r for r in json_of(root, f"docs/data/{EPYC_SIGNUM}.json")["rows"]}
    eigh, auto = (rows[f"spectra-signum {m}"] for m in ("eigh", "auto"))
    faster = "`eigh`" if eigh["optimizer_ms"] < auto["optimizer_ms"] else "the default"

    def spread(r: dict) -> str:
        return f"{r['runs_mean']:.3f} ± {r['runs_std']:.3f}" if "runs_mean" in r else ""

    return (f"steps faster with {faster}: {eigh['ratio_by_optimizer_time']:.3f}× for `eigh` "
            f"({spread(eigh)} over its runs) against {auto['ratio_by_optimizer_time']:.3f}× "
            f"for the default ({spread(auto)})")  # fmt: skip


CPU_STEP: dict[str, Callable[[Path], str]] = {
    "data:operators-no-bf16-table": no_bf16_table,
    "data:operators-no-bf16-floor": no_bf16_floor,
    "data:operators-no-bf16-rate": no_bf16_rate,
    "data:operators-avx2-table": avx2_table,
    "data:operators-avx2-setting": avx2_setting,
    "data:operators-avx2-verdict": lambda root: verdict(root, "main_job_clip_step_avx2"),
    "data:operators-epyc-table": lambda root: clip_step_table(root, EPYC, ADAMW_LABELS),
    "data:operators-epyc-setting": epyc_setting,
    "data:operators-epyc-rates": epyc_rates,
    "data:operators-epyc-verdict": lambda root: verdict(root, EPYC),
    "data:operators-signum-no-bf16-table": signum_no_bf16,
    "data:operators-signum-epyc-table": lambda root: clip_step_table(
        root, EPYC_SIGNUM, SIGNUM_LABELS
    ),
    "data:operators-signum-epyc-verdict": signum_verdict,
}
