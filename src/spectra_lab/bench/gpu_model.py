"""``spectra bench gpu-model``: a flop and launch-count model of soft clipping on an H100.

Not a measurement. It counts, per optimizer step on a Llama model's parameter shapes, the
matrix-product flops and the kernel launches of

* ``paper-bf16``: the paper's Algorithm 1 with N_s = 10 in bfloat16, one matrix at a time
  (its clone-and-subtract wrapper);
* ``polar``: ``soft_clip(method="polar")``, the CUDA default, in IEEE float32 (or float64
  where float32 products run in TF32: H100 runs both at the same rate), one call per batch
  of same-shaped matrices;
* ``polar-bf16x3``: the same with ``ns_dtype=torch.bfloat16``, every product formed from
  three bf16 tensor-core products (``split_bf16_matmul``); only where ``α = 1 + (σ_max/c)²
  ≤ 1e4``, beyond which it runs as ``polar``;

and turns them into time with ``t = flops / (efficiency · peak) + launches · t_launch``.
The peaks are NVIDIA's H100 SXM figures (dense): bf16 989 TFLOP/s, TF32 495, float32 67,
float64 (tensor core) 67. ``efficiency`` (default 0.6) and ``t_launch`` (default 8 µs, an
eager PyTorch op including its CPU dispatch) are assumptions; the table says so. The
memory traffic of elementwise kernels (the splits, the polynomial updates) is left out.

Launch counts come from the code: Algorithm 1 takes about 14 kernels before its loop and
5 per Newton–Schulz step (two products, the 3I − ZY update, its halving, one more product),
70 in all, plus 6 for the wrapper's clone, recovery and update; ``polar`` takes about 30
kernels for its scale, Gram matrix, bounds and schedule, 8 per quintic step and 6 to finish.
A split product adds 10 kernels to its one (two splits of 4 elementwise kernels, two
concatenations): ``polar-bf16x3`` takes about 50, 48 per step and 16 to finish.
"""

from __future__ import annotations

import argparse
import math

from spectra.ops.polar import inverse_sqrt_schedule
from spectra.ops.spectral import POLAR_SPLIT_MAX_ALPHA, POLAR_TOL
from spectra_lab.bench.ops import matmul_flops
from spectra_lab.bench.optim import llama_shapes

PEAK_TFLOPS = {"bf16": 989.0, "tf32": 495.0, "fp32": 67.0, "fp64": 67.0}
PAPER_LAUNCHES_PER_MATRIX = 70 + 6
POLAR_LAUNCHES = (30, 8, 6)  # per call: fixed, per step, finish
SPLIT_EXTRA_LAUNCHES = 10  # per split bf16 product
#: Presets' (layers, d_model, SwiGLU hidden, vocabulary), from spectra_lab.model.llama.
MODELS = {"124m": (12, 768, 2048, 50304), "780m": (32, 1280, 3584, 50304)}


def matrices(layers: int, dim: int, hidden: int, vocab: int) -> list[tuple[int, int]]:
    """The clipped matrices as ``(m, n)`` with ``m ≤ n`` (every 2-D parameter)."""
    out = []
    for s in llama_shapes(layers, dim, hidden, vocab):
        if len(s) == 2:
            out.append((min(s), max(s)))
    return out


def polar_steps_for(sigma_over_c: float, tol: float = POLAR_TOL) -> int:
    """Quintic steps ``polar`` runs for ``α = 1 + (σ_max/c)²``."""
    alpha = 1.0 + sigma_over_c**2
    return len(inverse_sqrt_schedule(1.0 / math.sqrt(alpha), tol))


def step_model(
    model: str, sigma_over_c: float, efficiency: float = 0.6, t_launch_us: float = 8.0
) -> dict[str, dict[str, float]]:
    """Per-step flops, launches and modelled milliseconds of each method."""
    mats = matrices(*MODELS[model])
    steps = polar_steps_for(sigma_over_c)
    paper_f = sum(matmul_flops("paper", (m, n)) for m, n in mats)
    paper_l = PAPER_LAUNCHES_PER_MATRIX * len(mats)
    polar_f = sum(matmul_flops("polar", (m, n), steps) for m, n in mats)
    batches = len(set(mats))
    fixed, per_step, finish = POLAR_LAUNCHES
    polar_l = batches * (fixed + per_step * steps + finish)
    rows = [
        ("paper-bf16", paper_f, paper_l, PEAK_TFLOPS["bf16"]),
        ("polar-fp32", polar_f, polar_l, PEAK_TFLOPS["fp32"]),
    ]
    if 1.0 + sigma_over_c**2 <= POLAR_SPLIT_MAX_ALPHA:
        extra = SPLIT_EXTRA_LAUNCHES
        split_l = batches * (fixed + 2 * extra + (per_step + 4 * extra) * steps + finish + extra)
        rows.append(("polar-bf16x3", 3 * polar_f, split_l, PEAK_TFLOPS["bf16"]))
    out = {}
    for name, flops, launches, peak in rows:
        t_math = flops / (efficiency * peak * 1e12) * 1e3
        t_launch = launches * t_launch_us * 1e-3
        out[name] = {
            "gflop": flops / 1e9,
            "launches": launches,
            "ms_math": t_math,
            "ms_launch": t_launch,
            "ms": t_math + t_launch,
        }
    for name in out:
        if name.startswith("polar"):
            out[name]["steps"] = steps
    return out


def table(sigmas: tuple[float, ...], efficiency: float, t_launch_us: float) -> str:
    lines = [
        f"H100 SXM model (not measured): efficiency {efficiency:.0%} of peak, "
        f"{t_launch_us:g} µs per launch",
        "",
        "| model | σ_max/c | method | GFLOP | launches | ms (math + launch) | ÷ paper bf16 |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for model in MODELS:
        for s in sigmas:
            rows = step_model(model, s, efficiency, t_launch_us)
            ref = rows["paper-bf16"]["ms"]
            for name, r in rows.items():
                label = f"{name} (K={r['steps']})" if "steps" in r else name
                lines.append(
                    f"| {model} | {s:g} | {label} | {r['gflop']:.0f} | {r['launches']:.0f} "
                    f"| {r['ms']:.1f} ({r['ms_math']:.1f} + {r['ms_launch']:.1f}) "
                    f"| {r['ms'] / ref:.2f} |"
                )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sigma-over-c", type=float, nargs="+", default=[10.0, 30.0, 300.0], help="σ_max/c"
    )
    parser.add_argument("--efficiency", type=float, default=0.6, help="fraction of peak")
    parser.add_argument("--launch-us", type=float, default=8.0, help="µs per kernel launch")


def run(args: argparse.Namespace) -> int:
    from spectra.validate import check_number
    from spectra_lab.cli import CLIError

    try:
        for s in args.sigma_over_c:
            check_number("--sigma-over-c", s, low=0.0)
        check_number("--efficiency", args.efficiency, low=0.0, high=1.0, low_open=True)
        check_number("--launch-us", args.launch_us, low=0.0)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    print(table(tuple(args.sigma_over_c), args.efficiency, args.launch_us), end="")
    return 0
