"""What a stored figure says about the machine it was measured on: the GPU's name, or the
CPU's model and how it multiplies bf16 matrices; the torch threads, torch, the float32 matmul
precision and the commit (:func:`device_about`). Every benchmark's report and every training
run's ``run.json`` carry it, so that a figure names its machine.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]


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


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def source_commit() -> str | None:
    """The short commit of the checkout the code runs from (``None`` outside a git checkout),
    or ``SPECTRA_SOURCE_COMMIT`` where set: a copy of a working tree whose ``.git`` is older
    than its files (a remote machine's copy) names the files' commit that way."""
    if os.environ.get("SPECTRA_SOURCE_COMMIT"):
        return os.environ["SPECTRA_SOURCE_COMMIT"]
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                         capture_output=True, check=False).stdout.strip()  # fmt: skip
    return out or None


def device_about(device: torch.device | str) -> dict[str, Any]:
    """The machine a report was measured on: the GPU's name (``None`` on the CPU), or the CPU's
    model and bf16 support; the torch threads, torch, the commit and the float32 matmul
    precision in force."""
    device = torch.device(device)
    about = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "commit": source_commit(),
    }
    if device.type == "cpu":
        about.update(cpu=cpu_model(), cpu_bf16=cpu_bf16())
    return about
