"""Figures quoted inside sentences of the architecture, baselines, diagnostics, distributed,
evaluation, gpu and optimizers pages, each a phrase
or a small table rendered from its stored file: :data:`LIBRARY_PHRASES`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from spectra_lab.blocks.common import json_of, table, value_range

# --------------------------------------------------------------------------- baselines.md

#: The optimizer state measured by ``experiments/baselines_state_memory.py``.
MEMORY_FILE = "docs/data/baselines_state_memory.json"


def baselines_memory_measured(root: Path) -> str:
    """baselines.md's measured state bytes of torch's AdamW, D-Muon and SOAP against the
    paper's formulas (``docs/data/baselines_state_memory.json``)."""
    r = json_of(root, MEMORY_FILE)
    m = r["model"]["parameters"]
    measured = [b / (4 * m) for b in r["state_bytes"]]
    formula = [e / m for e in r["formula_elements"]]
    buffers = ("m, v", "m (Muon); m, v (AdamW)", "m, v, GG, Q")
    words = ("2M", "M₂d + 2M₁d", "2M + Σ_{dᵢ ≤ D} 2dᵢ²")
    rows = [[label, b, f"{x:.3f}", w, f"{f:.3f}"]
            for label, b, x, w, f in zip(r["optimizers"], buffers, measured, words, formula,
                                         strict=True)]  # fmt: skip
    head = ["optimizer", "state buffers", "measured state / param bytes", "paper's formula",
            "formula value"]  # fmt: skip
    return table(head, rows, "lllll")


def baselines_memory_model(root: Path) -> str:
    """The measured model's M and its parameters in Muon matrices
    (``docs/data/baselines_state_memory.json``)."""
    r = json_of(root, MEMORY_FILE)["model"]
    return f"M = {r['parameters']:,} parameters, of which {r['muon']:,} in Muon matrices"


def baselines_memory_adamw_side(root: Path) -> str:
    """The share of the measured model's parameters on D-Muon's AdamW side
    (``docs/data/baselines_state_memory.json``)."""
    r = json_of(root, MEMORY_FILE)["model"]
    return f"{1 - r['muon'] / r['parameters']:.0%} of the parameters"


def baselines_memory_paper_sizes(root: Path) -> str:
    """The paper's formulas at its model sizes (``docs/data/baselines_state_memory.json``)."""
    from spectra_lab.model.llama import PRESETS

    rows = []
    for r in json_of(root, MEMORY_FILE)["paper_sizes"]:
        p = PRESETS[r["preset"]]
        m = r["parameters"]
        factors = [f"{e / m:.3f}" for e in r["formula_elements"]]
        rows.append(
            [r["model"], str(p["d_model"]), str(p["n_layers"]), f"{m / 1e6:.1f}M", *factors]
        )
    head = ["model", "d", "layers", "M", "AdamW", "D-Muon", "SOAP"]
    return table(head, rows, "lllllll")


def baselines_soap_range(root: Path) -> str:
    """SOAP's state per parameter by the paper's formula over the paper's sizes
    (``docs/data/baselines_state_memory.json``)."""
    soap = [
        r["formula_elements"][2] / r["parameters"]
        for r in json_of(root, MEMORY_FILE)["paper_sizes"]
    ]
    return f"SOAP needs {value_range(soap, '.1f')}×"


# --------------------------------------------------------------------------- diagnostics.md

SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


def power(x: float) -> str:
    """``4.6·10⁷``: two significant digits and a power of ten, as diagnostics.md writes them."""
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa}·10{str(int(exp)).translate(SUPERSCRIPT)}"


def diag_final_loss(root: Path) -> str:
    """The two 300-step diagnostics runs' final validation losses
    (``results/diagnostics/{adamw,spectra-adamw}/summary.json``)."""
    a, s = (json_of(root, f"results/diagnostics/{n}/summary.json")["val_loss"]
            for n in ("adamw", "spectra-adamw"))  # fmt: skip
    return f"validation loss {a:.4f} (AdamW) and {s:.4f} (Spectra-AdamW)"


def diag_grad_cond(root: Path) -> str:
    """The extremes of the AdamW run's gradient condition numbers, with layer and step
    (``results/diagnostics/adamw/spectra.json``)."""
    from spectra_lab.blocks.phrases import DIAG_STEPS

    layers = json_of(root, "results/diagnostics/adamw/spectra.json")["layers"]
    recs = [(r["grad"]["cond"], layer.removesuffix(".weight"), r["step"])
            for layer, x in layers.items() for r in x["records"]
            if r["step"] in DIAG_STEPS]  # fmt: skip
    (lo, lo_layer, lo_step), (hi, hi_layer, hi_step) = min(recs), max(recs)
    return (f"{power(lo)} (`{lo_layer}` at step {lo_step}) to {power(hi)} (`{hi_layer}` at "
            f"step {hi_step})")  # fmt: skip


def diag_grad_tail(root: Path) -> str:
    """How many of each gradient's singular values exceed ten times their median, over the
    AdamW run's records (``results/diagnostics/adamw/spectra.json``)."""
    import statistics

    layers = json_of(root, "results/diagnostics/adamw/spectra.json")["layers"]
    sigmas = [r["grad_sigma"] for x in layers.values() for r in x["records"]]
    counts = [sum(v > 10 * statistics.median(s) for v in s) for s in sigmas]
    n = value_range([len(s) for s in sigmas], ".0f")
    return f"between {min(counts)} and {max(counts)} of the {n} singular values"


def diag_update_cond(root: Path) -> str:
    """The condition numbers of the clipped and unclipped updates after the warmup (steps 150
    and 297 of ``results/diagnostics/{spectra-adamw,adamw}/spectra.json``)."""
    from spectra_lab.blocks.phrases import records, updates

    def cond(name: str, part: str) -> list[float]:
        return updates(records(root, name, part, (150, 297)), "cond")

    def powers(vals: list[float]) -> str:
        return f"{power(min(vals))}–{power(max(vals))}"

    return (f"drop to {value_range(cond('spectra-adamw', 'mlp.w1'), '.0f')} (AdamW: "
            f"{value_range(cond('adamw', 'mlp.w1'), '.0f')}); those of the attention updates "
            f"drop too ({powers(cond('spectra-adamw', 'attn.wq'))} against "
            f"{powers(cond('adamw', 'attn.wq'))})")  # fmt: skip


def diag_fro_gap(root: Path) -> str:
    """The largest relative gap of the two runs' summed Frobenius norms over the monitor's
    records (``results/diagnostics/norms/norms.json``)."""
    adamw, spectra = json_of(root, "results/diagnostics/norms/norms.json")["runs"]
    pairs = zip(adamw["sum_weight_fro"], spectra["sum_weight_fro"], strict=True)
    gap = max(abs(a - b) / max(a, b) for a, b in pairs)
    return f"within {gap:.1%} of each other"


def _train_rows(root: Path, name: str) -> list[dict[str, float]]:
    import csv

    path = root / "results" / "diagnostics" / name / "train.csv"
    if not path.is_file():
        raise FileNotFoundError(f"results/diagnostics/{name}/train.csv is missing")
    with open(path) as f:
        return [{k: float(v or 0) for k, v in r.items()} for r in csv.DictReader(f)]


def diag_monitor_share(root: Path) -> str:
    """A monitored step's monitor time against an unmonitored training step, medians of the
    AdamW run (``results/diagnostics/adamw/train.csv``)."""
    import statistics

    rows = _train_rows(root, "adamw")
    monitored = statistics.median(r["t_monitor"] for r in rows if r["t_monitor"] > 0.01)
    step = statistics.median(r["t_step"] for r in rows if r["t_monitor"] <= 0.01)
    return f"about {monitored / step:.0%} of a training step"


def diag_analysis_cost(root: Path) -> str:
    """The recorded steps after the first against the median step, of the ``spectra`` runs and
    the ``noise`` run (``results/diagnostics/*/train.csv``)."""
    import statistics

    def steps(name: str, recorded: tuple[int, ...]) -> tuple[list[float], float]:
        rows = _train_rows(root, name)
        median = statistics.median(r["t_step"] for r in rows)
        return [r["t_step"] for r in rows if r["step"] in recorded], median

    (a, ma), (s, ms) = (steps(n, (15, 150, 297)) for n in ("adamw", "spectra-adamw"))
    noise, mn = steps("noise", (8, 75, 148))
    return (f"{value_range(a + s)} s in the two `spectra` runs (median step {ma:.2f} s and "
            f"{ms:.2f} s) and {value_range(noise, '.1f')} s in the `noise` run (median step "
            f"{mn:.2f} s)")  # fmt: skip


# --------------------------------------------------------------------------- distributed.md


def dist_gram_saving(root: Path) -> str:
    """What the Gram route saves of FSDP2's whole-matrix spectral traffic, by the traffic model
    at the paper's sizes (``docs/data/bench_dist_traffic.json``)."""
    model = json_of(root, "docs/data/bench_dist_traffic.json")["traffic_model"]
    saved = [100 * (1 - r["fsdp2-gram"] / r["fsdp2-whole"]) for r in model]
    ranks = value_range([r["n"] for r in model], ".0f")
    return (f"saves {value_range(saved, '.1f')}% of the spectral links' traffic under FSDP2 at "
            f"{ranks} ranks")  # fmt: skip


# --------------------------------------------------------------------------- evaluation.md


def _downstream(root: Path) -> dict[tuple[str, str, int], tuple[float, float]]:
    """The main job's scores by (optimizer, metric, seed): value and lm-eval's stderr
    (``results/main-job/downstream/*.csv``)."""
    import csv

    files = sorted((root / "results" / "main-job" / "downstream").glob("*.csv"))
    if not files:
        raise FileNotFoundError("results/main-job/downstream/*.csv are missing")
    out = {}
    for f in files:
        opt, seed = (part.split("=")[1] for part in f.stem.split(","))
        with open(f) as fh:
            for r in csv.DictReader(fh):
                out[(opt, r["metric"], int(seed))] = (float(r["value"]), float(r["stderr"]))
    return out


def eval_stderr(root: Path) -> str:
    """lm-eval's stderr of seed 1337's scores (``results/main-job/downstream/*.csv``)."""
    scores = _downstream(root)

    def both(metric: str, fmt: Callable[[float], str]) -> str:
        a, s = (fmt(scores[(o, metric, 1337)][1]) for o in ("adamw", "spectra-adamw"))
        return f"±{a} for both" if a == s else f"±{a} and ±{s}"

    def two_digits(x: float) -> str:  # 2957.8 → 3000
        return f"{float(format(x, '.2g')):.0f}"

    return f"acc {both('acc', lambda x: f'{x:.3f}')}; perplexity {both('perplexity', two_digits)}"


def eval_ppl_ratio(root: Path) -> str:
    """AdamW's mean last-word perplexity over SPECTRA-AdamW's, over the seeds
    (``results/main-job/downstream/*.csv``)."""
    import statistics

    scores = _downstream(root)
    mean = {o: statistics.fmean(v for (opt, m, _), (v, _) in scores.items()
                                if opt == o and m == "perplexity")
            for o in ("adamw", "spectra-adamw")}  # fmt: skip
    return f"{mean['adamw'] / mean['spectra-adamw']:.1f}× lower"


# --------------------------------------------------------------------------- gpu.md


def gpu_part_times(root: Path) -> str:
    """The seconds of each part that the latest full H200 ``gpu-check`` run (one holding
    ``tests.json``) ran itself, in order (``docs/data/gpu/h200/*/gpu_check.json``)."""
    from spectra_lab.blocks.common import latest_gpu

    check = json_of(root, str((latest_gpu(root, "H200", "tests.json") / "gpu_check.json")
                              .relative_to(root)))  # fmt: skip
    done = [(k, p) for k, p in check["parts"].items() if p.get("seconds") is not None]

    def stopped(part: dict) -> bool:  # a run stopped by the part's time limit (gpucheck)
        return any(r.get("error", "").startswith("stopped") for r in part.get("runs", []))

    times = ", ".join(f"`{k}` {p['seconds']:.0f} s" + (" (stopped at its limit)" if stopped(p)
                      else "") for k, p in done)  # fmt: skip
    return f"its run of {check['date']} at `--budget {check['budget_s']:.0f}`: {times}"


#: The phrases by block key.
LIBRARY_PHRASES: dict[str, Callable[[Path], str]] = {
    "data:baselines-memory-measured": baselines_memory_measured,
    "data:baselines-memory-model": baselines_memory_model,
    "data:baselines-memory-adamw-side": baselines_memory_adamw_side,
    "data:baselines-memory-paper-sizes": baselines_memory_paper_sizes,
    "data:baselines-soap-range": baselines_soap_range,
    "data:diag-final-loss": diag_final_loss,
    "data:diag-grad-cond": diag_grad_cond,
    "data:diag-grad-tail": diag_grad_tail,
    "data:diag-update-cond": diag_update_cond,
    "data:diag-fro-gap": diag_fro_gap,
    "data:diag-monitor-share": diag_monitor_share,
    "data:diag-analysis-cost": diag_analysis_cost,
    "data:dist-gram-saving": dist_gram_saving,
    "data:eval-stderr": eval_stderr,
    "data:eval-ppl-ratio": eval_ppl_ratio,
    "data:gpu-part-times": gpu_part_times,
}
