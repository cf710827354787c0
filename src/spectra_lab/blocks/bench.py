"""Blocks rendered from the stored benchmark runs under ``docs/data/``: ``bench optim``,
``bench step``, ``bench ops``, ``bench dist`` and the H100 flop model."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable
from pathlib import Path

from spectra_lab.blocks.common import (
    MIB,
    err_range,
    json_of,
    ops_cells,
    sci,
    span,
    table,
    value_range,
    worst,
)


def bench_optim(name: str) -> Callable[[Path], str]:
    """The table of a stored ``spectra bench optim`` run (without its two header lines)."""

    def make(root: Path) -> str:
        from spectra_lab.bench.optim import format_table

        return "\n".join(format_table(json_of(root, f"docs/data/{name}.json")).splitlines()[3:])

    return make


def bench_step(name: str) -> Callable[[Path], str]:
    """The report of a stored ``spectra bench step`` run, as the command prints it (fenced)."""

    def make(root: Path) -> str:
        from spectra_lab.bench.step import format_report

        return "```\n" + format_report(json_of(root, f"docs/data/{name}.json")).rstrip() + "\n```"

    return make


def ops_table(cells: list, columns: tuple[str, ...] = ("polar", "eigh64")) -> str:
    """A stored ``spectra bench ops`` run, one row per input: ``auto``'s time, its ratios to
    the paper's runs and the three errors, then each of ``columns``' time ÷ paper fp32."""
    from spectra_lab.bench.ops_report import _by_input
    from spectra_lab.bench.tables import markdown_table

    def ratio(x: float, fmt: str) -> str:
        return "–" if math.isnan(x) else f"{x:{fmt}}"

    rows = []
    for (shape, dtype, kind), by in _by_input(cells).items():
        auto, fp32, bf16 = by["auto"], by["paper_fp32"], by.get("paper_bf16")
        rows.append([shape, dtype, kind, f"{auto.sigma_over_c:.3g}", f"{auto.time_ms:.4g}",
                     ratio(auto.vs_paper_fp32, ".2f"), ratio(auto.vs_paper_bf16, ".3f"),
                     f"{auto.rel_err:.1e}", f"{fp32.rel_err:.1e}",
                     "skipped" if bf16 is None else f"{bf16.rel_err:.1e}",
                     *(ratio(by[m].vs_paper_fp32, ".2f") for m in columns)])  # fmt: skip
    head = ["shape", "dtype", "input", "σ_max/c", "`auto` ms", "÷ paper fp32", "÷ paper bf16",
            "`auto` error", "paper fp32 error", "paper bf16 error",
            *(f"`{m}` ÷ paper fp32" for m in columns)]  # fmt: skip
    return markdown_table(head, rows, "lll" + "r" * (len(head) - 3))


def ops(name: str, what: str) -> Callable[[Path], str]:
    """A table of the stored ``spectra bench ops`` run ``name``: ``cells`` (:func:`ops_table`)
    or ``summary`` (per method, as the command prints it)."""

    def make(root: Path) -> str:
        from spectra_lab.bench.ops_report import sizes_table, summary

        cells = ops_cells(root, name)
        return {"cells": ops_table, "summary": summary, "sizes": sizes_table}[what](cells)

    return make


def gpu_model(root: Path) -> str:
    """The stored H100 flop and launch model's table (``spectra bench gpu-model``)."""
    from spectra_lab.estimate.gpu_model import format_report

    return "\n".join(format_report(json_of(root, "docs/data/gpu_model_h100.json")).splitlines()[2:])


#: The layouts of ``spectra bench dist``'s traffic tables, in their columns' order.
DIST_LAYOUTS = ("ddp", "fsdp2-whole", "fsdp2-gram", "tp", "2d")


def dist_timing(root: Path) -> str:
    """``spectra bench dist``'s step times, unsplit and split, and their ratio."""
    timing = json_of(root, "docs/data/bench_dist_cpu.json")["timing"]
    rows = [[str(r["procs"]), str(r["threads"]), f"{r['unsplit']:.3f}", f"{r['split']:.3f}",
             f"{r['ratio']:.2f}"] for r in timing]  # fmt: skip
    head = ["processes", "threads each", "unsplit step (s)", "split step (s)", "split ÷ unsplit"]
    return table(head, rows, "rrrrr")


def dist_volume(root: Path) -> str:
    """The modelled MiB per rank and step of DDP and FSDP2, with and without SPECTRA."""
    volume = json_of(root, "docs/data/bench_dist_cpu.json")["volume"]
    keys = ("ddp_allreduce", "ddp_split", "fsdp2_own", "fsdp2_spectral")
    rows = [[v["preset"], str(v["n"]), *(f"{v[k] / MIB:.0f} MiB" for k in keys)] for v in volume]
    head = ["preset", "N", "DDP gradient all-reduce `2(N−1)/N·P`", "+ the split `(N−1)/N·M`",
            "FSDP2's own `3(N−1)/N·P`", "+ whole matrices `M`"]  # fmt: skip
    return table(head, rows, "lrrrrr")


def dist_traffic(root: Path) -> str:
    """MiB received per rank in one step, counted (modelled), by layout and process count."""
    traffic = json_of(root, "docs/data/bench_dist_traffic.json")["traffic"]
    rows = []
    for n in sorted({r["procs"] for r in traffic}):
        cells = []
        for layout in DIST_LAYOUTS:
            r = next((r for r in traffic if r["procs"] == n and r["layout"] == layout), None)
            got = None if r is None else sum(r["received"]) / len(r["received"])
            cells.append("–" if r is None else f"{got / MIB:.3f} ({r['model'] / MIB:.3f})")
        rows.append([str(n), *cells])
    head = ["processes", "DDP split", "FSDP2, whole matrices", "FSDP2, Gram route", "TP",
            "2-D (2 × N/2)"]  # fmt: skip
    return table(head, rows, "rrrrrr")


def dist_traffic_model(root: Path) -> str:
    """The traffic model's MiB per rank at the paper's sizes, by layout."""
    model = json_of(root, "docs/data/bench_dist_traffic.json")["traffic_model"]
    rows = [[r["preset"], str(r["n"]), *(f"{r[x] / MIB:.0f}" for x in DIST_LAYOUTS)]
            for r in model]  # fmt: skip
    head = ["preset", "N", "DDP split", "FSDP2, whole matrices", "FSDP2, Gram route", "TP", "2-D"]
    return table(head, rows, "lrrrrrr")


def ops_native(root: Path) -> str:
    """``spectra bench ops`` on the CPU with native bf16 units: each method's time ÷ the
    paper's bf16 run and its error (float32 input), one row per synthetic input and one per
    shape of recorded training directions (their range, and the worst error)."""
    cells = ops_cells(root, "bench_ops_cpu_native_bf16")
    methods = ("auto", "eigh", "polar")
    rows = []
    for shape in dict.fromkeys(c.shape for c in cells):
        mine = [c for c in cells if c.shape == shape]
        synthetic = [i for i in dict.fromkeys(c.input for c in mine) if "@" not in i]
        for kind in synthetic:
            by = {c.method: c for c in mine if c.input == kind}
            label = "Adam-like spike" if kind == "adam_spike" else kind
            rows.append([shape.replace("x", "×"), label,
                         *(f"{by[m].vs_paper_bf16:.2f}" for m in methods),
                         *(f"{by[m].rel_err:.1e}" for m in (*methods, "paper_bf16"))])  # fmt: skip
        recorded = [c for c in mine if "@" in c.input]
        if recorded:
            count = len({c.input for c in recorded})
            rows.append([shape.replace("x", "×"), f"recorded ({count})",
                         *(span(recorded, m) for m in methods),
                         *(worst(recorded, m) for m in (*methods, "paper_bf16"))])  # fmt: skip
    head = ["shape", "input", "`auto` (`mixed`) ÷ paper bf16", "`eigh` ÷ paper bf16",
            "`polar` ÷ paper bf16", "`auto` error", "`eigh` error", "`polar` error",
            "paper bf16 error"]  # fmt: skip
    return table(head, rows, "llrrrrrrr")


def ops_native_medians(root: Path) -> str:
    """The medians over the native-bf16 run's cells of each method's time ÷ the paper's bf16
    run."""
    cells = ops_cells(root, "bench_ops_cpu_native_bf16")

    def median(m: str) -> str:
        return f"{statistics.median(c.vs_paper_bf16 for c in cells if c.method == m):.2f}"

    n = len([c for c in cells if c.method == "auto"])
    return (f"Medians over the {n} cells, ÷ the paper's bf16 run: `auto` {median('auto')}, "
            f"`mixed` {median('mixed')} (the same method, timed apart), `eigh` "
            f"{median('eigh')}, `polar` {median('polar')}, the paper's float32 run "
            f"{median('paper_fp32')}.")  # fmt: skip


def errors_text(cells: list, method: str) -> str:
    """The errors of ``method``'s float32-input cells: ``≤ worst`` where all are below 1e-2
    for the paper's float32 run, else their range."""
    errs = [c.rel_err for c in cells if c.method == method and c.dtype == "fp32"]
    lo, hi = min(errs), max(errs)
    if method in ("auto", "paper_fp32") and hi < 1e-2:
        return f"≤ {sci(hi)}"
    return f"{lo:.2f}–{hi:.2f}" if lo > 0.1 else f"{sci(lo)} – {sci(hi)}"


def ops_in_short(root: Path) -> str:
    """``auto`` against the paper's Algorithm 1 on the two bf16 paths, by kind of input: its time ÷
    the paper's bf16 run (range over the cells), its error and the paper's two runs' errors
    (float32 inputs)."""
    recorded = ops_cells(root, "bench_ops_cpu_recorded")
    synthetic = ops_cells(root, "bench_ops_cpu_synthetic")
    native = ops_cells(root, "bench_ops_cpu_native_bf16")

    def pick(cells: list, inputs: tuple[str, ...] | None) -> list:
        return [c for c in cells if ("@" in c.input if inputs is None else c.input in inputs)]

    def row(label: str, cpu: str, cells: list) -> list[str]:
        auto = [c for c in cells if c.method == "auto"]
        return [label, cpu, span(cells, "auto"), errors_text(auto, "auto"),
                errors_text(cells, "paper_fp32"), errors_text(cells, "paper_bf16")]  # fmt: skip

    nat_rec = pick(native, None)
    # how the native run's CPU has bf16, as the file records it: "native (AVX-512 BF16)"
    units = json_of(root, "docs/data/bench_ops_cpu_native_bf16.json")["cpu_bf16"]
    nat = units.replace(" (", ", ").removesuffix(")")
    n_rec = len([c for c in recorded if c.method == "auto"])
    n_nat = len([c for c in nat_rec if c.method == "auto"])
    rows = [
        row("recorded training directions", f"emulated ({n_rec} cells)", recorded),
        # the paper's errors on float32 inputs do not depend on the CPU: the emulated run's
        [*row("", f"{nat} ({n_nat} cells)", nat_rec)[:4],
         errors_text(recorded, "paper_fp32"), errors_text(recorded, "paper_bf16")],
        row("synthetic sign / Gaussian, 768² to 2048²", "emulated",
            pick(synthetic, ("sign", "gauss"))),
        row("synthetic sign, 768² to 2048²", nat, pick(native, ("sign",))),
        row("stress: spike at σ = 10³·c", "emulated", pick(synthetic, ("adam_spike",))),
        row("", nat, pick(native, ("adam_spike",))),
    ]  # fmt: skip
    head = ["inputs", "CPU bf16", "`auto` time ÷ paper bf16", "`auto` error", "paper fp32 error",
            "paper bf16 error (errors: float32 input)"]  # fmt: skip
    return table(head, rows, "llrrrr")


def ops_synthetic(root: Path) -> str:
    """The synthetic inputs at the 124M shapes, paper bf16 included: each method's time ÷ the
    paper's runs (range over the cells) and its error on float32 inputs, for the unspiked
    inputs (σ_max/c of a few) and the spiked one (σ_max/c = 10³)."""
    cells = ops_cells(root, "bench_ops_cpu_synthetic")
    rows = []
    for method in dict.fromkeys(c.method for c in cells):
        for label, inputs in (("sign, gauss", ("sign", "gauss")), ("adam_spike", ("adam_spike",))):
            mine = [c for c in cells if c.method == method and c.input in inputs]
            errs = [c.rel_err for c in mine if c.dtype == "fp32"]
            err = (f"{sci(min(errs))} – {sci(max(errs))}" if max(errs) < 0.1
                   else value_range(errs))  # fmt: skip
            rows.append([method, label, value_range([c.vs_paper_bf16 for c in mine]),
                         value_range([c.vs_paper_fp32 for c in mine]), err])  # fmt: skip
    return table(["method", "input", "× paper bf16", "× paper fp32", "error, fp32 input"], rows,
                  "llrrr")  # fmt: skip


def polar_flops(root: Path) -> str:
    """``spectra bench ops --flops``: the matrix-product flops of ``polar`` against the
    paper's Algorithm 1 and Muon's five steps at the 124M shapes (computed, not measured:
    ``polar``'s step count K is the one it takes on each input)."""
    from spectra_lab.bench.flops import flop_table

    shapes = {"768x768": (768, 768), "768x3072": (768, 3072), "2048x2048": (2048, 2048),
              "8x512x512": (8, 512, 512)}  # fmt: skip
    return flop_table(shapes, ("adam_spike", "sign", "gauss")).rstrip()


def ops_misses(root: Path) -> str:
    """How many recorded cells the paper's bf16 run misses the 1e-2 accuracy bar on."""
    cells = [c for c in ops_cells(root, "bench_ops_cpu_recorded") if c.method == "paper_bf16"]
    return f"{sum(c.rel_err > 1e-2 for c in cells)} of the {len(cells)}"


def step_ratio_native(root: Path) -> str:
    """The main job's step on the CPU with bf16 units (``spectra bench step``): Spectra-AdamW's
    optimizer step against its AdamW twin's, and the ratio it gives the training step."""
    rows = {r["name"]: r for r in json_of(
        root, "docs/data/bench_step_main_job_native_bf16_2threads.json")["rows"]}  # fmt: skip
    a, s = rows["adamw"], rows["spectra-adamw"]
    added = s["optimizer_ms"] - a["optimizer_ms"]
    return (f"optimizer steps of {s['optimizer_ms']:.1f} against {a['optimizer_ms']:.1f} ms (the "
            f"optimizers stepping in turn): the clip adds {added:.1f} ms, which on AdamW's "
            f"{a['total_ms']:.1f} ms training step is **{1 + added / a['total_ms']:.3f}×** (the "
            f"totals, {s['total_ms']:.1f} against {a['total_ms']:.1f} ms, give "
            f"{s['total_ms'] / a['total_ms']:.3f}×)")  # fmt: skip


def step_ratio_main_job(name: str) -> Callable[[Path], str]:
    """The main job's runs, Spectra-AdamW against AdamW alternately (``experiments/
    step_ratio.py``, ``docs/data/NAME.json``): the medians of their optimizer steps and the
    ratios of their steps."""
    return functools.partial(_step_ratio, name=name)


def _step_ratio(root: Path, name: str) -> str:
    pairs = json_of(root, f"docs/data/{name}.json")["pairs"]

    def each(f: Callable[[dict], float], fmt: str) -> str:
        return " and ".join(f"{f(p):{fmt}}" for p in pairs)

    spectra = each(lambda p: p["spectra"]["optimizer_ms"], ".1f")
    return (f"the optimizer steps' medians are {spectra}"
            f" ms against {each(lambda p: p['base']['optimizer_ms'], '.1f')} ms: "
            f"**{each(lambda p: p['by_optimizer_time'], '.3f')}×** by optimizer time. The steps' "
            f"own medians give {each(lambda p: p['by_step'], '.3f')}×")  # fmt: skip


SUPERSCRIPTS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _power(x: float) -> str:
    """``30`` or, from a thousand on, ``10³``."""
    return f"{x:g}" if x < 1000 else "10" + str(round(math.log10(x))).translate(SUPERSCRIPTS)


def mixed_errors(root: Path) -> str:
    """``experiments/mixed_error_sweep.py --spiked``: ``mixed``'s worst error and the paper's
    bf16 run's range on spiked spectra, per σ_max/c."""
    rows = json_of(root, "docs/data/mixed_error_spiked.json")["rows"]
    head = ["σ_max/c", *(_power(r["sigma_over_c"]) for r in rows)]
    mixed = [f"{r['mixed_worst']:.1e}".replace("e-0", "e-") for r in rows]
    paper = [err_range(r["paper_bf16_min"], r["paper_bf16_max"]) for r in rows]
    body = [["`mixed` (worst case)", *mixed], ["paper, bf16 (N_s = 10)", *paper]]
    return table(head, body, "")


OPERATOR_ERRORS = "docs/data/operator_errors_spiked.json"


def _e(x: float) -> str:
    return f"{x:.1e}".replace("e-0", "e-")


def polar_errors(root: Path) -> str:
    """``experiments/operator_errors.py``: ``polar`` on one 768×3072 spiked matrix per kind."""
    rows = json_of(root, OPERATOR_ERRORS)["polar"]
    body = [[f"{r['sigma_over_c']:g}", f"{r['steps']} ({r['dtype'].replace('float', 'fp')})",
             _e(r["polar"]), _e(r["polar_fp32"]), f"{r['paper_fp32']:.2f}"]
            for r in rows]  # fmt: skip
    head = ["σ_max/c", "polar steps (precision)", "polar (auto precision)", "polar forced float32",
            "paper N_s=10 fp32"]  # fmt: skip
    return table(head, body, "")


def eigh_errors(root: Path) -> str:
    """``experiments/operator_errors.py``: the float32 ``eigh`` path alone."""
    rows = json_of(root, OPERATOR_ERRORS)["eigh"]
    head = ["σ_max/c", *(f"{r['sigma_over_c']:g}" for r in rows)]
    body = [["float32 `eigh` error", *(err_range(r["min"], r["max"]) for r in rows)]]
    return table(head, body, "")


def split_errors(root: Path) -> str:
    """``experiments/operator_errors.py``: ``polar`` by default and with split bf16 products (which
    hands over to float32, then float64, as α = 1 + (σ_max/c)² passes 10⁴ and 10⁵), and the
    paper's bf16 run."""
    rows = json_of(root, OPERATOR_ERRORS)["split"]

    def split(r: dict) -> str:
        alpha = 1 + r["sigma_over_c"] ** 2
        if alpha <= 1e4:
            return err_range(*r["polar_split_bf16"])
        return "(float32)" if alpha <= 1e5 else "(float64)"

    head = ["σ_max/c", *(f"{r['sigma_over_c']:g}" for r in rows)]
    body = [["`polar`, float32", *(err_range(*r["polar"]) for r in rows)],
            ["`polar`, split bf16", *(split(r) for r in rows)],
            ["paper, bf16 (N_s = 10)", *(err_range(*r["paper_bf16"]) for r in rows)]]  # fmt: skip
    return table(head, body, "")


def _outward(lo: float, hi: float, decimals: int) -> str:
    """``[lo, hi]`` rounded outward, so that the printed band holds the computed one."""
    k = 10**decimals
    return f"[{math.floor(lo * k) / k:.{decimals}f}, {math.ceil(hi * k) / k:.{decimals}f}]"


def _composed_band(coeffs: list[tuple[float, float, float]], lo: float) -> tuple[float, float]:
    """The range of ``p_K∘…∘p_1(s)`` over ``s ∈ [lo, 1]`` (a fine geometric grid)."""
    import numpy as np

    s = np.geomspace(lo, 1.0, 20001)
    for a, b, c in coeffs:
        s = a * s + b * s**3 + c * s**5
    return float(s.min()), float(s.max())


def orth_bands(root: Path) -> str:
    """The singular-value bands of ``orthogonalize``'s iterations: the composition of their
    quintics on ``s = σ/‖X‖_F`` (exact arithmetic), computed from the coefficients."""
    from spectra.ops.muon import MUON_NS_COEFFS
    from spectra.ops.quintics import ORTH_COEFFS

    muon = [MUON_NS_COEFFS] * 5
    coeffs = ", ".join(f"{x:.4f}".replace("-", "−") for x in MUON_NS_COEFFS)
    rows = [[f"`muon` ({coeffs})", "5", _outward(*_composed_band(muon, 1e-3), 2),
             _outward(*_composed_band(muon, 1e-2), 2)]]  # fmt: skip
    for steps, decimals in ((5, 3), (6, 4)):
        band = [_outward(*_composed_band(list(ORTH_COEFFS[:steps]), lo), decimals)
                for lo in (1e-3, 1e-2)]  # fmt: skip
        rows.append(["`polar_express`", str(steps), *band])
    rows.append(["`svd`", "—", "exactly 1 (0 for σ ≤ σ_max·max(m,n)·ε₆₄)", ""])
    return table(["method", "steps", "band for `s ≥ 10⁻³`", "band for `s ≥ 10⁻²`"], rows, "")


def state_memory(root: Path) -> str:
    """``spectra bench memory``'s stored rows: each optimizer's state, measured and by the
    paper's formula."""
    from spectra_lab.bench.memory import format_table

    return format_table(json_of(root, "docs/data/bench_memory_cpu_small.json")["rows"])


def native_step(root: Path) -> str:
    """The 124M optimizer step on the CPU with bf16 units: the default (``mixed``), the wrapper
    around torch's AdamW and the exact ``eigh`` against the paper's bf16 wrapper, and their peak
    memory against torch's AdamW."""
    rows = {r["method"]: r for r in json_of(
        root, "docs/data/bench_optim_cpu_native_bf16_2threads.json")["rows"]}  # fmt: skip
    paper = rows["paper-wrap-bf16"]

    def time(m: str) -> str:
        return f"{rows[m]['step_s'] / paper['step_s']:.2f}×"

    def peak(m: str) -> str:
        return f"{rows[m]['peak_bytes'] / rows['torch-adamw']['peak_bytes']:.2f}×"

    return (f"the default step is at {time('spectra-adamw')} the paper's bf16 wrapper (the "
            f"wrapper around torch's AdamW, which clips an eighth of the parameters at a time, "
            f"{time('spectra-wrap')}; the exact `eigh` {time('spectra-adamw-eigh')}), and its "
            f"peak memory is {peak('spectra-adamw')} torch's AdamW's, against "
            f"{peak('spectra-adamw-eigh')} for `eigh` and {peak('paper-wrap-bf16')} for the "
            f"paper's wrapper")  # fmt: skip
