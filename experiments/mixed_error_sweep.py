"""Worst error of ``soft_clip(method="mixed")`` against the float64 SVD on random inputs.

Products ``A·B`` of Gaussian matrices (full rank, half rank or a random rank) of random shapes
up to 48×96, float32 or bf16, with ``σ_max/c`` log-uniform in ``[1, 1e5]``; these spread their
spectra over decades, where the bf16 steps' roundings show most. ``--max-bf16-steps`` runs
the sweep with another cap on the bf16 steps (``MIXED_MAX_BF16_STEPS``; 99: no cap)::

    python experiments/mixed_error_sweep.py --cases 400 --seed 5 --max-bf16-steps 99 3 2 1

``--spiked`` prints instead the worst error per σ_max/c on spiked spectra (the inputs of
``tests/test_ops.py``: a bulk log-spaced in ``[1e-3, 1]·c`` with Adam-, sign- or Gaussian-type
singular vectors plus one spike; 48×96, 96×40, 3×32×32, 192×512 and 1×64, float32 and bf16),
the table of ``docs/operators.md``::

    python experiments/mixed_error_sweep.py --spiked
"""

from __future__ import annotations

import argparse
import random

import torch

import spectra.ops.mixed as mixed
from spectra.ops import soft_clip
from spectra_lab.bench.matrices import spiked
from spectra_lab.bench.ops import references, rel_err


def mixed_error(X: torch.Tensor, c: float) -> float:
    """``soft_clip(X, c, method="mixed")``'s relative error against the float64 SVD."""
    return rel_err(soft_clip(X, c, method="mixed"), references(X, c)["soft"])


def cases(count: int, seed: int) -> list[tuple[torch.Tensor, float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        m, n = rng.randint(2, 48), rng.randint(2, 96)
        full = min(m, n)
        rank = rng.choice([full, full, max(1, full // 2), rng.randint(1, full)])
        gen = torch.Generator().manual_seed(rng.randint(0, 2**16))
        A = torch.randn(m, rank, generator=gen, dtype=torch.float64)
        X = (A @ torch.randn(rank, n, generator=gen, dtype=torch.float64)).to(
            rng.choice([torch.float32, torch.bfloat16])
        )
        c = float(torch.linalg.matrix_norm(X.double(), ord=2)) / 10 ** rng.uniform(0, 5)
        out.append((X, c))
    return out


def spiked_table() -> None:
    c = 0.7
    shapes = [(48, 96), (96, 40), (3, 32, 32), (192, 512), (1, 64)]
    print("| σ_max/c | " + " | ".join(f"{s:g}" for s in SPIKES) + " |")
    worst = []
    for spike in SPIKES:
        errors = []
        for shape in shapes:
            for kind in ("adam", "sign", "gauss"):
                for dtype in (torch.float32, torch.bfloat16):
                    errors.append(mixed_error(spiked(shape, c, spike, kind, dtype=dtype), c))
        worst.append(max(errors))
    print("| `mixed` (worst case) | " + " | ".join(f"{e:.1e}" for e in worst) + " |")


SPIKES = (1.0, 10.0, 30.0, 100.0, 1e3, 1e5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--max-bf16-steps", type=int, nargs="+", default=[2])
    parser.add_argument("--spiked", action="store_true", help="the spiked-spectra table")
    args = parser.parse_args(argv)
    if args.spiked:
        spiked_table()
        return 0
    inputs = cases(args.cases, args.seed)
    default = mixed.MIXED_MAX_BF16_STEPS
    try:
        for cap in args.max_bf16_steps:
            mixed.MIXED_MAX_BF16_STEPS = cap
            errors = [mixed_error(X, c) for X, c in inputs]
            over = sum(e > 1e-2 for e in errors)
            print(f"at most {cap} bf16 steps: worst error {max(errors):.2e}, "
                  f"{over} of {len(errors)} above 1e-2")  # fmt: skip
    finally:
        mixed.MIXED_MAX_BF16_STEPS = default
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
