"""Figures quoted inside sentences of the diagnostics, training, operators and optimizers
pages, each a phrase rendered from its stored run: :data:`PHRASES`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from spectra_lab.blocks.common import STEP_TARGET, json_of, main_job_losses, value_range


def records(root: Path, name: str, layer_part: str, steps: tuple[int, ...]) -> list[dict]:
    layers = json_of(root, f"results/diagnostics/{name}/spectra.json")["layers"]
    return [r for layer, x in layers.items() if layer_part in layer
            for r in x["records"] if r["step"] in steps]  # fmt: skip


def updates(records: list[dict], key: str = "sigma_max") -> list[float]:
    return [r["update"][key] for r in records]


#: ``spectra analyze``'s recorded steps of the main job's runs (1-based)
DIAG_STEPS = (1, 15, 150, 297)


def late(root: Path) -> str:
    rs = records(root, "spectra-adamw", "attn.wq", (150, 297))
    return f"σ_max is {value_range(updates(rs))} for `attn.wq`"


def late_mlp(root: Path) -> str:
    rs = records(root, "spectra-adamw", "mlp.w1", (150, 297))
    return f"{value_range(updates(rs), '.1f')} for `mlp.w1`"


def warm(root: Path) -> str:
    attn = records(root, "spectra-adamw", "attn.wq", (15,))
    mlp = records(root, "spectra-adamw", "mlp.w1", (15,))
    a, m = value_range(updates(attn), ".1f"), value_range(updates(mlp), ".1f")
    return f"gives {a} (bound 20) and {m}"


def adamw_sigma(root: Path) -> str:
    sig = updates(records(root, "adamw", "", DIAG_STEPS))
    return f"its σ_max runs from {min(sig):.1f} to {max(sig):.0f}"


def even(root: Path) -> str:
    rs = records(root, "adamw", "", DIAG_STEPS)
    grad = [r["grad"]["max_over_median"] for r in rs]
    return (f"σ_max/median {value_range(updates(rs, 'max_over_median'), '.0f')} against "
            f"{value_range(grad, '.0f')}")  # fmt: skip


def noise(root: Path) -> dict:
    return json_of(root, "results/diagnostics/noise/noise.json")


def summary(root: Path, key: str, steps: tuple[int, ...]) -> list[float]:
    recs = [r for x in noise(root)["layers"].values() for r in x["records"]]
    return [r["summary"][key] for r in recs if r["step"] in steps]


def pct(vals: list[float]) -> str:
    return f"{100 * min(vals):.0f}–{max(vals):.0%}"


frac, ratio = "fraction_noise_top_above_signal", "noise_top_over_signal_median"


def noise_early(root: Path) -> str:
    return (f"σ₁(N) > ‖G‖₂ in {pct(summary(root, frac, (1, 8)))} of the samples at steps 1 "
            f"and 8 (median ratio {value_range(summary(root, ratio, (1, 8)))})")  # fmt: skip


def noise_late(root: Path) -> str:
    return (f"{pct(summary(root, frac, (75, 148)))} at steps 75 and 148 (median ratio "
            f"{value_range(summary(root, ratio, (75, 148)))})")  # fmt: skip


def spectral(root: Path) -> str:
    every = (1, 8, 75, 148)
    n = sum(len(x["records"]) for x in noise(root)["layers"].values())
    return (
        f"has median {value_range(summary(root, 'spectral_median', every))} over the {n} "
        f"layer-steps, and {value_range(summary(root, 'spectral_median', (75, 148)), '.3f')}"
    )


def chordal(root: Path) -> str:
    return f"has median {value_range(summary(root, 'chordal_median', (1, 8, 75, 148)))}"


def chance(root: Path) -> str:
    vals = [x["chordal_chance"] for x in noise(root)["layers"].values()]
    return f"= {value_range(vals, '.3f')} here"


def gap(root: Path) -> str:
    adamw, spectra = json_of(root, "results/diagnostics/norms/norms.json")["runs"]
    g = {s: a - b for s, a, b in zip(adamw["steps"], adamw["sum_weight_linf"],
                                     spectra["sum_weight_linf"], strict=True)}  # fmt: skip
    return f"the gap reaches {g[131]:.2f} by step 130 and {g[adamw['steps'][-1]]:.2f} at the end"


DIAGNOSTICS = {"late": late, "late-mlp": late_mlp, "warm": warm, "adamw-sigma": adamw_sigma,
           "even": even, "noise-early": noise_early, "noise-late": noise_late,
           "noise-spectral": spectral, "noise-chordal": chordal, "noise-chance": chance,
           "norms-gap": gap}  # fmt: skip


def repro(root: Path, name: str) -> float:
    return json_of(root, f"results/main-job/repro/{name}/summary.json")["val_loss"]


def repro_same(root: Path) -> str:
    runs = main_job_losses(root)
    return f"seed 1337's AdamW twin ends at {runs['adamw'][1337]:.8f} in the sweep"


def repro_spectra(root: Path) -> str:
    return f"Spectra-AdamW at {main_job_losses(root)['spectra-adamw'][1337]:.8f} in each"


def repro_generic(root: Path) -> str:
    runs = main_job_losses(root)
    a, s = repro(root, "adamw-generic"), repro(root, "spectra-adamw-generic")
    da, ds = a - runs["adamw"][1337], s - runs["spectra-adamw"][1337]
    shift = f"{da:+.4f}".replace("-", "−")
    return f"AdamW ends at {a:.4f} ({shift}) and Spectra-AdamW at {s:.5f} ({ds:+.5f})"


def step_ratios(root: Path) -> list[tuple[float, float, float]]:
    """For two threads, then one (``bench_step_main_job_{2threads,1thread}.json``): the ms the
    clip adds to the optimizer step, that added to AdamW's training step as a ratio (by
    optimizer time), and the ratio of the totals."""
    out = []
    for threads in ("2threads", "1thread"):
        stored = json_of(root, f"docs/data/bench_step_main_job_{threads}.json")
        rows = {r["name"]: r for r in stored["rows"]}
        a, s = rows["adamw"], rows["spectra-adamw"]
        d = s["optimizer_ms"] - a["optimizer_ms"]
        out.append((d, (a["total_ms"] + d) / a["total_ms"], s["total_ms"] / a["total_ms"]))
    return out


def step_clip_verdict(root: Path) -> str:
    """Whether the main job's step by optimizer time meets :data:`STEP_TARGET`, by threads."""
    met = [r <= STEP_TARGET for _, r, _ in step_ratios(root)]
    target = f"the `{STEP_TARGET:.2f}×` target"
    if all(met):
        return f"{target} is **met** with two threads and with one"
    if not any(met):
        return f"{target} is **not met** with two threads nor with one"
    yes, no = ("two threads", "one") if met[0] else ("one thread", "two")
    return f"{target} is **met** with {yes} and **not** with {no}"


def step_clip(root: Path) -> str:
    (d2, r2, t2), (d1, r1, t1) = step_ratios(root)
    return (f"The clip adds {d2:.0f} ms to the optimizer step with two threads and {d1:.0f} "
            f"ms with one. Added to AdamW's training step, that is **{r2:.3f}×** and "
            f"**{r1:.3f}×** its time (the totals give {t2:.2f}× and {t1:.2f}×")  # fmt: skip


def peers(root: Path) -> dict[str, dict]:
    rows = json_of(root, "docs/data/bench_optim_peers_cpu_2threads.json")["rows"]
    return {r["method"]: r for r in rows}


def vs_muon(root: Path) -> str:
    rows = peers(root)
    return (f"The step takes {rows['spectra-adamw']['vs_muon']:.2f}× torch's Muon with AdamW "
            f"(D-Muon {rows['spectra-dmuon']['vs_muon']:.2f}×)")  # fmt: skip


#: torch's three AdamW implementations in the peers' run, as the page names them
ADAMW_KINDS = {"torch-adamw": "foreach", "torch-adamw-fused": "fused",
               "torch-adamw-loop": "per-parameter loop"}  # fmt: skip


def fused(root: Path) -> str:
    """torch's fused AdamW and its per-parameter loop against its foreach one, and which of the
    three is the fastest (``docs/data/bench_optim_peers_cpu_2threads.json``)."""
    rows = peers(root)
    fastest = min(ADAMW_KINDS, key=lambda m: rows[m]["step_s"])
    return (f"takes {rows['torch-adamw-fused']['time_ratio']:.2f}× the time of its foreach one and "
            f"its per-parameter loop {rows['torch-adamw-loop']['time_ratio']:.2f}×: the "
            f"{ADAMW_KINDS[fastest]} step is the fastest of the three")  # fmt: skip


def peak(root: Path, name: str) -> float:
    rows = {r["method"]: r for r in json_of(root, f"docs/data/{name}.json")["rows"]}
    return rows["spectra-adamw"]["peak_bytes"] / rows["torch-adamw"]["peak_bytes"]


def memory(root: Path) -> str:
    return (
        f"{peak(root, 'bench_optim_memory_cpu_2threads'):.3f}× on the 1024² matrices "
        f"and {peak(root, 'bench_optim_cpu_2threads'):.3f}× at the 124M shapes"
    )


def default_124m(root: Path) -> str:
    """The default step at the 124M shapes on the path without bf16 units against ``eigh``'s and
    the paper's bf16 wrapper's (``docs/data/bench_optim_cpu_2threads.json``)."""
    stored = json_of(root, "docs/data/bench_optim_cpu_2threads.json")
    rows = {r["method"]: r["step_s"] for r in stored["rows"]}
    step = rows["spectra-adamw"]
    return (f"takes {step / rows['spectra-adamw-eigh']:.2f}× the time of `eigh`'s and "
            f"{step / rows['paper-wrap-bf16']:.2f}× the paper's bf16 wrapper's")  # fmt: skip


def rates(root: Path) -> list[dict]:
    names = ("bench_ops_cpu", "bench_ops_cpu_recorded", "bench_ops_cpu_synthetic",
             "bench_ssc_vs_orth_cpu")  # fmt: skip
    return [json_of(root, f"docs/data/{n}.json")["matmul_gflops"] for n in names]


QUOTED = {"repro-same": repro_same, "repro-spectra": repro_spectra,
           "repro-generic": repro_generic, "step-clip": step_clip,
           "step-clip-verdict": step_clip_verdict, "vs-muon": vs_muon,
           "fused": fused, "memory": memory, "124m-default": default_124m}  # fmt: skip


#: The phrases by block key.
PHRASES: dict[str, Callable[[Path], str]] = {
    **{f"data:diag-{k}": f for k, f in DIAGNOSTICS.items()},
    **{f"data:q-{k}": f for k, f in QUOTED.items()},
}
