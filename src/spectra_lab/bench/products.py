"""``spectra bench products``: the rate of each kind of matrix product the soft clip runs.

A soft clip by ``"mixed"`` or ``"polar"`` is a chain of batched products of float32 matrices,
formed in one of several ways (:mod:`spectra.ops._common`). This benchmark times each way on
the same batched operands ``A (B, m, k)`` and ``B (B, k, n)``, so that a GPU run says what a
product costs in each form, apart from the rest of the step:

============== ==================================================================================
kind           what runs
============== ==================================================================================
``fp32``       ``torch.bmm`` of the float32 operands (IEEE float32; TF32 with ``--tf32``)
``bf16``       ``bf16_matmul`` of bf16 copies of them: bf16 result, float32 sums (the copies are
               made before the clock starts)
``bf16-fp32``  ``bf16_products_fp32`` of the same copies: one product with a float32 result
               (``out_dtype=torch.float32`` on CUDA)
``split``      ``split_bf16_matmul`` of the float32 operands: their bf16 parts and three bf16
               products in one, float32 result (about 1e-5 relative error)
``split-gram`` ``split_bf16_gram`` of A: ``AAᵀ`` from two bf16 products (``n`` is ``m`` here)
============== ==================================================================================

Each row gives the median time over ``--repeats`` calls, the rate in TFLOP/s of the product's
own flops (``2·B·m·k·n``; ``2·B·m²·k`` for the Gram matrix, whatever the kind spends on its
bf16 parts) and the time over ``fp32``'s for the same shape. On a CPU without bf16 units
the bf16 kinds are emulated through float32 (as the operators run them there), so their rates
describe the emulation; the report records the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from spectra.ops._common import bf16_matmul, bf16_products_fp32, split_bf16_gram, split_bf16_matmul
from spectra_lab.bench.precision import add_tf32_argument, apply_tf32
from spectra_lab.errors import CLIError

#: The kinds of product, in the order they are timed
KINDS = ("fp32", "bf16", "bf16-fp32", "split", "split-gram")

#: ``B×m×k×n`` of the clip's batched products at the paper's shapes: the m × m steps and the
#: Gram matrix of a 768 × 2048 MLP matrix at 124M, the same at 780M (width 1280, SwiGLU 3584)
DEFAULT_SHAPES = ("16x768x768x768", "8x768x2048x768", "8x1280x1280x1280", "4x1280x3584x1280")


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """``"B×m×k×n"`` (``x`` or ``×``) as four positive integers; ArgumentTypeError otherwise."""
    parts = text.replace("×", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            "a shape is BxMxKxN, four positive integers (batch, rows, inner, columns), "
            f"got {text!r}"
        )
    return shape  # type: ignore[return-value]


def product_flops(kind: str, shape: tuple[int, int, int, int]) -> int:
    """The product's own flops: ``2·B·m·k·n``, or ``2·B·m²·k`` for ``split-gram``."""
    b, m, k, n = shape
    return 2 * b * m * k * (m if kind == "split-gram" else n)


def operations(A: Tensor, B: Tensor) -> dict[str, Callable[[], Tensor]]:
    """Each kind of :data:`KINDS` as a call on the float32 batches A and B."""
    A16, B16 = A.to(torch.bfloat16), B.to(torch.bfloat16)
    return {
        "fp32": lambda: torch.bmm(A, B),
        "bf16": lambda: bf16_matmul(A16, B16),
        "bf16-fp32": lambda: bf16_products_fp32(A16, B16),
        "split": lambda: split_bf16_matmul(A, B),
        "split-gram": lambda: split_bf16_gram(A),
    }


def time_call(fn: Callable[[], Tensor], device: torch.device, repeats: int) -> float:
    """The median seconds of ``repeats`` calls of ``fn`` after one untimed call, each timed
    from a synchronised device to a synchronised device."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(
    shapes: list[tuple[int, int, int, int]],
    kinds: tuple[str, ...],
    device: torch.device,
    repeats: int,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per shape and kind: median ms, TFLOP/s and the time over ``fp32``'s (when
    ``fp32`` is among ``kinds``)."""
    rows = []
    gen = torch.Generator().manual_seed(seed)
    for shape in shapes:
        b, m, k, n = shape
        A = torch.randn(b, m, k, generator=gen).to(device)
        B = torch.randn(b, k, n, generator=gen).to(device)
        calls = operations(A, B)
        seconds = {kind: time_call(calls[kind], device, repeats) for kind in kinds}
        for kind in kinds:
            rows.append({
                "shape": "x".join(map(str, shape)), "kind": kind,
                "ms": 1e3 * seconds[kind],
                "tflops": product_flops(kind, shape) / seconds[kind] / 1e12,
                "vs_fp32": seconds[kind] / seconds["fp32"] if "fp32" in seconds else None,
            })  # fmt: skip
        del A, B, calls
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of :func:`measure`'s rows."""
    lines = ["| B×m×k×n | kind | ms | TFLOP/s | × fp32 |", "|---|---|---:|---:|---:|"]
    for r in rows:
        vs = "–" if r["vs_fp32"] is None else f"{r['vs_fp32']:.2f}"
        lines.append(f"| {r['shape']} | {r['kind']} | {r['ms']:.3f} | {r['tflops']:.3g} | {vs} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--shapes", nargs="+", type=parse_shape, default=None, metavar="BxMxKxN",
        help=f"batched product shapes (default: {' '.join(DEFAULT_SHAPES)})",
    )  # fmt: skip
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS), help="subset")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per cell (median)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if any)")
    add_tf32_argument(parser)
    parser.add_argument("--json", default=None, help="also write the rows to this file")


def run(args: argparse.Namespace) -> int:
    from spectra.validate import check_int

    try:
        check_int("--repeats", args.repeats, low=1)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {name}: CUDA is not available")
    device = torch.device(name)
    apply_tf32(args)
    shapes = args.shapes or [parse_shape(s) for s in DEFAULT_SHAPES]
    rows = measure(shapes, tuple(args.kinds), device, args.repeats)
    print(format_table(rows))
    if args.json:
        from spectra_lab.files import write_json_atomic
        from spectra_lab.machine import device_about

        report = {"repeats": args.repeats, "machine": device_about(device), "rows": rows}
        write_json_atomic(args.json, report)
    return 0
