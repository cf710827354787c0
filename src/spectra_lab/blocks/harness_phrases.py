"""Figures quoted inside sentences of the scale, synthetic and training pages, each a phrase
or a small table rendered from its stored file: :data:`HARNESS_PHRASES`."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from spectra_lab.blocks.common import json_of, sci, value_range
from spectra_lab.blocks.runs import COORD_CHECK, per_doubling


def train_seed_spread(root: Path) -> str:
    """``results/main-job/results.json``: the sample std of AdamW's final loss over the seeds."""
    groups = json_of(root, "results/main-job/results.json")["groups"]
    adamw = next(g for g in groups if g["point"].get("optimizer") == "adamw")
    return f"± {adamw['std']:.3f} over the sweep's {adamw['seeds_done']} AdamW seeds"


def fw_runs(root: Path, mode: str) -> list[dict]:
    runs = json_of(root, "results/synth/fw_summary.json")["runs"]
    return [r for r in runs if r["mode"] == mode]


def synth_fw_residual_max(root: Path) -> str:
    """``results/synth/fw_summary.json``: the largest full-batch residual at the last step."""
    runs = fw_runs(root, "full")
    return f"{sci(max(r['residual_final'] for r in runs))} or below by k = {runs[0]['iters']}"


def synth_stochastic_orders(root: Path) -> str:
    """``results/synth/fw_summary.json``: how many orders of magnitude the minibatch runs'
    residual falls between the first and the last step."""
    runs = fw_runs(root, "stochastic")
    orders = [math.log10(r["residual_first"] / r["residual_final"]) for r in runs]
    return (f"{min(orders):.1f} to {max(orders):.1f} orders of magnitude in "
            f"{runs[0]['iters']} steps")  # fmt: skip


def synth_fw_smoothness(root: Path) -> str:
    """``results/synth/fw_summary.json``: the bound on the smoothness constant L_F."""
    return f"L_F ≤ {json_of(root, 'results/synth/fw_summary.json')['smoothness_L']:.2f}"


def synth_tight_ball_effect(root: Path) -> str:
    """``results/synth/fw_summary.json`` and ``seed-N/`` beside it: the largest spread over b of
    the full-batch test loss at D₂ = 0.2, over the seeds."""
    spreads = []
    for seed in range(5):
        name = "fw_summary.json" if seed == 0 else f"seed-{seed}/fw_summary.json"
        loss = [r["final_test_loss"] for r in json_of(root, f"results/synth/{name}")["runs"]
                if r["mode"] == "full" and r["radius"] == 0.2]  # fmt: skip
        spreads.append(max(loss) - min(loss))
    return f"≤ {max(spreads):.3f}"


def spikes(root: Path) -> dict:
    return json_of(root, "results/synth/spikes_summary.json")


def synth_spikes_bound(root: Path) -> str:
    """``results/synth/spikes_summary.json``: the bound M on the gradient's spectral norm."""
    return f"M ≤ (1/n)Σᵢ‖Aᵢ‖₂ = {spikes(root)['gradient_bound_M']:.2f}"


def synth_spikes_gradient(root: Path) -> str:
    """``results/synth/spikes_summary.json``: the gradient's spectral norm at 0, and the bound
    on the smoothness constant L_F."""
    s = spikes(root)
    return f"‖∇f(0)‖₂ = {s['grad_spectral_norm_at_0']:.2f}, and L_F ≤ {s['smoothness_L']:.2f}"


def coord_wobble(root: Path) -> str:
    """``results/mup/coord-check/coord_check.json``: under μP, the largest spread of a layer's
    RMS over the widths at one step after the first, for the blocks and for the logits."""
    results = json_of(root, COORD_CHECK)
    runs, widths = results["runs"]["mup"], [str(w) for w in results["widths"]]

    def spread(layers: tuple[str, ...]) -> float:
        return max(max(runs[w][layer][t] for w in widths) / min(runs[w][layer][t] for w in widths)
                   for layer in layers for t in range(1, results["steps"]))  # fmt: skip

    blocks, logits = spread(("block 1", "block 2")), spread(("logits",))
    return (f"the block outputs by up to {blocks:.1f}× from one width to another at a step, "
            f"the logits, which oscillate from step to step at this lr, by up to "
            f"{logits:.1f}×")  # fmt: skip


def coord_logits_step0(root: Path) -> str:
    """``results/mup/coord-check/coord_check.json``: the μP logits' growth per doubling of the
    width at step 0 (the closed form is 1/√2)."""
    results = json_of(root, COORD_CHECK)
    growth = per_doubling(results["runs"]["mup"], results["widths"], "logits", 0)
    return f"({growth:.2f}× per doubling), as the 1/m readout multiplier prescribes"


def mup_spectra_margin(root: Path) -> str:
    """``results/mup/lr-transfer/results.json``: AdamW's best final loss minus Spectra-AdamW's,
    per width, in the standard parametrization and in μP (both of Spectra-AdamW's μP rows)."""
    best = {}
    for b in json_of(root, "results/mup/lr-transfer/results.json")["best"]:
        p = b["point"]
        best[p["optimizer"], p["parametrization"], p.get("mup_lr_scaling", True), p["d_model"]] = b[
            "mean"
        ]
    widths = sorted({k[3] for k in best})
    pairs = [(("adamw", "standard", True), ("spectra-adamw", "standard", True)),
             (("adamw", "mup", True), ("spectra-adamw", "mup", True)),
             (("adamw", "mup", True), ("spectra-adamw", "mup", False))]  # fmt: skip
    margins = [best[(*a, w)] - best[(*s, w)] for a, s in pairs for w in widths]
    return f"by {value_range(margins)} in final loss"


#: The phrases by block key.
#: AdamW's step times on four H100s in the paper's Table "Per-step timing" (tab:timing_combined),
#: in ms: a quote of the paper, not a measurement of this project
PAPER_STEP_MS = {"160m": 200.7, "780m": 6550.0, "820m": 4412.0}


def paper_mfu(root: Path) -> str:
    """``docs/data/plan_paper_configs.json``: the MFU the paper's AdamW step times imply by the
    plan's FLOP count (its step at the plan's MFU over the paper's step), and how much longer
    than the plan's rows that makes a run."""
    plan = json_of(root, "docs/data/plan_paper_configs.json")
    step = {r["file"]: r["step_s"] for r in plan["rows"]}
    mfu = [plan["mfu"] * step[f"configs/paper/{size}-wsd-adamw.yaml"] / (ms / 1e3)
           for size, ms in PAPER_STEP_MS.items()]  # fmt: skip
    slower = [plan["mfu"] / x for x in mfu]
    listed = ", ".join(f"{100 * x:.0f}%" for x in mfu[:-1]) + f" and {100 * mfu[-1]:.0f}%"
    return (f"{listed} MFU by the same FLOP count, so expect the runs to take "
            f"{min(slower):.1f}–{max(slower):.0f}× longer than the {100 * plan['mfu']:.0f}% rows "
            "say")  # fmt: skip


HARNESS_PHRASES: dict[str, Callable[[Path], str]] = {
    "data:paper-mfu": paper_mfu,
    "data:train-seed-spread": train_seed_spread,
    "data:synth-fw-residual-max": synth_fw_residual_max,
    "data:synth-stochastic-orders": synth_stochastic_orders,
    "data:synth-fw-smoothness": synth_fw_smoothness,
    "data:synth-tight-ball-effect": synth_tight_ball_effect,
    "data:synth-spikes-bound": synth_spikes_bound,
    "data:synth-spikes-gradient": synth_spikes_gradient,
    "data:coord-wobble": coord_wobble,
    "data:coord-logits-step0": coord_logits_step0,
    "data:mup-spectra-margin": mup_spectra_margin,
}
