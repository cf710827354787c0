"""``spectra bench dist``: what dividing the spectral work among DDP ranks saves.

For each process count ``N`` of ``--procs``, ``N`` gloo processes on this machine each build the
same Llama preset with the training recipe's optimizer (``spectra-adamw``: the hidden and
attention matrices soft-clipped at ``c = 10``), give it the same gradients (as DDP's all-reduce
leaves them) and time ``optimizer.step()`` with ``split_work`` on and off: median over
``--repeats`` steps after ``--warmup``, measured on rank 0 between barriers. Every process gets
``--threads`` torch threads (default: the cores divided among the processes).

It also prints a model of the communication per step and rank (``--volume``), for the split
under DDP and for FSDP2's assembly of whole matrices, next to the gradient all-reduce DDP does
anyway.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spectra.validate import check_int
from spectra_lab.errors import CLIError

DEFAULT_PROCS = (1, 2, 4)


# --------------------------------------------------------------------------- timing


def _build(preset: str, vocab: int, split: bool):
    from spectra_lab.model import Llama, model_config
    from spectra_lab.train.config import TrainConfig
    from spectra_lab.train.optimizers import build_optimizer

    torch.manual_seed(0)
    model = Llama(model_config(preset, vocab))
    cfg = TrainConfig(preset=preset, optimizer_kwargs={"split_work": split})
    opt = build_optimizer(model, cfg, lambda k: 1.0)
    g = torch.Generator().manual_seed(1)
    for p in model.parameters():
        p.grad = 0.01 * torch.randn(p.shape, generator=g)
    return opt


def _worker(rank: int, world: int, init: str, spec: dict[str, Any], out: str) -> None:
    torch.set_num_threads(spec["threads"])
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        result = {}
        for split in (False, True):
            opt = _build(spec["preset"], spec["vocab"], split)
            times = []
            for k in range(spec["warmup"] + spec["repeats"]):
                dist.barrier()
                t0 = time.perf_counter()
                opt.step()
                dist.barrier()
                if k >= spec["warmup"]:
                    times.append(time.perf_counter() - t0)
            result["split" if split else "unsplit"] = statistics.median(times)
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def time_steps(procs: int, spec: dict[str, Any]) -> dict[str, float]:
    """Median step seconds with and without the split, for ``procs`` gloo processes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        init = f"file://{tmp}/pg"
        mp.spawn(_worker, args=(procs, init, spec, out), nprocs=procs, join=True)
        return json.loads(Path(out).read_text())


# --------------------------------------------------------------------------- volume model


def clipped_and_total(preset: str, vocab: int) -> tuple[int, int]:
    """Elements of the clipped (hidden and attention) matrices, and of all parameters."""
    from spectra_lab.model import Llama, model_config
    from spectra_lab.train.optimizers import DECAY_GROUPS, group_of

    with torch.device("meta"):
        model = Llama(model_config(preset, vocab))
    clipped = total = 0
    for name, p in model.named_parameters():
        total += p.numel()
        if group_of(name, p) in DECAY_GROUPS:
            clipped += p.numel()
    return clipped, total


def volume_model(clipped: int, total: int, n: int, bytes_per: int = 4) -> dict[str, float]:
    r"""Bytes each rank receives per step (ring collectives, large messages).

    * DDP's gradient all-reduce: ``2(N−1)/N · P``.
    * The split under DDP: each clipped matrix is broadcast from its owner, so a rank receives
      the ones it does not own: ``(N−1)/N · M``.
    * FSDP2's assembly: each matrix is all-gathered (``(N−1)/N · M`` received) and its result
      scattered from the owner (``M/N`` received on average), ``M`` in all; FSDP2 itself
      all-gathers the parameters in forward and backward and reduce-scatters the gradients:
      ``3(N−1)/N · P``.

    ``M`` is the clipped matrices' size and ``P`` all parameters'; pre-clipping doubles the
    spectral terms.
    """
    f = (n - 1) / n
    return {
        "ddp_allreduce": 2 * f * total * bytes_per,
        "ddp_split": f * clipped * bytes_per,
        "fsdp2_own": 3 * f * total * bytes_per,
        "fsdp2_spectral": clipped * bytes_per,
    }


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="cpu-small", help="model preset (cpu-small)")
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size (4096)")
    parser.add_argument("--procs", type=int, nargs="+", default=list(DEFAULT_PROCS))
    parser.add_argument("--repeats", type=int, default=5, help="timed steps (5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per process")
    parser.add_argument(
        "--volume",
        nargs="*",
        default=["124m", "780m"],
        help="presets for the communication model (124m 780m)",
    )
    parser.add_argument("--no-timing", action="store_true", help="print the model only")
    parser.add_argument("--json", default=None, help="also write the results to this file")


def run(args: argparse.Namespace) -> int:
    try:
        for n in args.procs:
            check_int("--procs", n, low=1)
        check_int("--repeats", args.repeats, low=1)
        check_int("--warmup", args.warmup, low=0)
        check_int("--threads", args.threads, low=1, none_ok=True)
        check_int("--vocab", args.vocab, low=2)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    report: dict[str, Any] = {"timing": [], "volume": []}
    if not args.no_timing:
        cores = os.cpu_count() or 1
        print(
            f"optimizer step of spectra-adamw on {args.preset}, gloo, median of "
            f"{args.repeats} steps; {cores} cores on this machine"
        )
        print(f"{'procs':>5} {'threads':>7} {'unsplit (s)':>12} {'split (s)':>10} {'ratio':>6}")
        for n in args.procs:
            threads = args.threads or max(1, cores // n)
            spec = {
                "preset": args.preset,
                "vocab": args.vocab,
                "repeats": args.repeats,
                "warmup": args.warmup,
                "threads": threads,
            }
            r = time_steps(n, spec)
            ratio = r["split"] / r["unsplit"]
            print(
                f"{n:>5} {threads:>7} {r['unsplit']:>12.3f} {r['split']:>10.3f} {ratio:>6.2f}",
                flush=True,
            )
            report["timing"].append({"procs": n, "threads": threads, **r, "ratio": ratio})
    if args.volume:
        print("\nMiB received per rank and step (float32; model in spectra_lab.bench.dist)")
        print(
            f"{'preset':>7} {'N':>3} {'DDP grads':>10} {'+ split':>8} {'FSDP2 own':>10} "
            f"{'+ spectral':>10}"
        )
        for preset in args.volume:
            clipped, total = clipped_and_total(preset, 50304)
            for n in (2, 4, 8):
                v = volume_model(clipped, total, n)
                mib = {k: x / 2**20 for k, x in v.items()}
                print(
                    f"{preset:>7} {n:>3} {mib['ddp_allreduce']:>10.0f} {mib['ddp_split']:>8.0f} "
                    f"{mib['fsdp2_own']:>10.0f} {mib['fsdp2_spectral']:>10.0f}"
                )
                report["volume"].append({"preset": preset, "n": n, **v})
    if args.json:
        from spectra_lab.files import atomic_write

        atomic_write(args.json, json.dumps(report, indent=2))
    return 0
