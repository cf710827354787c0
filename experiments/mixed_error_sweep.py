"""Worst error of ``soft_clip(method="mixed")`` against the float64 SVD on random inputs.

Products ``A·B`` of Gaussian matrices (full rank, half rank or a random rank) of random shapes
up to 48×96, float32 or bf16, with ``σ_max/c`` log-uniform in ``[1, 1e5]``; these spread their
spectra over decades, where the bf16 steps' roundings show most. ``--max-bf16-steps`` runs
the sweep with another cap on the bf16 steps (``MIXED_MAX_BF16_STEPS``; 99: no cap)::

    python experiments/mixed_error_sweep.py --cases 400 --seed 5 --max-bf16-steps 99 3 2 1

``--spiked`` measures instead, per σ_max/c, ``mixed``'s worst error on spiked spectra (the
inputs of ``tests/test_ops.py``: a bulk log-spaced in ``[1e-3, 1]·c`` with Adam-, sign- or
Gaussian-type singular vectors plus one spike; 48×96, 96×40, 3×32×32, 192×512 and 1×64, float32
and bf16) and the range of the paper's bf16 run's (Algorithm 1, N_s = 10) on the float32
spiked inputs of the routes' tables (64×128, 128×64 and 192×512), and stores them for the table
of ``docs/operators.md`` (``spectra docs`` renders it)::

    python experiments/mixed_error_sweep.py --spiked --json docs/data/mixed_error_spiked.json
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


def spiked_errors() -> dict:
    """Per σ_max/c of :data:`SPIKES`: ``mixed``'s worst error and the paper's bf16 run's
    smallest and largest, over the spiked inputs."""
    from spectra_lab.bench.ops import methods
    from spectra_lab.machine import device_about

    c = 0.7
    shapes = [(48, 96), (96, 40), (3, 32, 32), (192, 512), (1, 64)]
    paper_shapes = [(64, 128), (128, 64), (192, 512)]
    paper = methods(c)["paper_bf16"][1]
    kinds = ("adam", "sign", "gauss")
    rows = []
    for spike in SPIKES:
        ours = [rel_err(soft_clip(X, c, method="mixed"), references(X, c)["soft"])
                for shape in shapes for kind in kinds for dtype in (torch.float32, torch.bfloat16)
                for X in [spiked(shape, c, spike, kind, dtype=dtype)]]  # fmt: skip
        theirs = [rel_err(paper(X), references(X, c)["soft"])
                  for shape in paper_shapes for kind in kinds
                  for X in [spiked(shape, c, spike, kind)]]  # fmt: skip
        rows.append({"sigma_over_c": spike, "mixed_worst": max(ours),
                     "paper_bf16_min": min(theirs), "paper_bf16_max": max(theirs)})  # fmt: skip
    return {"c": c, "shapes": shapes, "paper_shapes": paper_shapes,
            "machine": device_about("cpu"), "rows": rows}  # fmt: skip


SPIKES = (1.0, 10.0, 30.0, 100.0, 1e3, 1e5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--max-bf16-steps", type=int, nargs="+", default=[2])
    parser.add_argument("--spiked", action="store_true", help="the spiked-spectra table")
    parser.add_argument("--json", help="with --spiked: write the measured errors here")
    args = parser.parse_args(argv)
    if args.spiked:
        from spectra_lab.files import write_json_atomic

        report = spiked_errors()
        for r in report["rows"]:
            print(f"σ_max/c {r['sigma_over_c']:g}: mixed ≤ {r['mixed_worst']:.1e}, paper bf16 "
                  f"{r['paper_bf16_min']:.1e}–{r['paper_bf16_max']:.1e}")  # fmt: skip
        if args.json:
            write_json_atomic(args.json, report)
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
