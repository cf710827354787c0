"""The ``--tf32`` option of the benchmarks.

float32 matrix products on CUDA run in full float32 by default; ``--tf32`` lets them use TF32
tensor cores (10-bit mantissa), ``torch.set_float32_matmul_precision("high")``. The setting
goes into every benchmark's report with its machine (:func:`spectra_lab.machine.device_about`).
"""

from __future__ import annotations

import argparse

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
