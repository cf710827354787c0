"""The Gram matrix ``G = XXᵀ`` from one triangle of blocks, against one full product.

``G`` is symmetric, so a product over its lower triangle of ``k × k`` row blocks,
``G_ij = X_i X_jᵀ`` for ``j ≤ i`` (the upper blocks are their transposes), does
``(k + 1)/(2k)`` of the full product's ``2m²n`` flops: 3/4 for ``k = 2``, 5/8 for ``k = 4``.
BLAS's ``syrk`` does exactly this, but torch has no such call; the blocks are separate
products, each smaller than the full one. This script times both, side by side in one
process (alternating, medians over ``--rounds``), on batches of the optimizer's shapes, and
checks the blocks agree with the full product::

    python experiments/symmetric_gram.py --json docs/data/symmetric_gram_cpu.json

Written to the JSON: the machine (CPU model, bf16 units, threads, torch), each shape's median
times and ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from spectra.ops._common import CPU_HAS_BF16_UNITS
from spectra_lab.files import write_json_atomic
from spectra_lab.machine import device_about

#: (batch, m, n): the main job's 192×512 and 192×192 matrices, the 124M model's 768² and
#: 768×2048 (as its wide view) matrices, one larger
SHAPES = ((8, 192, 512), (16, 192, 192), (8, 768, 768), (4, 768, 2048), (2, 1024, 4096))


def gram_by_blocks(X: torch.Tensor, k: int) -> torch.Tensor:
    """``X Xᵀ`` from the lower triangle of ``k × k`` row blocks (batched)."""
    m = X.shape[-2]
    bounds = [round(i * m / k) for i in range(k + 1)]
    G = X.new_empty(*X.shape[:-2], m, m)
    for i in range(k):
        Xi = X[..., bounds[i] : bounds[i + 1], :]
        for j in range(i + 1):
            Xj = X[..., bounds[j] : bounds[j + 1], :]
            block = Xi @ Xj.mT
            G[..., bounds[i] : bounds[i + 1], bounds[j] : bounds[j + 1]] = block
            if i != j:
                G[..., bounds[j] : bounds[j + 1], bounds[i] : bounds[i + 1]] = block.mT
    return G


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blocks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        if dtype == torch.bfloat16 and not CPU_HAS_BF16_UNITS:
            print("bfloat16 skipped: this CPU has no bf16 units (its bf16 products are emulated)")
            continue
        for shape in SHAPES:
            X = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
            full = X @ X.mT
            ways = {"full": lambda X=X: X @ X.mT}
            for k in args.blocks:
                ways[f"blocks{k}"] = lambda k=k, X=X: gram_by_blocks(X, k)
                err = (gram_by_blocks(X, k).float() - full.float()).abs().max().item()
                assert err <= 1e-3 * full.float().abs().max().item(), (shape, k, err)
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds + 2):
                for name, fn in ways.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            med = {name: statistics.median(t[2:]) * 1e3 for name, t in times.items()}
            row = {"dtype": dtype_name, "shape": list(shape), "ms": med}
            row["ratio"] = {name: med[name] / med["full"] for name in med}
            rows.append(row)
            cells = "  ".join(f"{n} {v:7.3f} ms ({row['ratio'][n]:.2f}x)" for n, v in med.items())
            print(f"{dtype_name:9s} {shape!s:18s} {cells}")
    about = {
        "machine": device_about("cpu"),
        "rounds": args.rounds,
        "flops_fraction": {f"blocks{k}": (k + 1) / (2 * k) for k in args.blocks},
        "rows": rows,
    }
    if args.json:
        write_json_atomic(args.json, about)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
