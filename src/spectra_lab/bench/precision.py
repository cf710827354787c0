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
    or ``"emulated"`` (through float32, :func:`spectra.ops._common.bf16_matmul`); where
    ``SPECTRA_CPU_BF16_UNITS`` overrides the probe, what the operators were told and what the
    CPU has, e.g. ``"emulated (SPECTRA_CPU_BF16_UNITS=0; the CPU has AVX-512 BF16)"``."""
    from spectra.ops import _common

    cpu = getattr(torch, "cpu", None)
    if bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)()):
        units = "AMX"
    elif bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()):
        units = "AVX-512 BF16"
    else:
        units = None
    told = _common.CPU_HAS_BF16_UNITS
    if told == (units is not None):
        return f"native ({units})" if units else "emulated"
    env = f"{_common.CPU_BF16_ENV}={int(told)}"
    return (
        f"native ({env}; the CPU has no bf16 units)"
        if told
        else (f"emulated ({env}; the CPU has {units})")
    )


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
