"""``spectra bench ops``: time and accuracy of the spectral operators side by side.

For every shape, input dtype and input kind, each method runs on the same matrix; the table
reports the median time over repeats, the ratio to the paper's Algorithm 1 (N_s = 10, float32
working precision) measured in the same cell, and the relative Frobenius error against the
float64 SVD of the same (dtype-rounded) input.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from spectra.ops import orthogonalize, soft_clip
from spectra.ops._common import single_thread_lapack
from spectra.ops.spectral import polar_steps
from spectra.validate import check_int, check_number
from spectra_lab.files import atomic_write

SHAPES: dict[str, tuple[int, ...]] = {
    "768x768": (768, 768),
    "768x3072": (768, 3072),
    "2048x2048": (2048, 2048),
    "8x512x512": (8, 512, 512),
}
QUICK_SHAPES: dict[str, tuple[int, ...]] = {"48x80": (48, 80), "2x32x24": (2, 32, 24)}
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
INPUTS = ("adam_spike", "sign", "gauss")
CLIP_C = 10.0  # the paper's recommended threshold for unit-RMS updates
SPIKE_OVER_C = 1e3  # σ_spike/c of the Adam-like input: the hardest case of the accuracy target


@dataclass
class Cell:
    shape: str
    dtype: str
    input: str
    method: str
    time_ms: float
    runs: int
    vs_paper_fp32: float
    rel_err: float


def make_input(kind: str, shape: tuple[int, ...], seed: int = 0) -> Tensor:
    """A float64 test matrix (batch): Adam-like update with a rank-one spike, sign-like, Gaussian.

    Entries have unit RMS. The Adam-like update is ``g/√v`` with ``v`` an independent
    exponential average of squared gradients (heavy-tailed entries), plus a rank-one spike of
    spectral norm ``SPIKE_OVER_C·CLIP_C``.
    """
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    if kind == "gauss":
        return g
    if kind == "sign":
        return torch.sign(g)
    if kind != "adam_spike":
        raise ValueError(f"unknown input kind {kind!r}")
    z = torch.randn(shape, generator=gen, dtype=torch.float64)
    v = 0.9 * z * z + 0.1 * g * g
    X = g / (v.sqrt() + 1e-3)
    X = X / X.pow(2).mean(dim=(-2, -1), keepdim=True).sqrt()
    u = torch.randn((*shape[:-1], 1), generator=gen, dtype=torch.float64)
    w = torch.randn((*shape[:-2], 1, shape[-1]), generator=gen, dtype=torch.float64)
    u = u / torch.linalg.vector_norm(u, dim=-2, keepdim=True)
    w = w / torch.linalg.vector_norm(w, dim=-1, keepdim=True)
    return X + SPIKE_OVER_C * CLIP_C * (u @ w)


def references(X: Tensor, c: float) -> dict[str, Tensor]:
    """``H_c(X)`` and ``UVᵀ`` from one float64 SVD of X."""
    with single_thread_lapack(X.device):
        U, S, Vh = torch.linalg.svd(X.to(torch.float64), full_matrices=False)
    soft = (U * (S / torch.sqrt(1.0 + (S / c) ** 2)).unsqueeze(-2)) @ Vh
    return {"soft": soft, "orth": U @ Vh}


def rel_err(Y: Tensor, ref: Tensor) -> float:
    diff = torch.linalg.vector_norm(Y.to(torch.float64) - ref)
    return float(diff / torch.linalg.vector_norm(ref).clamp_min(1e-300))


def methods(c: float) -> dict[str, tuple[str, Callable[[Tensor], Tensor]]]:
    """name -> (which reference it is compared with, function)."""
    return {
        "auto": ("soft", lambda X: soft_clip(X, c)),
        "polar": ("soft", lambda X: soft_clip(X, c, method="polar")),
        "paper_fp32": ("soft", lambda X: soft_clip(X, c, method="paper", ns_dtype=torch.float32)),
        "paper_bf16": (
            "soft",
            lambda X: soft_clip(X, c, method="paper", ns_dtype=torch.bfloat16),
        ),
        "eigh": ("soft", lambda X: soft_clip(X, c, method="eigh")),
        "svd": ("soft", lambda X: soft_clip(X, c, method="svd")),
        "orth_muon": ("orth", lambda X: orthogonalize(X, method="muon")),
        "orth_polar_express": ("orth", lambda X: orthogonalize(X, method="polar_express")),
    }


def _timed(fn: Callable[[Tensor], Tensor], X: Tensor, repeats: int, budget_s: float):
    sync = torch.cuda.synchronize if X.device.type == "cuda" else (lambda: None)
    if X.device.type == "cuda":
        fn(X)  # warm-up: kernels, workspace
        sync()
    times: list[float] = []
    out = None
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn(X)
        sync()
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s:
            break
    return out, statistics.median(times), len(times)


def run_bench(
    shapes: dict[str, tuple[int, ...]],
    dtypes: dict[str, torch.dtype],
    inputs: tuple[str, ...],
    repeats: int,
    budget_s: float,
    device: torch.device,
    progress: bool = True,
    only: tuple[str, ...] | None = None,
) -> list[Cell]:
    from tqdm import tqdm

    c = CLIP_C
    table = {k: v for k, v in methods(c).items() if only is None or k in only}
    cells: list[Cell] = []
    jobs = [(s, d, k) for s in shapes for d in dtypes for k in inputs]
    bar = tqdm(total=len(jobs) * len(table), disable=not progress, desc="bench ops")
    for shape_name, dtype_name, kind in jobs:
        X = make_input(kind, shapes[shape_name]).to(DTYPES[dtype_name]).to(device)
        refs = references(X, c)
        row: list[tuple[str, float, int, float]] = []
        for name, (ref_kind, fn) in table.items():
            bar.set_postfix_str(f"{shape_name} {dtype_name} {kind} {name}")
            Y, t, n = _timed(fn, X, repeats, budget_s)
            row.append((name, t, n, rel_err(Y, refs[ref_kind])))
            bar.update()
        t_paper = next((t for name, t, _, _ in row if name == "paper_fp32"), math.nan)
        for name, t, n, err in row:
            cells.append(Cell(shape_name, dtype_name, kind, name, 1e3 * t, n, t / t_paper, err))
    bar.close()
    return cells


def to_markdown(cells: list[Cell]) -> str:
    """One line per (shape, dtype, input); each method's cell is ``ms (×paper_fp32) err``."""
    names = list(dict.fromkeys(cell.method for cell in cells))
    head = "| shape | dtype | input | " + " | ".join(names) + " |"
    sep = "|" + "---|" * (3 + len(names))
    lines = [head, sep]
    groups: dict[tuple[str, str, str], dict[str, Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.shape, cell.dtype, cell.input), {})[cell.method] = cell
    for (shape, dtype, kind), by_name in groups.items():
        parts = []
        for name in names:
            cell = by_name[name]
            parts.append(f"{cell.time_ms:.4g} ms (×{cell.vs_paper_fp32:.2f}) {cell.rel_err:.1e}")
        lines.append(f"| {shape} | {dtype} | {kind} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def matmul_flops(method: str, shape: tuple[int, ...], steps: int = 0, fp64_redo: bool = False):
    """Flops of the matrix products of a matmul-only method (2·m·k·n per product).

    ``paper``: Gram + final product (``2m²n`` each) and 3 products of ``m × m`` per step, 10
    steps. ``polar``: the same two ``m²n`` products, ``G²`` and ``4K − 4`` products for ``K ≥ 1``
    steps (plus the float32 Gram matrix and ``G²`` recomputed in float64 when ``α > 1e5``).
    ``orth``: ``K`` steps of ``XXᵀ``, ``A²`` and ``BX``.
    """
    *batch, m, n = shape
    m, n = min(m, n), max(m, n)
    count = math.prod(batch) if batch else 1
    mn, mm = 2 * m * m * n, 2 * m**3
    if method == "paper":
        total = 2 * mn + 30 * mm
    elif method == "polar":
        total = 2 * mn + mm * (1 + max(0, 4 * steps - 4))
        if fp64_redo:
            total += mn + mm
    elif method == "orth":
        total = steps * (2 * mn + mm)
    else:
        raise ValueError(f"no flop count for {method!r}")
    return count * total


def flop_table(shapes: dict[str, tuple[int, ...]], inputs: tuple[str, ...]) -> str:
    """Markdown table: GFLOP of the matmul-only methods and polar's steps on each input."""
    lines = [
        "| shape | input | polar steps K (precision) | polar GFLOP | paper GFLOP (N_s=10) "
        "| polar/paper | orth 5 steps GFLOP |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape_name, shape in shapes.items():
        for kind in inputs:
            X = make_input(kind, shape).to(torch.float32)
            K, wd = polar_steps(X, CLIP_C)
            redo = wd == torch.float64
            polar = matmul_flops("polar", shape, K, fp64_redo=redo)
            paper = matmul_flops("paper", shape)
            orth = matmul_flops("orth", shape, 5)
            lines.append(
                f"| {shape_name} | {kind} | {K} ({str(wd).removeprefix('torch.')}) "
                f"| {polar / 1e9:.1f} | {paper / 1e9:.1f} | {polar / paper:.2f} "
                f"| {orth / 1e9:.1f} |"
            )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median)")
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=list(SHAPES),
        default=None,
        help="subset of shapes (default: all)",
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=list(DTYPES), default=None, help="input dtypes"
    )
    parser.add_argument("--inputs", nargs="+", choices=INPUTS, default=None, help="input kinds")
    parser.add_argument(
        "--budget", type=float, default=20.0, help="stop repeating a cell after this many s"
    )
    parser.add_argument(
        "--methods", nargs="+", choices=list(methods(1.0)), default=None, help="subset"
    )
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one repeat")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if any)")
    parser.add_argument("--out", default=None, help="write the table to FILE (.json or .md)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--flops", action="store_true", help="print the matmul flop counts only (no timing)"
    )


def run(args: argparse.Namespace) -> int:
    from spectra_lab.cli import CLIError

    try:
        check_int("--repeats", args.repeats, low=1)
        check_number("--budget", args.budget, low=0.0, low_open=True)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.quick:
        shapes, repeats = dict(QUICK_SHAPES), 1
    else:
        names = args.shapes or list(SHAPES)
        shapes, repeats = {n: SHAPES[n] for n in names}, args.repeats
    dtypes = {n: DTYPES[n] for n in (args.dtypes or list(DTYPES))}
    inputs = tuple(args.inputs or INPUTS)
    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_name.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {device_name}: CUDA is not available")
    device = torch.device(device_name)
    if args.flops:
        print(flop_table(shapes, inputs), end="")
        return 0
    only = tuple(args.methods) if args.methods else None
    cells = run_bench(
        shapes, dtypes, inputs, repeats, args.budget, device, not args.no_progress, only
    )
    header = (
        f"device={device_name} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"c={CLIP_C} repeats<={repeats}\n"
    )
    text = to_markdown(cells)
    print(header + "\n" + text, end="")
    if args.out:
        if args.out.endswith(".json"):
            payload = {
                "device": device_name,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "clip_c": CLIP_C,
                "cells": [asdict(cell) for cell in cells],
            }
            atomic_write(args.out, json.dumps(payload, indent=1) + "\n")
        else:
            atomic_write(args.out, header + "\n" + text)
    return 0
