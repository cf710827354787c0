"""The main job's optimizer step at several floors of the matmul-only batches, side by side.

Builds Spectra-AdamW on the main job's model (``cpu-small``) as ``spectra train`` does, takes
one batch's gradients, and steps with each floor in turn (``MATMUL_MIN_BATCH``; 0: batches of
an eighth of the clipped elements alone), printing the median step time of each::

    python experiments/batch_floor_ab.py --floors 0 524288 1048576 --rounds 25
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import spectra.ops.batched as batched
from spectra_lab.bench.step import VOCAB, build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--floors", type=int, nargs="+", default=[0, 2**19, 2**20])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    _, model, model_cfg, optimizer = build("spectra-adamw", "cpu-small", batch_size=16)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (16, model_cfg.seq_len + 1), generator=gen)
    _, loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    grads = [p.grad.clone() for p in params]
    times: dict[int, list[float]] = {f: [] for f in args.floors}
    default = batched.MATMUL_MIN_BATCH
    try:
        for k in range(args.warmup + args.rounds):
            for floor in args.floors:
                batched.MATMUL_MIN_BATCH = floor
                for p, g in zip(params, grads, strict=True):
                    p.grad = g
                t0 = time.perf_counter()
                optimizer.step()
                if k >= args.warmup:
                    times[floor].append(time.perf_counter() - t0)
    finally:
        batched.MATMUL_MIN_BATCH = default
    for floor, ts in times.items():
        print(f"floor {floor:>8}: optimizer step {1e3 * statistics.median(ts):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
