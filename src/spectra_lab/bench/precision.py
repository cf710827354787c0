"""The ``--tf32`` option of the benchmarks and what a report says about its device.

float32 matrix products on CUDA run in full float32 by default; ``--tf32`` lets them use TF32
tensor cores (10-bit mantissa), ``torch.set_float32_matmul_precision("high")``. The setting
and the GPU's name go into the benchmark's report.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch


def add_tf32_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tf32",
        action="store_true",
        help="let float32 matrix products use TF32 tensor cores on CUDA "
        "(torch.set_float32_matmul_precision('high'))",
    )


def apply_tf32(args: argparse.Namespace) -> None:
    """Set the float32 matmul precision the options ask for (full float32 unless ``--tf32``)."""
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")


def cpu_bf16() -> str:
    """How this CPU multiplies bf16 matrices: ``"native (AMX)"``, ``"native (AVX-512 BF16)"``
    or ``"emulated"`` (through float32, :func:`spectra.ops._common.bf16_matmul`)."""
    cpu = getattr(torch, "cpu", None)
    if bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)()):
        return "native (AMX)"
    if bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()):
        return "native (AVX-512 BF16)"
    return "emulated"


def device_about(device: torch.device | str) -> dict[str, Any]:
    """The GPU's name (``None`` on the CPU) or the CPU's bf16 support, and the float32 matmul
    precision in force."""
    device = torch.device(device)
    about = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    if device.type == "cpu":
        about["cpu_bf16"] = cpu_bf16()
    return about
