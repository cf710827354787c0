"""What renders each generated block of README.md and docs/ (outside the study's): one function
per block, reading the files under the source tree's root (``docs/data/``, ``results/``) and
writing the block's Markdown. :data:`BLOCKS` maps each block's key to its function;
:mod:`spectra_lab.pages` finds the blocks in the pages, writes and checks them.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path


def _json(root: Path, path: str) -> dict:
    file = root / path
    if not file.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return json.loads(file.read_text())


def _main_job(root: Path, sweep: str = "main-job") -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in _json(root, f"results/{sweep}/results.json")["runs"]:
        out.setdefault(r["point"].get("optimizer", "spectra-adamw"), {})[r["seed"]] = r["val_loss"]
    return out


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float]:
    """Mean, sample std and t of ``b − a`` over the seeds both hold."""
    d = [b[s] - a[s] for s in sorted(a) if s in b]
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    return mean, sd, mean / (sd / math.sqrt(len(d)))


def main_job_table(root: Path) -> str:
    """The main job's table: seed 1337's loss and perplexity, mean ± std over the seeds."""
    runs = _main_job(root)
    rows = {
        "adamw": "| `adamw` (`clip_c=None`) |",
        "spectra-adamw": "| `spectra-adamw` (`clip_c=10`, standard schedule) |",
    }
    best = min(runs, key=lambda k: statistics.fmean(runs[k].values()))
    lines = ["| optimizer | val loss, seed 1337 | val perplexity, seed 1337 | val loss, mean ± std "
             f"over seeds {min(runs['adamw'])}–{max(runs['adamw'])} |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for name, vals in runs.items():
        s0 = vals[1337]
        cells = [
            f"{s0:.4f}",
            f"{math.exp(s0):.2f}",
            f"{statistics.fmean(vals.values()):.3f} ± {statistics.stdev(vals.values()):.3f}",
        ]
        if name == best:
            cells = [f"**{c}**" for c in cells]
        lines.append(f"{rows[name]} {' | '.join(cells)} |")
    return "\n".join(lines)


def main_job_paired(root: Path) -> str:
    """Δ = AdamW − Spectra-AdamW over the main job's seeds, with its t and verdict."""
    runs = _main_job(root)
    mean, sd, t = _paired(runs["spectra-adamw"], runs["adamw"])
    sig = "significant" if abs(t) > 4.303 else "not significant"  # Student's t, 2 dof
    return f"Δ = AdamW − Spectra-AdamW = {mean:.3f} ± {sd:.3f} (t = {t:.1f}, {sig}"


def main_job_mixed(root: Path) -> str:
    """The main job's Spectra-AdamW with ``mixed``, and its pairing against ``eigh``."""
    exact = _main_job(root)["spectra-adamw"]
    mixed = next(iter(_main_job(root, "main-job-mixed").values()))
    mean, sd, t = _paired(exact, mixed)
    ms = f"{statistics.fmean(mixed.values()):.4f} ± {statistics.stdev(mixed.values()):.4f}"
    sig = "significant" if abs(t) > 4.303 else "not significant"
    return f"end at {ms}, paired against `eigh` {mean:+.4f} ± {sd:.4f} (t = {t:.1f}, {sig})"


def _gpu_runs(root: Path) -> str:
    from spectra_lab.gpucheck.runs import runs_table

    return runs_table(root / "docs" / "data" / "gpu")


def _machines(root: Path) -> str:
    from spectra_lab.bench.machines import machines_table

    return machines_table(root / "docs" / "data")


def _bench_optim(name: str) -> Callable[[Path], str]:
    """The table of a stored ``spectra bench optim`` run (without its two header lines)."""

    def make(root: Path) -> str:
        from spectra_lab.bench.optim import format_table

        return "\n".join(format_table(_json(root, f"docs/data/{name}.json")).splitlines()[3:])

    return make


def _bench_step(name: str) -> Callable[[Path], str]:
    """The report of a stored ``spectra bench step`` run, as the command prints it (fenced)."""

    def make(root: Path) -> str:
        from spectra_lab.bench.step import format_report

        return "```\n" + format_report(_json(root, f"docs/data/{name}.json")).rstrip() + "\n```"

    return make


def _ops_cells(root: Path, name: str) -> list:
    from spectra_lab.bench.ops_report import Cell

    return [Cell(**c) for c in _json(root, f"docs/data/{name}.json")["cells"]]


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


def _ops(name: str, what: str) -> Callable[[Path], str]:
    """A table of the stored ``spectra bench ops`` run ``name``: ``cells`` (:func:`ops_table`)
    or ``summary`` (per method, as the command prints it)."""

    def make(root: Path) -> str:
        from spectra_lab.bench.ops_report import sizes_table, summary

        cells = _ops_cells(root, name)
        return {"cells": ops_table, "summary": summary, "sizes": sizes_table}[what](cells)

    return make


def _gpu_model(root: Path) -> str:
    """The stored H100 flop and launch model's table (``spectra bench gpu-model``)."""
    from spectra_lab.estimate.gpu_model import format_report

    return "\n".join(format_report(_json(root, "docs/data/gpu_model_h100.json")).splitlines()[2:])


def _gpu_summary(root: Path) -> str:
    """The summary of the latest stored GPU check (``make gpu-check``)."""
    from spectra_lab.gpucheck.check import markdown_summary

    return markdown_summary(root / "docs" / "data" / "gpu").rstrip()


MIB = 1 << 20
#: The layouts of ``spectra bench dist``'s traffic tables, in their columns' order.
DIST_LAYOUTS = ("ddp", "fsdp2-whole", "fsdp2-gram", "tp", "2d")


def _table(header: list[str], rows: list[list[str]], align: str) -> str:
    from spectra_lab.bench.tables import markdown_table

    return markdown_table(header, rows, align).rstrip()


def dist_timing(root: Path) -> str:
    """``spectra bench dist``'s step times, unsplit and split, and their ratio."""
    timing = _json(root, "docs/data/bench_dist_cpu.json")["timing"]
    rows = [[str(r["procs"]), str(r["threads"]), f"{r['unsplit']:.3f}", f"{r['split']:.3f}",
             f"{r['ratio']:.2f}"] for r in timing]  # fmt: skip
    head = ["processes", "threads each", "unsplit step (s)", "split step (s)", "split ÷ unsplit"]
    return _table(head, rows, "rrrrr")


def dist_volume(root: Path) -> str:
    """The modelled MiB per rank and step of DDP and FSDP2, with and without SPECTRA."""
    volume = _json(root, "docs/data/bench_dist_cpu.json")["volume"]
    keys = ("ddp_allreduce", "ddp_split", "fsdp2_own", "fsdp2_spectral")
    rows = [[v["preset"], str(v["n"]), *(f"{v[k] / MIB:.0f} MiB" for k in keys)] for v in volume]
    head = ["preset", "N", "DDP gradient all-reduce `2(N−1)/N·P`", "+ the split `(N−1)/N·M`",
            "FSDP2's own `3(N−1)/N·P`", "+ whole matrices `M`"]  # fmt: skip
    return _table(head, rows, "lrrrrr")


def dist_traffic(root: Path) -> str:
    """MiB received per rank in one step, counted (modelled), by layout and process count."""
    traffic = _json(root, "docs/data/bench_dist_traffic.json")["traffic"]
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
    return _table(head, rows, "rrrrrr")


def dist_traffic_model(root: Path) -> str:
    """The traffic model's MiB per rank at the paper's sizes, by layout."""
    model = _json(root, "docs/data/bench_dist_traffic.json")["traffic_model"]
    rows = [[r["preset"], str(r["n"]), *(f"{r[x] / MIB:.0f}" for x in DIST_LAYOUTS)]
            for r in model]  # fmt: skip
    head = ["preset", "N", "DDP split", "FSDP2, whole matrices", "FSDP2, Gram route", "TP", "2-D"]
    return _table(head, rows, "lrrrrrr")


def diagnostics_gradients(root: Path) -> str:
    """σ_max / median σ of the gradient of each recorded layer of the main job's AdamW run, at
    each recorded step (``spectra analyze spectra``)."""
    layers = _json(root, "results/diagnostics/adamw/spectra.json")["layers"]
    steps = [r["step"] for r in next(iter(layers.values()))["records"]]
    rows = [[f"`{layer.removesuffix('.weight')}`",
             *(f"{r['grad']['max_over_median']:.0f}" for r in x["records"])]
            for layer, x in layers.items()]  # fmt: skip
    return _table(["layer", *(f"step {s}" for s in steps)], rows, "l" + "r" * len(steps))


def evaluation(root: Path) -> str:
    """The main job's downstream scores (``spectra eval``): seed 1337's, and mean ± std over
    its seeds, of AdamW and Spectra-AdamW."""
    import csv

    scores: dict[tuple[str, str], dict[int, float]] = {}
    folder = root / "results" / "main-job" / "downstream"
    files = sorted(folder.glob("*.csv"))
    if not files:
        raise FileNotFoundError("results/main-job/downstream/*.csv are missing")
    for f in files:
        opt, seed = f.stem.split(",")
        with open(f) as fh:
            for r in csv.DictReader(fh):
                key = (opt.removeprefix("optimizer="), r["metric"])
                scores.setdefault(key, {})[int(seed.removeprefix("seed="))] = float(r["value"])
    rows = []
    for metric, fmt in (("acc", ".4f"), ("perplexity", ".0f")):
        cells = [f"{scores[(o, metric)][1337]:{fmt}}" for o in ("adamw", "spectra-adamw")]
        for o in ("adamw", "spectra-adamw"):
            vals = list(scores[(o, metric)].values())
            cells.append(f"{statistics.fmean(vals):{fmt}} ± {statistics.stdev(vals):{fmt}}")
        rows.append(["shakespeare_lambada", metric, "0", *cells])
    head = ["task", "metric", "shots", "AdamW, seed 1337", "SPECTRA-AdamW, seed 1337",
            "AdamW, 3 seeds", "SPECTRA-AdamW, 3 seeds"]  # fmt: skip
    return _table(head, rows, "llrrrrr")


def _short(x: float) -> str:
    """A step size or a small loss as the synthetic pages write it: ``3.16``, ``0.1``,
    ``1e-4``, ``3.2e-5``."""
    return f"{x:.3g}" if 0.01 <= x < 1000 else _lr(x)


def _lr(x: float) -> str:
    """A learning rate as ``4e-3`` or ``3.2e-2``."""
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exp)}"


def _loss(x: float) -> str:
    return f"{x:.3f}" if x >= 0.1 else f"{x:.1e}".replace("e-0", "e-")


def _residual(x: float) -> str:
    return f"{x:.2f}" if x >= 0.1 else f"{x:.1e}".replace("e-0", "e-")


SPIKE_METHODS = {"sgd": "SGD", "sgd_global_clip": "SGD + global clip",
                 "sgd_spectral_clip": "SGD + spectral clip", "sgdm": "SGD-M",
                 "sgdm_pre_clip": "SGD-M + pre-clip"}  # fmt: skip


def synth_spikes(root: Path) -> str:
    """``spectra synth spikes``, seed 0: each method's chosen η₀ → final training loss, and
    the largest η₀ that did not diverge in brackets, by spike size ℓ."""
    chosen = _json(root, "results/synth/spikes_summary.json")["chosen"]
    scales = sorted({c["scale"] for c in chosen})
    rows = []
    for method, label in SPIKE_METHODS.items():
        cells = []
        for scale in scales:
            c = next(c for c in chosen if c["method"] == method and c["scale"] == scale)
            edge = " (grid edge)" if c["best_at_grid_edge"] else ""
            cells.append(f"{_short(c['best_eta0'])} → {_loss(c['best_final_loss'])} "
                         f"[{_short(max(c['converging_eta0']))}]{edge}")  # fmt: skip
        rows.append([label, *cells])
    return _table(["method", *(f"ℓ = {s:g}" for s in scales)], rows, "llll")


def synth_fw(root: Path) -> str:
    """``spectra synth fw``, seed 0: the optimum of each (D₂, b) and the full-batch
    Frank–Wolfe run towards it (residuals, the theorem's bound, the iterates' norms)."""
    fw = _json(root, "results/synth/fw_summary.json")
    rows = []
    for o in fw["optimum"]:
        point = (o["radius"], o["b"])
        r = next(r for r in fw["runs"] if r["mode"] == "full" and (r["radius"], r["b"]) == point)
        final = "≤ 1e-15" if r["residual_final"] < 1e-15 else f"{r['residual_final']:.1e}"
        value = f"{o['value']:.4f}" if o["value"] > 1e-3 else f"{o['value']:.1e}"
        fro = f"{o['frobenius_norm']:.{3 if o['frobenius_norm'] < 10 else 2}f}"
        rows.append([f"{o['radius']:g}", f"{o['b']:g}", value.replace("e-0", "e-"),
                     f"{o['spectral_norm']:.3f}", fro,
                     _residual(r["residual_first"]), final.replace("e-0", "e-"),
                     _residual(r["theorem_bound_final"]), f"{r['max_spectral_norm']:#.3g}",
                     f"{r['final_test_loss']:#.3g}"])  # fmt: skip
    head = ["D₂", "b", "F\\*", "‖X\\*‖₂", "‖X\\*‖_F", "residual k=1", "residual k=2000",
            "2L_F D_F²/(K+1)", "max_k ‖X_k‖₂", "test loss at k=2000"]  # fmt: skip
    return _table(head, rows, "")


#: The rows of the μP lr-transfer table: label → (optimizer, parametrization, lr/m).
LR_TRANSFER_ROWS = {
    "AdamW, standard": ("adamw", "standard", True),
    "AdamW, μP": ("adamw", "mup", True),
    "Spectra-AdamW, standard": ("spectra-adamw", "standard", True),
    "Spectra-AdamW, μP (lr/m)": ("spectra-adamw", "mup", True),
    "Spectra-AdamW, μP multipliers, one lr": ("spectra-adamw", "mup", False),
}


def lr_transfer(root: Path) -> str:
    """``experiments/mup/lr-transfer.yaml``: each method's best lr per width (mean ± std of the
    final loss over the seeds there), whether it sits at the edge of the grid, and how it moves
    with the width."""
    results = _json(root, "results/mup/lr-transfer/results.json")

    def key(point: dict) -> tuple:
        return point["optimizer"], point["parametrization"], point.get("mup_lr_scaling", True)

    best = {(key(b["point"]), b["point"]["d_model"]): b for b in results["best"]}
    widths = sorted({w for _, w in best})
    rows = []
    for label, method in LR_TRANSFER_ROWS.items():
        cells, lrs = [], []
        for w in widths:
            b = best[method, w]
            grid = [r["point"]["lr"] for r in results["runs"]
                    if key(r["point"]) == method and r["point"]["d_model"] == w]  # fmt: skip
            edge = "; grid edge" if b["lr"] in (min(grid), max(grid)) else ""
            cells.append(f"{_lr(b['lr'])} ({b['mean']:.3f} ± {b['std']:.3f}{edge})")
            lrs.append(b["lr"])
        steps = [b / a for a, b in itertools.pairwise(lrs)]
        moves = ("**stays**" if all(s == 1 for s in steps) else
                 "halves per doubling" if all(s == 0.5 for s in steps) else
                 "grows" if all(s >= 1 for s in steps) else "moves")  # fmt: skip
        rows.append([label, *cells, moves])
    return _table(["method", *(f"width {w}" for w in widths), "best lr moves?"], rows, "")


def _span(cells: list, method: str) -> str:
    vals = [c.vs_paper_bf16 for c in cells if c.method == method]
    return f"{min(vals):.2f}–{max(vals):.2f}"


def _worst(cells: list, method: str) -> str:
    return f"≤ {max(c.rel_err for c in cells if c.method == method):.1e}"


def ops_native(root: Path) -> str:
    """``spectra bench ops`` on the CPU with native bf16 units: each method's time ÷ the
    paper's bf16 run and its error (float32 input), one row per synthetic input and one per
    shape of recorded training directions (their range, and the worst error)."""
    cells = _ops_cells(root, "bench_ops_cpu_native_bf16")
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
                         *(_span(recorded, m) for m in methods),
                         *(_worst(recorded, m) for m in (*methods, "paper_bf16"))])  # fmt: skip
    head = ["shape", "input", "`auto` (`mixed`) ÷ paper bf16", "`eigh` ÷ paper bf16",
            "`polar` ÷ paper bf16", "`auto` error", "`eigh` error", "`polar` error",
            "paper bf16 error"]  # fmt: skip
    return _table(head, rows, "llrrrrrrr")


def ops_native_medians(root: Path) -> str:
    """The medians over the native-bf16 run's cells of each method's time ÷ the paper's bf16
    run."""
    cells = _ops_cells(root, "bench_ops_cpu_native_bf16")

    def median(m: str) -> str:
        return f"{statistics.median(c.vs_paper_bf16 for c in cells if c.method == m):.2f}"

    n = len([c for c in cells if c.method == "auto"])
    return (f"Medians over the {n} cells, ÷ the paper's bf16 run: `auto` {median('auto')}, "
            f"`mixed` {median('mixed')} (the same method, timed apart), `eigh` "
            f"{median('eigh')}, `polar` {median('polar')}, the paper's float32 run "
            f"{median('paper_fp32')}.")  # fmt: skip


def _sci(x: float) -> str:
    """``4.9e-6``: one decimal, the exponent without a leading zero."""
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exp)}"


def _errors(cells: list, method: str) -> str:
    """The errors of ``method``'s float32-input cells: ``≤ worst`` where all are below 1e-2
    for the paper's float32 run, else their range."""
    errs = [c.rel_err for c in cells if c.method == method and c.dtype == "fp32"]
    lo, hi = min(errs), max(errs)
    if method in ("auto", "paper_fp32") and hi < 1e-2:
        return f"≤ {_sci(hi)}"
    return f"{lo:.2f}–{hi:.2f}" if lo > 0.1 else f"{_sci(lo)} – {_sci(hi)}"


def ops_in_short(root: Path) -> str:
    """``auto`` against the paper's Algorithm 1 on the two CPUs, by kind of input: its time ÷
    the paper's bf16 run (range over the cells), its error and the paper's two runs' errors
    (float32 inputs)."""
    recorded = _ops_cells(root, "bench_ops_cpu_recorded")
    synthetic = _ops_cells(root, "bench_ops_cpu_synthetic")
    native = _ops_cells(root, "bench_ops_cpu_native_bf16")

    def pick(cells: list, inputs: tuple[str, ...] | None) -> list:
        return [c for c in cells if ("@" in c.input if inputs is None else c.input in inputs)]

    def row(label: str, cpu: str, cells: list) -> list[str]:
        auto = [c for c in cells if c.method == "auto"]
        return [label, cpu, _span(cells, "auto"), _errors(auto, "auto"),
                _errors(cells, "paper_fp32"), _errors(cells, "paper_bf16")]  # fmt: skip

    nat_rec = pick(native, None)
    n_rec = len([c for c in recorded if c.method == "auto"])
    n_nat = len([c for c in nat_rec if c.method == "auto"])
    rows = [
        row("recorded training directions", f"emulated ({n_rec} cells)", recorded),
        # the paper's errors on float32 inputs do not depend on the CPU: the emulated run's
        [*row("", f"native, AMX ({n_nat} cells)", nat_rec)[:4],
         _errors(recorded, "paper_fp32"), _errors(recorded, "paper_bf16")],
        row("synthetic sign / Gaussian, 768² to 2048²", "emulated",
            pick(synthetic, ("sign", "gauss"))),
        row("synthetic sign, 768² to 2048²", "native, AMX", pick(native, ("sign",))),
        row("stress: spike at σ = 10³·c", "emulated", pick(synthetic, ("adam_spike",))),
        row("", "native, AMX", pick(native, ("adam_spike",))),
    ]  # fmt: skip
    head = ["inputs", "CPU bf16", "`auto` time ÷ paper bf16", "`auto` error", "paper fp32 error",
            "paper bf16 error (errors: float32 input)"]  # fmt: skip
    return _table(head, rows, "llrrrr")


def _range(vals: list[float], fmt: str = ".2f") -> str:
    lo, hi = min(vals), max(vals)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def ops_synthetic(root: Path) -> str:
    """The synthetic inputs at the 124M shapes, paper bf16 included: each method's time ÷ the
    paper's runs (range over the cells) and its error on float32 inputs, for the unspiked
    inputs (σ_max/c of a few) and the spiked one (σ_max/c = 10³)."""
    cells = _ops_cells(root, "bench_ops_cpu_synthetic")
    rows = []
    for method in dict.fromkeys(c.method for c in cells):
        for label, inputs in (("sign, gauss", ("sign", "gauss")), ("adam_spike", ("adam_spike",))):
            mine = [c for c in cells if c.method == method and c.input in inputs]
            errs = [c.rel_err for c in mine if c.dtype == "fp32"]
            err = (f"{_sci(min(errs))} – {_sci(max(errs))}" if max(errs) < 0.1
                   else _range(errs))  # fmt: skip
            rows.append([method, label, _range([c.vs_paper_bf16 for c in mine]),
                         _range([c.vs_paper_fp32 for c in mine]), err])  # fmt: skip
    return _table(["method", "input", "× paper bf16", "× paper fp32", "error, fp32 input"], rows,
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
    cells = [c for c in _ops_cells(root, "bench_ops_cpu_recorded") if c.method == "paper_bf16"]
    return f"{sum(c.rel_err > 1e-2 for c in cells)} of the {len(cells)}"


def _latest_gpu(root: Path, gpu: str) -> Path:
    """The folder of the latest stored GPU run of ``gpu`` (``"H100"``, ``"H200"``)."""
    runs = [r for r in _json(root, "docs/data/gpu/runs.json")["runs"] if gpu in r["gpu"]]
    if not runs:
        raise FileNotFoundError(f"no stored {gpu} run in docs/data/gpu/runs.json")
    return root / "docs" / "data" / "gpu" / max(runs, key=lambda r: r["date"])["folder"]


def gpu_ops(root: Path) -> str:
    """``auto`` against the paper's bf16 run on the latest H200 and H100 runs of ``make
    gpu-check`` (median over the cells, plain and with TF32) and its worst float32 error."""
    from spectra_lab.gpucheck.check import ops_figures

    h200, h100 = _latest_gpu(root, "H200"), _latest_gpu(root, "H100")
    a, a32 = (ops_figures(h200 / f"{p}.json")["auto"] for p in ("bench_ops", "bench_ops_tf32"))
    b, b32 = (ops_figures(h100 / f"{p}.json")["auto"] for p in ("bench_ops", "bench_ops_tf32"))
    n = len(json.loads((h200 / "bench_ops.json").read_text())["cells"]) // len(
        {c["method"] for c in json.loads((h200 / "bench_ops.json").read_text())["cells"]}
    )
    return (f"`auto` takes {a[0]:.2f}× the paper's bf16 run on the H200 (median of {n} cells; "
            f"{a32[0]:.2f}× with TF32) at ≤ {_sci(a[1])} error on float32 inputs, and "
            f"{b[0]:.2f}× ({b32[0]:.2f}×) on the H100")  # fmt: skip


def step_ratio_native(root: Path) -> str:
    """The main job's step on the CPU with bf16 units (``spectra bench step``): Spectra-AdamW's
    optimizer step against its AdamW twin's, and the ratio it gives the training step."""
    rows = {r["name"]: r for r in _json(
        root, "docs/data/bench_step_main_job_native_bf16_2threads.json")["rows"]}  # fmt: skip
    a, s = rows["adamw"], rows["spectra-adamw"]
    added = s["optimizer_ms"] - a["optimizer_ms"]
    return (f"optimizer steps of {s['optimizer_ms']:.1f} against {a['optimizer_ms']:.1f} ms (the "
            f"optimizers stepping in turn): the clip adds {added:.1f} ms, which on AdamW's "
            f"{a['total_ms']:.1f} ms training step is **{1 + added / a['total_ms']:.3f}×** (the "
            f"totals, {s['total_ms']:.1f} against {a['total_ms']:.1f} ms, give "
            f"{s['total_ms'] / a['total_ms']:.3f}×)")  # fmt: skip


def step_ratio_main_job(root: Path) -> str:
    """The main job's runs, Spectra-AdamW against AdamW alternately (``experiments/
    step_ratio.py``): the medians of their optimizer steps and the ratios of their steps."""
    pairs = _json(root, "docs/data/main_job_step_ratio.json")["pairs"]

    def each(f: Callable[[dict], float], fmt: str) -> str:
        return " and ".join(f"{f(p):{fmt}}" for p in pairs)

    spectra = each(lambda p: p["spectra"]["optimizer_ms"], ".1f")
    return (f"the optimizer steps' medians are {spectra}"
            f" ms against {each(lambda p: p['base']['optimizer_ms'], '.1f')} ms: "
            f"**{each(lambda p: p['by_optimizer_time'], '.3f')}×** by optimizer time. The steps' "
            f"own medians give {each(lambda p: p['by_step'], '.3f')}×")  # fmt: skip


def gpu_peaks(root: Path) -> str:
    """The dense peak TFLOP/s the trainer's MFU divides by, per GPU and precision
    (``spectra_lab.train.throughput.GPUS``, from NVIDIA's datasheets)."""
    from spectra_lab.train.throughput import GPUS

    sources = {"h100": "NVIDIA H100 Tensor Core GPU datasheet",
               "h200": "NVIDIA H200 Tensor Core GPU datasheet",
               "a100": "NVIDIA A100 Tensor Core GPU datasheet"}  # fmt: skip
    rows = []
    for key, g in GPUS.items():
        name = "A100, SXM or PCIe" if key == "a100" else g.name
        rows.append([f"{name} (`{key}`)", f"{g.bf16:g}", f"{g.tf32:g}", f"{g.fp32:g}",
                     sources.get(key, "same")])  # fmt: skip
    return _table(["GPU", "bf16", "TF32", "FP32", "source"], rows, "lrrrl")


def gpu_peers(root: Path) -> str:
    """The optimizer step beside the peers a GPU user would pick, from the stand-alone run
    stored with the GPU check (``docs/data/gpu/peer_step.json``): median ms per size."""
    stored = _json(root, "docs/data/gpu/peer_step.json")
    sizes = list(dict.fromkeys(r["size"] for r in stored["results"]))
    rows = []
    for name in dict.fromkeys(r["row"] for r in stored["results"]):
        by = {r["size"]: r["step_ms"] for r in stored["results"] if r["row"] == name}
        rows.append([f"`{name}`", *(f"{by[s]:.1f}" if s in by else "–" for s in sizes)])
    head = [f"step (ms, {stored['device']}, medians of 10)", *(s.upper() for s in sizes)]
    return _table(head, rows, "l" + "r" * len(sizes))


def gpu_tests(root: Path) -> str:
    """The CUDA tests of the latest GPU check: how many passed of how many."""
    tests = _json(root, "docs/data/gpu/tests.json")
    return f"{tests['passed']} of {tests['tests']}"


def gpu_train(root: Path) -> str:
    """124M training in the latest GPU check: torch AdamW's eager step, and Spectra-AdamW's
    tokens/s against it, eager and compiled."""
    train = _json(root, "docs/data/gpu/train.json")
    runs = {(r["optimizer"], r["compile"]): r for r in train["runs"]}
    tokens = train["batch_size"] * 512
    eager_ms = 1e3 * tokens / runs["torch-adamw", False]["tokens_per_s"]
    ratio = {c: runs["spectra-adamw", c]["tokens_per_s_vs_torch_adamw"] for c in (False, True)}
    return (f"At {tokens:,} tokens per step a 124M step takes about {eager_ms:.0f} ms under torch "
            f"AdamW (eager); Spectra-AdamW runs at {ratio[False]:.2f}× torch AdamW's tokens/s "
            f"eager and {ratio[True]:.2f}× compiled")  # fmt: skip


def gpu_h100(root: Path) -> str:
    """The latest stored H100 run: the 124M optimizer step against the paper's bf16 wrapper
    (plain and with TF32), ``mixed``'s, and 124M training against torch AdamW."""
    folder = _latest_gpu(root, "H100")
    parts = json.loads((folder / "gpu_check.json").read_text())["parts"]
    plain, tf32 = (parts[p]["vs_paper_bf16"] for p in ("bench_optim", "bench_optim_tf32"))
    runs = json.loads((folder / "train.json").read_text())["runs"]
    ratio = {r["compile"]: r["tokens_per_s_vs_torch_adamw"] for r in runs
             if r["optimizer"] == "spectra-adamw"}  # fmt: skip
    return (f"the 124M step at {plain['spectra-adamw']:.2f}× the paper's bf16 wrapper "
            f"({tf32['spectra-adamw']:.2f}× with TF32), the earlier `mixed` at "
            f"{plain['spectra-adamw-mixed']:.2f}× ({tf32['spectra-adamw-mixed']:.2f}×); 124M "
            f"training at {ratio[False]:.2f}× torch AdamW's tokens/s eager, {ratio[True]:.2f}× "
            "compiled")  # fmt: skip


def gpu_after_ops_modules(root: Path) -> str:
    """The 124M step on the H200 after the operators' restructure (``bench optim``)."""
    from spectra_lab.bench.optim import format_table

    stored = _json(root, "docs/data/gpu/bench_optim_after_ops_modules.json")
    return "\n".join(format_table(stored).splitlines()[3:])


def synth_seeds(root: Path) -> str:
    """``spectra synth fw`` over seeds 0-4: the full-batch iterate's test loss at k = 2000 for
    b = 0 / 0.1 / 1, by radius D₂."""
    rows = []
    for seed in range(5):
        name = "fw_summary.json" if seed == 0 else f"seed-{seed}/fw_summary.json"
        runs = _json(root, f"results/synth/{name}")["runs"]
        full = {(r["radius"], r["b"]): r["final_test_loss"] for r in runs if r["mode"] == "full"}

        def fmt(x: float) -> str:
            return f"{x:.2f}" if x >= 1 else f"{x:.3f}"

        rows.append([str(seed), *(" / ".join(fmt(full[d2, b]) for b in (0.0, 0.1, 1.0))
                                  for d2 in (1.0, 5.0, 0.2))])  # fmt: skip
    return _table(["seed", "D₂ = 1", "D₂ = 5", "D₂ = 0.2"], rows, "")


def weight_norms(root: Path) -> str:
    """``spectra analyze norms``: the summed ℓ∞ and Frobenius norms of the weight matrices at
    the last monitor record, AdamW against Spectra-AdamW (relative change in brackets)."""
    adamw, spectra = _json(root, "results/diagnostics/norms/norms.json")["runs"]
    linf = (adamw["sum_weight_linf"][-1], spectra["sum_weight_linf"][-1])
    fro = (adamw["sum_weight_fro"][-1], spectra["sum_weight_fro"][-1])
    rel = [f"{linf[1] / linf[0] - 1:+.0%}", f"{fro[1] / fro[0] - 1:+.1%}"]
    rel = [r.replace("-", "−") for r in rel]
    rows = [["AdamW", f"{linf[0]:.3f}", f"{fro[0]:.1f}"],
            ["Spectra-AdamW", f"{linf[1]:.3f} ({rel[0]})", f"{fro[1]:.1f} ({rel[1]})"]]  # fmt: skip
    return _table(["", "Σ ‖X‖_∞", "Σ ‖X‖_F"], rows, "lrr")


def monitor_cost(root: Path) -> str:
    """What the spectral monitor costs in the diagnostics runs (``t_monitor`` and ``t_step`` of
    their ``train.csv``)."""
    import csv

    def rows(name: str) -> list[dict[str, float]]:
        path = root / "results" / "diagnostics" / name / "train.csv"
        if not path.is_file():
            raise FileNotFoundError(f"results/diagnostics/{name}/train.csv is missing")
        with open(path) as f:
            return [{k: float(v or 0) for k, v in r.items()} for r in csv.DictReader(f)]

    def median(name: str, key: str, monitored: bool) -> float:
        return statistics.median(r[key] for r in rows(name) if (r["t_monitor"] > 0.01) == monitored)

    def per_step(name: str) -> tuple[float, int, float]:
        rs = rows(name)
        return sum(r["t_monitor"] for r in rs), len(rs), sum(r["t_step"] for r in rs)

    noise, n_noise, steps_noise = per_step("noise")
    total, n, steps = per_step("adamw")
    spectra_monitored = median("spectra-adamw", "t_monitor", True)
    head = ["", "time"]
    body = [
        [f"a monitored step (median over 30; AdamW run, Spectra-AdamW: {spectra_monitored:.3f} s)",
         f"{median('adamw', 't_monitor', True):.3f} s"],
        ["a training step without it (median, AdamW / Spectra-AdamW)",
         f"{median('adamw', 't_step', False):.3f} s / "
         f"{median('spectra-adamw', 't_step', False):.3f} s"],
        ["an unmonitored step's monitor calls (a counter; median of the AdamW run)",
         f"{1e6 * median('adamw', 't_monitor', False):.0f} µs"],
        ["per training step at `--monitor-every 50`, the `SpectralMonitor` default (noise run: "
         f"{noise:.1f} s over {n_noise} steps)",
         f"{1e3 * noise / n_noise:.1f} ms ({noise / steps_noise:.2%})"],
        [f"per training step at `--monitor-every 10` (AdamW run: {total:.1f} s of {steps:.1f} s)",
         f"{1e3 * total / n:.1f} ms ({total / steps:.2%})"],
    ]  # fmt: skip
    return _table(head, body, "lr")


def plan_h100x4(root: Path) -> str:
    """``spectra bench plan`` of the paper's main configs on 4 H100s (a model, not a
    measurement): size, tokens, step and run time at the stored MFU, memory per GPU."""
    from spectra_lab.estimate.plan import _duration

    stored = _json(root, "docs/data/plan_h100x4.json")
    rows = []
    for r in stored["rows"]:
        tokens = r["tokens"] / 1e9
        rows.append([r["file"].removeprefix("configs/paper/").removesuffix(".yaml"),
                     f"{r['parameters'] / 1e6:.1f}M", f"{r['tokens_per_step']:,}",
                     f"{r['steps']:,}", f"{tokens:.1f}B" if tokens >= 1 else f"{tokens:.2f}B",
                     _duration(r["step_s"]), _duration(r["total_s"]),
                     f"{r['memory_ddp']['total'] / 1e9:.1f}",
                     f"{r['memory_fsdp2']['total'] / 1e9:.1f}"])  # fmt: skip
    head = ["config", "params", "tokens/step", "steps", "tokens",
            f"step at {stored['mfu']:.0%} MFU", "run", "DDP GB/GPU", "FSDP2 GB/GPU"]  # fmt: skip
    return _table(head, rows, "lrrrrrrrr")


COORD_CHECK = "results/mup/coord-check/coord_check.json"


def coord_table(root: Path) -> str:
    """μP's coordinate check: each layer's RMS at the widest width over the narrowest, at the
    last step, standard parametrization against μP."""
    from spectra_lab.mup.coord import growth

    ratios = growth(_json(root, COORD_CHECK))

    def fmt(x: float) -> str:
        return f"{x:.0f}" if x >= 100 else f"{x:.2f}"

    rows = [[layer, fmt(ratios["standard"][layer]), fmt(ratios["mup"][layer])]
            for layer in ratios["standard"]]  # fmt: skip
    return _table(["layer", "standard", "μP"], rows, "lrr")


def per_doubling(runs: dict, widths: list[int], layer: str, step: int) -> float:
    """Growth of a layer's RMS per doubling of the width: ``2^slope`` of the least-squares line
    through ``(log2 width, log2 RMS)``."""
    xs = [math.log2(w) for w in widths]
    ys = [math.log2(runs[str(w)][layer][step]) for w in widths]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return 2**slope


def coord_growth(root: Path) -> str:
    """The coordinate check's growth per doubling of the width, over the steps after the
    first, by layer and parametrization."""
    results = _json(root, COORD_CHECK)
    widths, steps = results["widths"], range(1, results["steps"])

    def spread(param: str, layers: tuple[str, ...], fmt: str) -> str:
        g = [per_doubling(results["runs"][param], widths, layer, t)
             for layer in layers for t in steps]  # fmt: skip
        return f"{min(g):{fmt}}–{max(g):{fmt}}×"

    return (f"at steps 1 to {results['steps'] - 1} is {spread('standard', ('block 1',), '.1f')} "
            f"(block 1), {spread('standard', ('block 2',), '.1f')} (block 2) and "
            f"{spread('standard', ('logits',), '.1f')} (logits) with the standard "
            f"parametrization: the updates of the wider matrices move the activations further "
            f"at the same lr. With μP it is {spread('mup', ('block 1', 'block 2'), '.2f')} for "
            f"the blocks and {spread('mup', ('logits',), '.2f')} for the logits")  # fmt: skip


def _records(root: Path, name: str, layer_part: str, steps: tuple[int, ...]) -> list[dict]:
    layers = _json(root, f"results/diagnostics/{name}/spectra.json")["layers"]
    return [r for layer, x in layers.items() if layer_part in layer
            for r in x["records"] if r["step"] in steps]  # fmt: skip


def _spread(vals: list[float], fmt: str = ".2f") -> str:
    return f"{min(vals):{fmt}}–{max(vals):{fmt}}"


def _updates(records: list[dict], key: str = "sigma_max") -> list[float]:
    return [r["update"][key] for r in records]


#: ``spectra analyze``'s recorded steps of the main job's runs (1-based)
DIAG_STEPS = (1, 15, 150, 297)


def diag_phrases() -> dict[str, Callable[[Path], str]]:
    """The diagnostics page's figures quoted in its prose, each a phrase from the stored runs
    (``results/diagnostics/``)."""

    def late(root: Path) -> str:
        rs = _records(root, "spectra-adamw", "attn.wq", (150, 297))
        return f"σ_max is {_spread(_updates(rs))} for `attn.wq`"

    def late_mlp(root: Path) -> str:
        rs = _records(root, "spectra-adamw", "mlp.w1", (150, 297))
        return f"{_spread(_updates(rs), '.1f')} for `mlp.w1`"

    def warm(root: Path) -> str:
        attn = _records(root, "spectra-adamw", "attn.wq", (15,))
        mlp = _records(root, "spectra-adamw", "mlp.w1", (15,))
        return (
            f"gives {_spread(_updates(attn), '.1f')} (bound 20) and {_spread(_updates(mlp), '.1f')}"
        )

    def adamw_sigma(root: Path) -> str:
        sig = _updates(_records(root, "adamw", "", DIAG_STEPS))
        return f"its σ_max runs from {min(sig):.1f} to {max(sig):.0f}"

    def even(root: Path) -> str:
        rs = _records(root, "adamw", "", DIAG_STEPS)
        grad = [r["grad"]["max_over_median"] for r in rs]
        return (f"σ_max/median {_spread(_updates(rs, 'max_over_median'), '.0f')} against "
                f"{_spread(grad, '.0f')}")  # fmt: skip

    def noise(root: Path) -> dict:
        return _json(root, "results/diagnostics/noise/noise.json")

    def summary(root: Path, key: str, steps: tuple[int, ...]) -> list[float]:
        recs = [r for x in noise(root)["layers"].values() for r in x["records"]]
        return [r["summary"][key] for r in recs if r["step"] in steps]

    def pct(vals: list[float]) -> str:
        return f"{100 * min(vals):.0f}–{max(vals):.0%}"

    frac, ratio = "fraction_noise_top_above_signal", "noise_top_over_signal_median"

    def noise_early(root: Path) -> str:
        return (f"σ₁(N) > ‖G‖₂ in {pct(summary(root, frac, (1, 8)))} of the samples at steps 1 "
                f"and 8 (median ratio {_spread(summary(root, ratio, (1, 8)))})")  # fmt: skip

    def noise_late(root: Path) -> str:
        return (f"{pct(summary(root, frac, (75, 148)))} at steps 75 and 148 (median ratio "
                f"{_spread(summary(root, ratio, (75, 148)))})")  # fmt: skip

    def spectral(root: Path) -> str:
        every = (1, 8, 75, 148)
        n = sum(len(x["records"]) for x in noise(root)["layers"].values())
        return (
            f"has median {_spread(summary(root, 'spectral_median', every))} over the {n} "
            f"layer-steps, and {_spread(summary(root, 'spectral_median', (75, 148)), '.3f')}"
        )

    def chordal(root: Path) -> str:
        return f"has median {_spread(summary(root, 'chordal_median', (1, 8, 75, 148)))}"

    def chance(root: Path) -> str:
        vals = [x["chordal_chance"] for x in noise(root)["layers"].values()]
        return f"= {_spread(vals, '.3f')} here"

    def gap(root: Path) -> str:
        adamw, spectra = _json(root, "results/diagnostics/norms/norms.json")["runs"]
        g = {s: a - b for s, a, b in zip(adamw["steps"], adamw["sum_weight_linf"],
                                         spectra["sum_weight_linf"], strict=True)}  # fmt: skip
        return (
            f"the gap reaches {g[131]:.2f} by step 130 and {g[adamw['steps'][-1]]:.2f} at the end"
        )

    phrases = {"late": late, "late-mlp": late_mlp, "warm": warm, "adamw-sigma": adamw_sigma,
               "even": even, "noise-early": noise_early, "noise-late": noise_late,
               "noise-spectral": spectral, "noise-chordal": chordal, "noise-chance": chance,
               "norms-gap": gap}  # fmt: skip
    return {f"data:diag-{k}": f for k, f in phrases.items()}


def more_phrases() -> dict[str, Callable[[Path], str]]:
    """Figures quoted in the prose of the training, operators and optimizers pages, each a
    phrase from its stored run."""

    def main_job(root: Path) -> dict[str, dict[int, float]]:
        return _main_job(root)

    def repro(root: Path, name: str) -> float:
        return _json(root, f"results/main-job/repro/{name}/summary.json")["val_loss"]

    def repro_same(root: Path) -> str:
        runs = main_job(root)
        return f"seed 1337's AdamW twin ends at {runs['adamw'][1337]:.8f} in the sweep"

    def repro_spectra(root: Path) -> str:
        return f"Spectra-AdamW at {main_job(root)['spectra-adamw'][1337]:.8f} in each"

    def repro_generic(root: Path) -> str:
        runs = main_job(root)
        a, s = repro(root, "adamw-generic"), repro(root, "spectra-adamw-generic")
        da, ds = a - runs["adamw"][1337], s - runs["spectra-adamw"][1337]
        shift = f"{da:+.4f}".replace("-", "−")
        return f"AdamW ends at {a:.4f} ({shift}) and Spectra-AdamW at {s:.5f} ({ds:+.5f})"

    def step_clip(root: Path) -> str:
        out = []
        for threads in ("2threads", "1thread"):
            stored = _json(root, f"docs/data/bench_step_main_job_{threads}.json")
            rows = {r["name"]: r for r in stored["rows"]}
            a, s = rows["adamw"], rows["spectra-adamw"]
            d = s["optimizer_ms"] - a["optimizer_ms"]
            out.append((d, (a["total_ms"] + d) / a["total_ms"], s["total_ms"] / a["total_ms"]))
        (d2, r2, t2), (d1, r1, t1) = out
        return (f"The clip adds {d2:.0f} ms to the optimizer step with two threads and {d1:.0f} "
                f"ms with one. Added to AdamW's training step, that is **{r2:.2f}×** and "
                f"**{r1:.2f}×** its time (the totals give {t2:.2f}× and {t1:.2f}×")  # fmt: skip

    def peers(root: Path) -> dict[str, dict]:
        rows = _json(root, "docs/data/bench_optim_peers_cpu_2threads.json")["rows"]
        return {r["method"]: r for r in rows}

    def vs_muon(root: Path) -> str:
        rows = peers(root)
        return (f"The step takes {rows['spectra-adamw']['vs_muon']:.2f}× torch's Muon with AdamW "
                f"(D-Muon {rows['spectra-dmuon']['vs_muon']:.2f}×)")  # fmt: skip

    def fused(root: Path) -> str:
        return (
            f"slower than its foreach one ({peers(root)['torch-adamw-fused']['time_ratio']:.2f}×)"
        )

    def peak(root: Path, name: str) -> float:
        rows = {r["method"]: r for r in _json(root, f"docs/data/{name}.json")["rows"]}
        return rows["spectra-adamw"]["peak_bytes"] / rows["torch-adamw"]["peak_bytes"]

    def memory(root: Path) -> str:
        return (
            f"{peak(root, 'bench_optim_memory_cpu_2threads'):.3f}× on the 1024² matrices "
            f"and {peak(root, 'bench_optim_cpu_2threads'):.3f}× at the 124M shapes"
        )

    def memory_before(root: Path) -> str:
        return f"peaked at {peak(root, 'bench_optim_cpu_2threads_before'):.3f}× torch's foreach"

    def rates(root: Path) -> list[dict]:
        names = ("bench_ops_cpu", "bench_ops_cpu_recorded", "bench_ops_cpu_synthetic",
                 "bench_ssc_vs_orth_cpu")  # fmt: skip
        return [_json(root, f"docs/data/{n}.json")["matmul_gflops"] for n in names]

    def rate_native(root: Path) -> str:
        fp32 = [r["fp32"] for r in rates(root)]
        native = max(r["bf16"] for r in rates(root) if r["bf16"] < 10)
        return f"about {native:.0f} GFLOP/s against {min(fp32):.0f}–{max(fp32):.0f} GFLOP/s"

    def rate_emulated(root: Path) -> str:
        emulated = [r for r in rates(root) if r["bf16"] >= 10]
        bf, fp = [r["bf16"] for r in emulated], [r["fp32"] for r in emulated]
        return f"({min(bf):.0f}–{max(bf):.0f} against {min(fp):.0f}–{max(fp):.0f} GFLOP/s measured"

    phrases = {"repro-same": repro_same, "repro-spectra": repro_spectra,
               "repro-generic": repro_generic, "step-clip": step_clip, "vs-muon": vs_muon,
               "fused": fused, "memory": memory, "memory-before": memory_before,
               "rate-native": rate_native, "rate-emulated": rate_emulated}  # fmt: skip
    return {f"data:q-{k}": f for k, f in phrases.items()}


def synth_stochastic(root: Path) -> str:
    """``spectra synth fw``'s minibatch runs (D₂ = 1, the mean of its runs): residual, the
    iterates' spectral norm, their Frobenius norm and test loss, for b = 0 / 0.1 / 1."""
    runs = [r for r in _json(root, "results/synth/fw_summary.json")["runs"]
            if r["mode"] == "stochastic"]  # fmt: skip
    runs.sort(key=lambda r: r["b"])

    def each(key: str, fmt: str) -> str:
        return " / ".join(f"{r[key]:{fmt}}".replace("e-0", "e-") for r in runs)

    bs = " / ".join(f"{r['b']:g}" for r in runs)
    top = max(r["max_spectral_norm"] for r in runs)
    return (f"the residual falls from {each('residual_first', '.2f')} at k = 1 to "
            f"{each('residual_final', '.1e')} at k = {runs[0]['iters']} for b = {bs}. The "
            f"iterates stay in the ball (max ‖X_k‖₂ = {top:.3f}). The final ‖X_K‖_F is "
            f"{each('final_frobenius_norm', '.2f')} and the final test loss is "
            f"{each('final_test_loss', '.3f')}")  # fmt: skip


def synth_frobenius(root: Path) -> str:
    """The full-batch final Frobenius norm at D₂ = 1 for b = 0 / 0.1 / 1."""
    runs = [r for r in _json(root, "results/synth/fw_summary.json")["runs"]
            if r["mode"] == "full" and r["radius"] == 1.0]  # fmt: skip
    norms = " / ".join(
        f"{r['final_frobenius_norm']:.2f}" for r in sorted(runs, key=lambda r: r["b"])
    )
    return f"the final ‖X‖_F is {norms}"


#: Every block outside the study, by key: what renders it from the files under the root.
BLOCKS: dict[str, Callable[[Path], str]] = {
    "gpu:runs": _gpu_runs,
    "gpu:summary": _gpu_summary,
    "data:machines": _machines,
    "data:main-job": main_job_table,
    "data:main-job-paired": main_job_paired,
    "data:main-job-mixed": main_job_mixed,
    "data:gpu-model-h100": _gpu_model,
    "data:bench-dist-timing": dist_timing,
    "data:diagnostics-gradients": diagnostics_gradients,
    **diag_phrases(),
    **more_phrases(),
    "data:weight-norms": weight_norms,
    "data:monitor-cost": monitor_cost,
    "data:evaluation": evaluation,
    "data:synth-spikes": synth_spikes,
    "data:synth-fw": synth_fw,
    "data:synth-seeds": synth_seeds,
    "data:synth-stochastic": synth_stochastic,
    "data:synth-frobenius": synth_frobenius,
    "data:mup-lr-transfer": lr_transfer,
    "data:plan-h100x4": plan_h100x4,
    "data:coord-check": coord_table,
    "data:coord-growth": coord_growth,
    "data:bench-ops-native": ops_native,
    "data:bench-ops-in-short": ops_in_short,
    "data:bench-ops-synthetic": ops_synthetic,
    "data:polar-flops": polar_flops,
    "data:bench-ops-misses": ops_misses,
    "data:gpu-peaks": gpu_peaks,
    "data:step-ratio-native": step_ratio_native,
    "data:step-ratio-main-job": step_ratio_main_job,
    "gpu:ops": gpu_ops,
    "gpu:peers": gpu_peers,
    "gpu:tests": gpu_tests,
    "gpu:train": gpu_train,
    "gpu:h100": gpu_h100,
    "gpu:after-ops-modules": gpu_after_ops_modules,
    "data:bench-ops-native-medians": ops_native_medians,
    "data:bench-dist-volume": dist_volume,
    "data:bench-dist-traffic": dist_traffic,
    "data:bench-dist-traffic-model": dist_traffic_model,
    **{f"data:{name.replace('_', '-')}": _bench_optim(name) for name in (
        "bench_optim_cpu_2threads", "bench_optim_memory_cpu_2threads",
        "bench_optim_memory_cpu_1thread", "bench_optim_peers_cpu_2threads",
        "bench_optim_cpu_native_bf16_2threads", "bench_optim_main_job_native_bf16")},
    "data:bench-ops-cpu": _ops("bench_ops_cpu", "cells"),
    **{f"data:{name.replace('_', '-')}-summary": _ops(name, "summary") for name in (
        "bench_ops_cpu", "bench_ops_cpu_recorded")},
    "data:bench-ssc-vs-orth-cpu": _ops("bench_ssc_vs_orth_cpu", "sizes"),
    **{f"data:{name.replace('_', '-')}": _bench_step(name) for name in (
        "bench_step_main_job_2threads", "bench_step_main_job_1thread",
        "bench_step_main_job_native_bf16_2threads")},
}  # fmt: skip
