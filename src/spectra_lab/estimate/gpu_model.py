"""``spectra bench gpu-model``: a flop and launch-count model of soft clipping on an H100.

Not a measurement. It counts, per optimizer step on a Llama model's parameter shapes, the
matrix-product flops and the kernel launches of

* ``paper-bf16``: the paper's Algorithm 1 with N_s = 10 in bfloat16, one matrix at a time
  (its clone-and-subtract wrapper);
* ``polar``: ``soft_clip(method="polar")``, the CUDA default, in IEEE float32 (or float64
  where float32 products run in TF32: H100 runs both at the same rate), one call per batch
  of same-shaped matrices;
* ``polar-bf16x3``: the same with ``ns_dtype=torch.bfloat16``, every product formed from
  three bf16 tensor-core products (``split_bf16_matmul``), the Gram matrix and ``G²`` from
  two (``split_bf16_gram``); only where ``α = 1 + (σ_max/c)²
  ≤ 1e4``, beyond which it runs as ``polar``;
* ``mixed``: ``soft_clip(method="mixed")``, its Gram matrix and first steps in float32
  (float64 past α = 1e5, at the same H100 rate) and the rest in bf16
  (:func:`~spectra_lab.bench.flops.mixed_flops`);
* ``mixed-bf16x3``: the same with split bf16 products for its float32 ones (the CUDA default
  for matrices of smaller side 1024 or more, so at 780M;
  :func:`~spectra_lab.bench.flops.mixed_split_flops`), while α ≤ 1e4;
* ``mixed-capturable``, ``mixed-capturable-bf16x6``, ``mixed-capturable-bf16x3-r100``: the
  call that reads nothing (``capturable=True``), whose schedule is the same whatever σ_max/c:
  float32 products; split bf16 products of three parts
  (``mixed_split_flops(..., parts=3)``); and of two under ``ratio_bound=100`` (only where
  σ_max/c ≤ 100). A CUDA graph would take most of their launches' host cost, which the
  model does not know, so they are charged as eager launches;
* ``torch-muon``: ``torch.optim.Muon``'s five bf16 Newton–Schulz steps on each hidden matrix
  (both sides under ``MUON_MAX_DIM``, as ``bench optim``'s ``torch-muon`` row runs it: the
  embedding and the head go to AdamW), one matrix at a time, the reference of the 780M bar;

and turns them into time with ``t = flops / (efficiency · peak) + launches · t_launch``.
The peaks are NVIDIA's H100 SXM figures (dense): bf16 989 TFLOP/s, TF32 495, float32 67,
float64 (tensor core) 67. ``efficiency`` (default 0.6) and ``t_launch`` (default 8 µs, an
eager PyTorch op including its CPU dispatch) are assumptions; the table says so. The
memory traffic of elementwise kernels (the splits, the polynomial updates) is left out.

Launch counts are counted, not estimated: :func:`count_kernels` runs the operator once on a
small CPU matrix with the same σ_max/c (so the same schedule) and counts the aten operations
it dispatches that compute something (views, allocations and host reads left out), taking
one launch per operation (``mixed`` counted as on a device with bf16 units, one launch per
bf16 product; ``mixed-bf16x3`` and the capturable split rows along the CUDA code path of
:func:`spectra_lab.bench.live_bytes.gpu_code_path`, a split product one launch). For
``polar-bf16x3`` the CPU emulates each bf16 product with two float32 conversions and a
float32 product, where a GPU runs one product: two launches per product are taken off. The
paper's wrapper adds 6 launches per matrix (clone, recovery of the direction, update), counted
by hand; ``torch-muon``'s are those of one ``torch.optim.Muon`` step on one matrix, times the
hidden matrices.
"""

from __future__ import annotations

import argparse
import functools
import math
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spectra.ops import _common, mixed, soft_clip, soft_clip_paper
from spectra.ops.mixed import exact_steps
from spectra.ops.polar import (
    CAPTURABLE_SPLIT_PARTS,
    POLAR_MAX_ALPHA,
    POLAR_SPLIT_MAX_ALPHA,
    POLAR_TOL,
)
from spectra.ops.quintics import inverse_sqrt_schedule
from spectra.optim.baselines.dmuon import MUON_MAX_DIM
from spectra_lab.bench.flops import matmul_flops, mixed_flops, mixed_split_flops
from spectra_lab.bench.optim import llama_shapes
from spectra_lab.bench.tables import markdown_table

PEAK_TFLOPS = {"bf16": 989.0, "tf32": 495.0, "fp32": 67.0, "fp64": 67.0}
WRAPPER_LAUNCHES = 6  # the paper wrapper's clone, recovery and update, per matrix
MUON_STEPS = 5  # torch.optim.Muon's Newton–Schulz steps (its default ns_steps)
#: Operations that launch no kernel: allocations, autograd bookkeeping, the host read of α.
NO_KERNEL = ("empty", "empty_like", "empty_strided", "detach", "lift_fresh", "_local_scalar_dense")
#: Presets' (layers, d_model, SwiGLU hidden, vocabulary), from spectra_lab.model.llama.
MODELS = {"124m": (12, 768, 2048, 50304), "780m": (32, 1280, 3584, 50304)}


def matrices(layers: int, dim: int, hidden: int, vocab: int) -> list[tuple[int, int]]:
    """The clipped matrices as ``(m, n)`` with ``m ≤ n`` (every 2-D parameter)."""
    out = []
    for s in llama_shapes(layers, dim, hidden, vocab):
        if len(s) == 2:
            out.append((min(s), max(s)))
    return out


class _KernelCounter(TorchDispatchMode):
    """Counts the dispatched aten operations that compute, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NO_KERNEL:
            self.ops[name] = self.ops.get(name, 0) + 1
        return out


@functools.cache
def count_kernels(method: str, sigma_over_c: float, shape: tuple[int, int] = (32, 64)) -> int:
    """Kernel launches of one call of ``method`` (``paper``, ``polar``, ``polar-bf16x3``) on a
    batch whose largest σ/c is ``sigma_over_c`` (a rank-one spike, for which the α bound is
    exact, plus a small bulk), counted on the CPU."""
    gen = torch.Generator().manual_seed(0)
    X = 1e-3 * torch.randn(2, *shape, generator=gen)
    X[:, 0, 0] += sigma_over_c
    calls = {
        "paper": lambda: soft_clip_paper(X[0], 1.0, dtype=torch.float32),
        "polar": lambda: soft_clip(X, 1.0, method="polar"),
        "polar-bf16x3": lambda: soft_clip(X, 1.0, method="polar", ns_dtype=torch.bfloat16),
        "mixed": lambda: soft_clip(X, 1.0, method="mixed"),
        "mixed-bf16x3": lambda: soft_clip(X, 1.0, method="mixed", ns_dtype=torch.bfloat16),
        **{
            name: functools.partial(soft_clip, X, 1.0, method="mixed", capturable=True, **kw)
            for name, kw in CAPTURABLE_ROWS.items()
        },
    }
    if method not in calls:
        raise ValueError(f"no kernel count for {method!r}")
    if method in GPU_PATH_ROWS:  # the CUDA code path: a split product is one launch
        from spectra_lab.bench.live_bytes import gpu_code_path

        with gpu_code_path(), _KernelCounter() as counter:
            calls[method]()
        return sum(counter.ops.values())
    # bf16 products as on a device with bf16 units (one launch each), whatever this CPU has
    with (
        _KernelCounter() as counter,
        mock.patch.object(_common, "has_bf16_units", _yes),
        mock.patch.object(mixed, "has_bf16_units", _yes),
    ):
        calls[method]()
    total = sum(counter.ops.values())
    if method == "polar-bf16x3":  # emulated bf16 products: two conversions each on the CPU
        total -= 2 * (counter.ops.get("mm", 0) + counter.ops.get("bmm", 0))
    return total


def _yes(device: torch.device) -> bool:
    return True


@functools.cache
def muon_launches(shape: tuple[int, int] = (32, 64)) -> int:
    """Kernel launches of one ``torch.optim.Muon`` step on one matrix (its state made by a first
    step), counted on the CPU."""
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(shape, generator=gen, requires_grad=True)
    p.grad = torch.randn(shape, generator=gen)
    opt = torch.optim.Muon([p], lr=0.02, momentum=0.95)
    opt.step()
    with _KernelCounter() as counter:
        opt.step()
    return sum(counter.ops.values())


#: The capturable rows: their keywords of ``soft_clip(method="mixed", capturable=True)``
CAPTURABLE_ROWS = {
    "mixed-capturable": {},
    "mixed-capturable-bf16x6": {"ns_dtype": torch.bfloat16},
    "mixed-capturable-bf16x3-r100": {"ns_dtype": torch.bfloat16, "ratio_bound": 100.0},
}


#: The rows counted along the CUDA code path (:func:`count_kernels`): the split ``mixed`` ones
GPU_PATH_ROWS = ("mixed-bf16x3", "mixed-capturable-bf16x6", "mixed-capturable-bf16x3-r100")


def capturable_schedule(name: str) -> tuple[int, int, int]:
    """``(steps, exact steps, split parts)`` of a capturable row: the schedule for the largest
    α its precision resolves, or its ratio bound's (0 parts: float32 products)."""
    kw = CAPTURABLE_ROWS[name]
    parts = 0 if "ns_dtype" not in kw else 2 if "ratio_bound" in kw else CAPTURABLE_SPLIT_PARTS
    alpha = POLAR_MAX_ALPHA[torch.float32]
    if "ratio_bound" in kw:
        alpha = min(1.0 + kw["ratio_bound"] ** 2, POLAR_MAX_ALPHA[torch.bfloat16])
    coeffs = inverse_sqrt_schedule(1.0 / math.sqrt(alpha), POLAR_TOL)
    return len(coeffs), exact_steps(coeffs, 1.0 / math.sqrt(alpha)), parts


def _capturable_rows(mats: list[tuple[int, int]], sigma_over_c: float) -> list[tuple]:
    """The rows of :data:`CAPTURABLE_ROWS` (the bounded one only within its bound)."""
    rows = []
    batches = len(set(mats))
    for name, kw in CAPTURABLE_ROWS.items():
        if sigma_over_c > kw.get("ratio_bound", math.inf):
            continue
        steps, exact, parts = capturable_schedule(name)
        launches = batches * count_kernels(name, sigma_over_c)
        if parts:
            flops = sum(mixed_split_flops(s, steps, exact, parts) for s in mats)
            rows.append((name, flops, launches, PEAK_TFLOPS["bf16"], steps))
        else:
            pairs = [mixed_flops(s, steps, exact) for s in mats]
            flops = tuple(sum(f) for f in zip(*pairs, strict=True))
            peaks = (PEAK_TFLOPS["fp32"], PEAK_TFLOPS["bf16"])
            rows.append((name, flops, launches, peaks, steps))
    return rows


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
    paper_l = (count_kernels("paper", sigma_over_c) + WRAPPER_LAUNCHES) * len(mats)
    polar_f = sum(matmul_flops("polar", (m, n), steps) for m, n in mats)
    batches = len(set(mats))
    polar_l = batches * count_kernels("polar", sigma_over_c)
    rows = [
        ("paper-bf16", paper_f, paper_l, PEAK_TFLOPS["bf16"]),
        ("polar-fp32", polar_f, polar_l, PEAK_TFLOPS["fp32"]),
    ]
    if 1.0 + sigma_over_c**2 <= POLAR_SPLIT_MAX_ALPHA:
        split_l = batches * count_kernels("polar-bf16x3", sigma_over_c)
        split_f = sum(matmul_flops("polar-split", (m, n), steps) for m, n in mats)
        rows.append(("polar-bf16x3", split_f, split_l, PEAK_TFLOPS["bf16"]))
    alpha = 1.0 + sigma_over_c**2
    coeffs = inverse_sqrt_schedule(1.0 / math.sqrt(alpha), POLAR_TOL)
    exact = exact_steps(coeffs, 1.0 / math.sqrt(alpha))
    full, half = (
        sum(f) for f in zip(*(mixed_flops((m, n), steps, exact) for m, n in mats), strict=True)
    )
    mixed_l = batches * count_kernels("mixed", sigma_over_c)
    rows.append(("mixed", (full, half), mixed_l, (PEAK_TFLOPS["fp32"], PEAK_TFLOPS["bf16"])))
    if alpha <= POLAR_SPLIT_MAX_ALPHA:
        split_f = sum(mixed_split_flops((m, n), steps, exact) for m, n in mats)
        split_l = batches * count_kernels("mixed-bf16x3", sigma_over_c)
        rows.append(("mixed-bf16x3", split_f, split_l, PEAK_TFLOPS["bf16"]))
    hidden = [(m, n) for m, n in mats if n < MUON_MAX_DIM]
    muon_f = sum(matmul_flops("orth", (m, n), MUON_STEPS) for m, n in hidden)
    rows.append(("torch-muon", muon_f, len(hidden) * muon_launches(), PEAK_TFLOPS["bf16"]))
    capturable = _capturable_rows(mats, sigma_over_c)
    rows += [row[:4] for row in capturable]
    out = {}
    for name, flops, launches, peak in rows:
        parts = zip(flops, peak, strict=True) if isinstance(flops, tuple) else [(flops, peak)]
        t_math = sum(f / (efficiency * p * 1e12) for f, p in parts) * 1e3
        flops = sum(flops) if isinstance(flops, tuple) else flops
        t_launch = launches * t_launch_us * 1e-3
        out[name] = {
            "gflop": flops / 1e9,
            "launches": launches,
            "ms_math": t_math,
            "ms_launch": t_launch,
            "ms": t_math + t_launch,
        }
    for name in out:
        if name.startswith(("polar", "mixed")):
            out[name]["steps"] = steps
    out["torch-muon"]["steps"] = MUON_STEPS
    for name, *_, row_steps in capturable:
        out[name]["steps"] = row_steps
    return out


def table(sigmas: tuple[float, ...], efficiency: float, t_launch_us: float) -> str:
    return format_report(report(sigmas, efficiency, t_launch_us))


def format_report(data: dict) -> str:
    """The Markdown table of a :func:`report` (also of one read back from ``--json``)."""
    rows = []
    for r in data["rows"]:
        label = f"{r['method']} (K={r['steps']})" if "steps" in r else r["method"]
        ms = f"{r['ms']:.1f} ({r['ms_math']:.1f} + {r['ms_launch']:.1f})"
        rows.append([r["model"], f"{r['sigma_over_c']:g}", label, f"{r['gflop']:.0f}",
                     f"{r['launches']:.0f}", ms, f"{r['vs_paper_bf16']:.2f}"])  # fmt: skip
    head = ["model", "σ_max/c", "method", "GFLOP", "launches", "ms (math + launch)"]
    title = (
        f"H100 SXM model (not measured): efficiency {data['efficiency']:.0%} of peak, "
        f"{data['launch_us']:g} µs per launch"
    )
    return f"{title}\n\n" + markdown_table([*head, "÷ paper bf16"], rows, "lrlrrrr")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sigma-over-c", type=float, nargs="+", default=[10.0, 30.0, 300.0], help="σ_max/c"
    )
    parser.add_argument("--efficiency", type=float, default=0.6, help="fraction of peak")
    parser.add_argument("--launch-us", type=float, default=8.0, help="µs per kernel launch")
    parser.add_argument("--json", default=None, help="also write the modelled rows to this file")


def report(sigmas: tuple[float, ...], efficiency: float, t_launch_us: float) -> dict:
    """The model's assumptions and one row per model, σ_max/c and method (what ``--json``
    writes; :func:`table` prints the same rows)."""
    rows = []
    for model in MODELS:
        for s in sigmas:
            modelled = step_model(model, s, efficiency, t_launch_us)
            ref = modelled["paper-bf16"]["ms"]
            for name, r in modelled.items():
                rows.append({"model": model, "sigma_over_c": s, "method": name, **r,
                             "vs_paper_bf16": r["ms"] / ref})  # fmt: skip
    return {
        "what": "H100 SXM flop and launch model of soft clipping (not a measurement)",
        "peak_tflops": PEAK_TFLOPS,
        "efficiency": efficiency,
        "launch_us": t_launch_us,
        "torch": torch.__version__,
        "rows": rows,
    }


def run(args: argparse.Namespace) -> int:
    from spectra.validate import check_number
    from spectra_lab.errors import CLIError

    try:
        for s in args.sigma_over_c:
            check_number("--sigma-over-c", s, low=0.0)
        check_number("--efficiency", args.efficiency, low=0.0, high=1.0, low_open=True)
        check_number("--launch-us", args.launch_us, low=0.0)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    print(table(tuple(args.sigma_over_c), args.efficiency, args.launch_us), end="")
    if args.json:
        import json

        from spectra_lab.files import atomic_write

        data = report(tuple(args.sigma_over_c), args.efficiency, args.launch_us)
        atomic_write(args.json, json.dumps(data, indent=2))
    return 0
