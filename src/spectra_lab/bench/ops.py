"""``spectra bench ops``: time and accuracy of the spectral operators side by side.

Inputs are synthetic (Adam-like with a spike at σ = 10³·c, sign-like, Gaussian, at the
paper's 124M shapes) and recorded: the AdamW, Signum and AdEMAMix update directions of real
``cpu-small`` runs (:mod:`spectra_lab.bench.matrices`), where σ_max/c is what training
produces. For every input and dtype each method runs on the same matrix; the table reports
the median time over repeats, the ratios to the paper's Algorithm 1 (N_s = 10) in bfloat16
and in float32 measured in the same cell, and the relative Frobenius error against the float64
SVD of the same (dtype-rounded) input. A summary gives each method's median ratios and worst
error, and ``--plot`` draws error against time.

``--sizes N …`` times the same methods on square ``N × N`` synthetic inputs instead (default
kind ``adam_spike``), for the runtime-against-matrix-size comparison of soft spectral clipping
(the paper's Algorithm 1, N_s = 10) with orthogonalization (Muon's 5 Newton–Schulz steps);
``--plot-sizes`` draws median time against N on log-log axes.

This module runs and times the methods; the inputs are in :mod:`spectra_lab.bench.matrices`,
the flop counts (``--paper-bf16 auto``, ``--flops``) in :mod:`spectra_lab.bench.flops`, and
the tables and figures of the cells in :mod:`spectra_lab.bench.ops_report`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict

import torch
from torch import Tensor

from spectra.ops import orthogonalize, soft_clip
from spectra.ops._common import single_thread_lapack
from spectra.validate import check_int, check_number
from spectra_lab.bench.flops import flop_table, matmul_flops
from spectra_lab.bench.matrices import (
    CLIP_C,
    DTYPES,
    INPUTS,
    QUICK_SHAPES,
    SHAPES,
    recorded_inputs,
    square_shapes,
    synthetic_inputs,
)
from spectra_lab.bench.ops_report import (
    Cell,
    pareto_plot,
    sizes_plot,
    sizes_table,
    summary,
    terminal_report,
    to_markdown,
)
from spectra_lab.bench.precision import add_tf32_argument, apply_tf32
from spectra_lab.files import atomic_write
from spectra_lab.machine import device_about

#: The synthetic kind of ``--sizes`` when ``--inputs`` names none.
SIZES_INPUT = "adam_spike"
#: ``--paper-bf16 auto`` runs the paper's bf16 method on a matrix only when its estimated
#: time (its flops at the measured bf16 matmul rate of the device) fits the cell budget.
PAPER_BF16_MODES = ("auto", "always", "never")


def references(X: Tensor, c: float) -> dict[str, Tensor]:
    """``H_c(X)`` and ``UVᵀ`` from one float64 SVD of X."""
    with single_thread_lapack(X.device):
        U, S, Vh = torch.linalg.svd(X.to(torch.float64), full_matrices=False)
    soft = (U * (S / torch.sqrt(1.0 + (S / c) ** 2)).unsqueeze(-2)) @ Vh
    return {"soft": soft, "orth": U @ Vh, "sigma": S.reshape(-1, S.shape[-1])}


def rel_err(Y: Tensor, ref: Tensor) -> float:
    diff = torch.linalg.vector_norm(Y.to(torch.float64) - ref)
    return float(diff / torch.linalg.vector_norm(ref).clamp_min(1e-300))


def methods(c: float) -> dict[str, tuple[str, Callable[[Tensor], Tensor]]]:
    """name -> (which reference it is compared with, function)."""
    return {
        "auto": ("soft", lambda X: soft_clip(X, c)),
        "eigh": ("soft", lambda X: soft_clip(X, c, method="eigh")),
        "eigh64": ("soft", lambda X: soft_clip(X, c, method="eigh", ns_dtype=torch.float64)),
        "polar": ("soft", lambda X: soft_clip(X, c, method="polar")),
        "mixed": ("soft", lambda X: soft_clip(X, c, method="mixed")),
        "mixed_bf16": (
            "soft",
            lambda X: soft_clip(X, c, method="mixed", ns_dtype=torch.bfloat16),
        ),
        "mixed_fp32": ("soft", lambda X: soft_clip(X, c, method="mixed", ns_dtype=torch.float32)),
        "polar_bf16": (
            "soft",
            lambda X: soft_clip(X, c, method="polar", ns_dtype=torch.bfloat16),
        ),
        "paper_bf16": (
            "soft",
            lambda X: soft_clip(X, c, method="paper", ns_dtype=torch.bfloat16),
        ),
        "paper_fp32": ("soft", lambda X: soft_clip(X, c, method="paper", ns_dtype=torch.float32)),
        "svd": ("soft", lambda X: soft_clip(X, c, method="svd")),
        "orth_muon": ("orth", lambda X: orthogonalize(X, method="muon")),
        "orth_muon_fp32": (
            "orth",
            lambda X: orthogonalize(X, method="muon", ns_dtype=torch.float32),
        ),
        "orth_polar_express": ("orth", lambda X: orthogonalize(X, method="polar_express")),
    }


def matmul_rate(dtype: torch.dtype, device: torch.device, size: int = 512) -> float:
    """Measured flop/s of one ``size``-cubed matrix product in ``dtype`` (median of 9, after
    two untimed ones: a single small product is at the mercy of a shared machine).

    bf16 is timed as the operators multiply it (:func:`spectra.ops._common.bf16_matmul`:
    emulated through float32 on CPUs without bf16 units).
    """
    from spectra.ops._common import bf16_matmul

    mm = bf16_matmul if dtype == torch.bfloat16 else torch.matmul
    A = torch.randn(size, size, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    mm(A, A)
    mm(A, A)
    times = []
    for _ in range(9):
        sync()
        t0 = time.perf_counter()
        mm(A, A)
        sync()
        times.append(time.perf_counter() - t0)
    return 2 * size**3 / max(statistics.median(times), 1e-9)


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
    inputs: list[tuple[str, str, Tensor]],
    dtypes: dict[str, torch.dtype],
    repeats: int,
    budget_s: float,
    device: torch.device,
    progress: bool = True,
    only: tuple[str, ...] | None = None,
    paper_bf16: str = "auto",
) -> list[Cell]:
    """Every method on every (input, dtype), side by side; see the module docstring."""
    from tqdm import tqdm

    c = CLIP_C
    table = {k: v for k, v in methods(c).items() if only is None or k in only}
    if paper_bf16 == "never":
        table.pop("paper_bf16", None)
    bf16_rate = matmul_rate(torch.bfloat16, device) if "paper_bf16" in table else math.inf
    cells: list[Cell] = []
    bar = tqdm(total=len(inputs) * len(dtypes) * len(table), disable=not progress, desc="ops")
    for shape_name, kind, X64 in inputs:
        for dtype_name, dtype in dtypes.items():
            X = X64.to(dtype).to(device)
            refs = references(X, c)
            sigma_over_c = float(refs["sigma"].max()) / c if refs["sigma"].numel() else 0.0
            row: list[tuple[str, float, int, float]] = []
            for name, (ref_kind, fn) in table.items():
                bar.set_postfix_str(f"{shape_name} {dtype_name} {kind} {name}")
                bar.update()
                if name == "paper_bf16" and paper_bf16 == "auto":
                    estimate = matmul_flops("paper", tuple(X.shape)) / bf16_rate
                    if estimate > budget_s:
                        continue
                Y, t, n = _timed(fn, X, repeats, budget_s)
                row.append((name, t, n, rel_err(Y, refs[ref_kind])))
            times = {name: t for name, t, _, _ in row}
            t_bf16 = times.get("paper_bf16", math.nan)
            t_fp32 = times.get("paper_fp32", math.nan)
            for name, t, n, err in row:
                cells.append(
                    Cell(
                        shape_name, dtype_name, kind, name, 1e3 * t, n,
                        t / t_bf16, t / t_fp32, err, sigma_over_c,
                    )
                )  # fmt: skip
    bar.close()
    return cells


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--shapes",
        nargs="+",
        choices=list(SHAPES),
        default=None,
        help="subset of shapes of the synthetic inputs (default: all)",
    )
    which.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        default=None,
        metavar="N",
        help="time square N x N synthetic inputs of these sizes instead of --shapes "
        f"(input kind: --inputs, default {SIZES_INPUT})",
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=list(DTYPES), default=None, help="input dtypes"
    )
    parser.add_argument(
        "--inputs",
        nargs="+",
        choices=(*INPUTS, "recorded"),
        default=None,
        help="synthetic kinds and/or 'recorded' (directions from real cpu-small runs); "
        "default: all",
    )
    parser.add_argument(
        "--inputs-file", default=None, help="recorded directions (default: the shipped file)"
    )
    parser.add_argument(
        "--budget", type=float, default=20.0, help="stop repeating a cell after this many s"
    )
    parser.add_argument(
        "--methods", nargs="+", choices=list(methods(1.0)), default=None, help="subset"
    )
    parser.add_argument(
        "--paper-bf16",
        choices=PAPER_BF16_MODES,
        default="auto",
        help="run the paper's bf16 method: auto (where its estimated time fits --budget), "
        "always, never",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes (unless --sizes), one repeat"
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if any)")
    add_tf32_argument(parser)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (1 is robust to a busy CPU)"
    )
    parser.add_argument("--out", default=None, help="write the table to FILE (.json or .md)")
    parser.add_argument("--plot", default=None, help="write the error-vs-time figure (.png)")
    parser.add_argument(
        "--plot-sizes",
        default=None,
        metavar="FILE",
        help="with --sizes: write the time-against-size figure (.png, log-log)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--flops", action="store_true", help="print the matmul flop counts only (no timing)"
    )


def _check(args: argparse.Namespace) -> None:
    """Refuse contradictory or out-of-range options in one line (:class:`CLIError`)."""
    from spectra_lab.errors import CLIError

    try:
        check_int("--repeats", args.repeats, low=1)
        check_number("--budget", args.budget, low=0.0, low_open=True)
        check_int("--threads", args.threads, low=1, none_ok=True)
        for n in args.sizes or ():
            check_int("--sizes", n, low=1)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.plot_sizes and not args.sizes:
        raise CLIError("--plot-sizes needs --sizes")
    if args.sizes and args.inputs and "recorded" in args.inputs:
        raise CLIError("--sizes times synthetic inputs only; 'recorded' ones have their own shapes")
    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_name.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {device_name}: CUDA is not available")


def _shapes_and_kinds(args: argparse.Namespace) -> tuple[dict[str, tuple[int, ...]], tuple]:
    """The synthetic shapes and the input kinds (``"recorded"`` among them) of the options."""
    if args.sizes:
        shapes = square_shapes(args.sizes)
    elif args.quick:
        shapes = dict(QUICK_SHAPES)
    else:
        shapes = {n: SHAPES[n] for n in args.shapes or list(SHAPES)}
    default_kinds = (SIZES_INPUT,) if args.sizes else (*INPUTS, "recorded")
    return shapes, tuple(args.inputs or default_kinds)


def _inputs(args: argparse.Namespace, shapes: dict, kinds: tuple) -> list[tuple[str, str, Tensor]]:
    """The synthetic matrices and, when asked for, the recorded directions."""
    from spectra_lab.errors import CLIError

    inputs = synthetic_inputs(shapes, tuple(k for k in kinds if k != "recorded"))
    if "recorded" in kinds:
        try:
            inputs += recorded_inputs(args.inputs_file)
        except FileNotFoundError as exc:
            raise CLIError(str(exc)) from None
    return inputs


def _write(args: argparse.Namespace, cells: list[Cell], header: str, about: dict) -> None:
    """The figures and the ``--out`` file (JSON: ``about`` and the cells; else Markdown)."""
    if args.plot:
        pareto_plot(cells, args.plot)
    if args.plot_sizes:
        device = torch.device(about["device"])
        threads, where = about["threads"], about["device"]
        if device.type == "cuda":
            where += f" ({torch.cuda.get_device_name(device)})"
        note = (
            f"{where}, {threads} thread{'s' if threads > 1 else ''}, median of ≤{about['repeats']}"
        )
        sizes_plot(cells, args.plot_sizes, f"{note} runs, c = {CLIP_C:g}")
    if not args.out:
        return
    if args.out.endswith(".json"):
        keys = ("device", "gpu", "cpu", "cpu_bf16", "float32_matmul_precision", "torch", "threads")
        keys += ("commit", "clip_c", "repeats", "matmul_gflops")
        payload = {**{k: about[k] for k in keys if k in about},
                   "cells": [asdict(cell) for cell in cells]}  # fmt: skip
        atomic_write(args.out, json.dumps(payload, indent=1) + "\n")
    else:
        text = to_markdown(cells) + "\n" + summary(cells)
        atomic_write(
            args.out, header + "\n" + text + ("\n" + sizes_table(cells) if args.sizes else "")
        )


def run(args: argparse.Namespace) -> int:
    """``spectra bench ops``: time the methods, print the tables, write the files asked for."""
    _check(args)
    apply_tf32(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    repeats = 1 if args.quick else args.repeats
    shapes, kinds = _shapes_and_kinds(args)
    dtypes = {n: DTYPES[n] for n in (args.dtypes or list(DTYPES))}
    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device_name)
    if args.flops:
        print(flop_table(shapes, tuple(k for k in kinds if k != "recorded")), end="")
        return 0
    only = tuple(args.methods) if args.methods else None
    cells = run_bench(
        _inputs(args, shapes, kinds), dtypes, repeats, args.budget, device,
        not args.no_progress, only, paper_bf16=args.paper_bf16,
    )  # fmt: skip
    rates = {
        name: matmul_rate(dt, device) / 1e9
        for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32))
    }
    header = (
        f"device={device_name} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"c={CLIP_C} repeats<={repeats} matmul GFLOP/s: bf16 {rates['bf16']:.0f}, "
        f"fp32 {rates['fp32']:.0f}\n"
    )
    print(header + "\n" + terminal_report(cells, sizes=bool(args.sizes)), end="")
    about = {
        "device": device_name, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "clip_c": CLIP_C, "matmul_gflops": rates, "repeats": repeats, **device_about(device),
    }  # fmt: skip
    _write(args, cells, header, about)
    return 0
