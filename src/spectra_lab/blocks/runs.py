"""Blocks rendered from the stored training runs and experiments under ``results/``: the main
job, its evaluation and diagnostics, the synthetic experiments, μP's checks and the plans of
the paper's configs."""

from __future__ import annotations

import itertools
import math
import statistics
from pathlib import Path

from spectra_lab.blocks.common import (
    json_of,
    loss_text,
    lr_text,
    main_job_losses,
    paired,
    residual_text,
    short,
    table,
)


def significance(t: float) -> str:
    """A paired t over three seeds at the 95% level (Student's t, 2 dof: 4.303)."""
    return "significant" if abs(t) > 4.303 else "not significant"


def main_job_table(root: Path) -> str:
    """The main job's table: seed 1337's loss and perplexity, mean ± std over the seeds."""
    runs = main_job_losses(root)
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
    runs = main_job_losses(root)
    mean, sd, t = paired(runs["spectra-adamw"], runs["adamw"])
    sig = significance(t)
    return f"Δ = AdamW − Spectra-AdamW = {mean:.3f} ± {sd:.3f} (t = {t:.1f}, {sig}"


def main_job_pinned(root: Path, sweep: str) -> str:
    """The main job's Spectra-AdamW with its clip pinned to one method (the sweep
    ``results/<sweep>``), and its pairing against the stored main job's ``eigh``."""
    exact = main_job_losses(root)["spectra-adamw"]
    pinned = next(iter(main_job_losses(root, sweep).values()))
    mean, sd, t = paired(exact, pinned)
    ms = f"{statistics.fmean(pinned.values()):.4f} ± {statistics.stdev(pinned.values()):.4f}"
    sig = significance(t)
    return f"end at {ms}, paired against `eigh` {mean:+.4f} ± {sd:.4f} (t = {t:.1f}, {sig})"


def main_job_mixed(root: Path) -> str:
    """The main job's Spectra-AdamW with ``mixed`` against ``eigh``."""
    return main_job_pinned(root, "main-job-mixed")


def main_job_chebyshev(root: Path) -> str:
    """The main job's Spectra-AdamW with ``chebyshev`` against ``eigh``."""
    return main_job_pinned(root, "main-job-chebyshev")


def machines(root: Path) -> str:
    from spectra_lab.bench.machines import machines_table

    return machines_table(root / "docs" / "data")


def diagnostics_gradients(root: Path) -> str:
    """σ_max / median σ of the gradient of each recorded layer of the main job's AdamW run, at
    each recorded step (``spectra analyze spectra``)."""
    layers = json_of(root, "results/diagnostics/adamw/spectra.json")["layers"]
    steps = [r["step"] for r in next(iter(layers.values()))["records"]]
    rows = [[f"`{layer.removesuffix('.weight')}`",
             *(f"{r['grad']['max_over_median']:.0f}" for r in x["records"])]
            for layer, x in layers.items()]  # fmt: skip
    return table(["layer", *(f"step {s}" for s in steps)], rows, "l" + "r" * len(steps))


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
    return table(head, rows, "llrrrrr")


SPIKE_METHODS = {"sgd": "SGD", "sgd_global_clip": "SGD + global clip",
                 "sgd_spectral_clip": "SGD + spectral clip", "sgdm": "SGD-M",
                 "sgdm_pre_clip": "SGD-M + pre-clip"}  # fmt: skip


def synth_spikes(root: Path) -> str:
    """``spectra synth spikes``, seed 0: each method's chosen η₀ → final training loss, and
    the largest η₀ that did not diverge in brackets, by spike size ℓ."""
    chosen = json_of(root, "results/synth/spikes_summary.json")["chosen"]
    scales = sorted({c["scale"] for c in chosen})
    rows = []
    for method, label in SPIKE_METHODS.items():
        cells = []
        for scale in scales:
            c = next(c for c in chosen if c["method"] == method and c["scale"] == scale)
            edge = " (grid edge)" if c["best_at_grid_edge"] else ""
            cells.append(f"{short(c['best_eta0'])} → {loss_text(c['best_final_loss'])} "
                         f"[{short(max(c['converging_eta0']))}]{edge}")  # fmt: skip
        rows.append([label, *cells])
    return table(["method", *(f"ℓ = {s:g}" for s in scales)], rows, "llll")


def synth_fw(root: Path) -> str:
    """``spectra synth fw``, seed 0: the optimum of each (D₂, b) and the full-batch
    Frank–Wolfe run towards it (residuals, the theorem's bound, the iterates' norms)."""
    fw = json_of(root, "results/synth/fw_summary.json")
    rows = []
    for o in fw["optimum"]:
        point = (o["radius"], o["b"])
        r = next(r for r in fw["runs"] if r["mode"] == "full" and (r["radius"], r["b"]) == point)
        final = "≤ 1e-15" if r["residual_final"] < 1e-15 else f"{r['residual_final']:.1e}"
        value = f"{o['value']:.4f}" if o["value"] > 1e-3 else f"{o['value']:.1e}"
        fro = f"{o['frobenius_norm']:.{3 if o['frobenius_norm'] < 10 else 2}f}"
        rows.append([f"{o['radius']:g}", f"{o['b']:g}", value.replace("e-0", "e-"),
                     f"{o['spectral_norm']:.3f}", fro,
                     residual_text(r["residual_first"]), final.replace("e-0", "e-"),
                     residual_text(r["theorem_bound_final"]), f"{r['max_spectral_norm']:#.3g}",
                     f"{r['final_test_loss']:#.3g}"])  # fmt: skip
    head = ["D₂", "b", "F\\*", "‖X\\*‖₂", "‖X\\*‖_F", "residual k=1", "residual k=2000",
            "2L_F D_F²/(K+1)", "max_k ‖X_k‖₂", "test loss at k=2000"]  # fmt: skip
    return table(head, rows, "")


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
    results = json_of(root, "results/mup/lr-transfer/results.json")

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
            cells.append(f"{lr_text(b['lr'])} ({b['mean']:.3f} ± {b['std']:.3f}{edge})")
            lrs.append(b["lr"])
        steps = [b / a for a, b in itertools.pairwise(lrs)]
        moves = ("**stays**" if all(s == 1 for s in steps) else
                 "halves per doubling" if all(s == 0.5 for s in steps) else
                 "grows" if all(s >= 1 for s in steps) else "moves")  # fmt: skip
        rows.append([label, *cells, moves])
    return table(["method", *(f"width {w}" for w in widths), "best lr moves?"], rows, "")


def synth_seeds(root: Path) -> str:
    """``spectra synth fw`` over seeds 0-4: the full-batch iterate's test loss at k = 2000 for
    b = 0 / 0.1 / 1, by radius D₂."""
    rows = []
    for seed in range(5):
        name = "fw_summary.json" if seed == 0 else f"seed-{seed}/fw_summary.json"
        runs = json_of(root, f"results/synth/{name}")["runs"]
        full = {(r["radius"], r["b"]): r["final_test_loss"] for r in runs if r["mode"] == "full"}

        def fmt(x: float) -> str:
            return f"{x:.2f}" if x >= 1 else f"{x:.3f}"

        rows.append([str(seed), *(" / ".join(fmt(full[d2, b]) for b in (0.0, 0.1, 1.0))
                                  for d2 in (1.0, 5.0, 0.2))])  # fmt: skip
    return table(["seed", "D₂ = 1", "D₂ = 5", "D₂ = 0.2"], rows, "")


def synth_stochastic(root: Path) -> str:
    """``spectra synth fw``'s minibatch runs (D₂ = 1, the mean of its runs): residual, the
    iterates' spectral norm, their Frobenius norm and test loss, for b = 0 / 0.1 / 1."""
    runs = [r for r in json_of(root, "results/synth/fw_summary.json")["runs"]
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
    runs = [r for r in json_of(root, "results/synth/fw_summary.json")["runs"]
            if r["mode"] == "full" and r["radius"] == 1.0]  # fmt: skip
    norms = " / ".join(
        f"{r['final_frobenius_norm']:.2f}" for r in sorted(runs, key=lambda r: r["b"])
    )
    return f"the final ‖X‖_F is {norms}"


def weight_norms(root: Path) -> str:
    """``spectra analyze norms``: the summed ℓ∞ and Frobenius norms of the weight matrices at
    the last monitor record, AdamW against Spectra-AdamW (relative change in brackets)."""
    adamw, spectra = json_of(root, "results/diagnostics/norms/norms.json")["runs"]
    linf = (adamw["sum_weight_linf"][-1], spectra["sum_weight_linf"][-1])
    fro = (adamw["sum_weight_fro"][-1], spectra["sum_weight_fro"][-1])
    rel = [f"{linf[1] / linf[0] - 1:+.0%}", f"{fro[1] / fro[0] - 1:+.1%}"]
    rel = [r.replace("-", "−") for r in rel]
    rows = [["AdamW", f"{linf[0]:.3f}", f"{fro[0]:.1f}"],
            ["Spectra-AdamW", f"{linf[1]:.3f} ({rel[0]})", f"{fro[1]:.1f} ({rel[1]})"]]  # fmt: skip
    return table(["", "Σ ‖X‖_∞", "Σ ‖X‖_F"], rows, "lrr")


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
    return table(head, body, "lr")


def plan_h100x4(root: Path) -> str:
    """``spectra bench plan`` of the paper's main configs on 4 H100s (a model, not a
    measurement): size, tokens, step and run time at the stored MFU, memory per GPU."""
    from spectra_lab.estimate.plan import _duration

    stored = json_of(root, "docs/data/plan_h100x4.json")
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
    return table(head, rows, "lrrrrrrrr")


COORD_CHECK = "results/mup/coord-check/coord_check.json"


def coord_table(root: Path) -> str:
    """μP's coordinate check: each layer's RMS at the widest width over the narrowest, at the
    last step, standard parametrization against μP."""
    from spectra_lab.mup.coord import growth

    ratios = growth(json_of(root, COORD_CHECK))

    def fmt(x: float) -> str:
        return f"{x:.0f}" if x >= 100 else f"{x:.2f}"

    rows = [[layer, fmt(ratios["standard"][layer]), fmt(ratios["mup"][layer])]
            for layer in ratios["standard"]]  # fmt: skip
    return table(["layer", "standard", "μP"], rows, "lrr")


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
    results = json_of(root, COORD_CHECK)
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
