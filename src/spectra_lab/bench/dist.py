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
from torch.utils._python_dispatch import TorchDispatchMode

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


def _spawn(worker, procs: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Run ``worker(rank, procs, init, spec, out)`` in ``procs`` gloo processes; rank 0's JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        init = f"file://{tmp}/pg"
        mp.spawn(worker, args=(procs, init, spec, out), nprocs=procs, join=True)
        return json.loads(Path(out).read_text())


def time_steps(procs: int, spec: dict[str, Any]) -> dict[str, float]:
    """Median step seconds with and without the split, for ``procs`` gloo processes."""
    return _spawn(_worker, procs, spec)


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


# --------------------------------------------------------------------------- traffic

#: layouts whose optimizer-step traffic ``--traffic`` measures (``2d`` with 4 or more ranks)
LAYOUTS = ("ddp", "fsdp2-whole", "fsdp2-gram", "tp", "2d")


class CollectiveCounter(TorchDispatchMode):
    """Bytes this rank receives through the collectives dispatched while it is active.

    Every ``torch.distributed`` collective, those ``DTensor`` and FSDP2 issue included, reaches
    the dispatcher as a ``c10d`` or ``_c10d_functional`` operator; this mode sees each, reads the
    sizes of its tensors and its process group, and counts what a ring implementation delivers
    to this rank: all-reduce ``2(N−1)/N·S``, reduce ``(N−1)/N·S``, all-gather ``(N−1)/N`` of
    the output, reduce-scatter ``(N−1)/N`` of the input, broadcast and scatter their message on
    every rank but the root. ``calls`` counts the operators by name.
    """

    def __init__(self) -> None:
        super().__init__()
        self.received = 0.0
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace in ("c10d", "_c10d_functional"):
            name = func._opname
            if name not in ("wait_tensor", "_wrap_tensor_autograd", "barrier"):
                self.calls[name] = self.calls.get(name, 0) + 1
                self.received += _received(name, args)
        return out


def _bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_bytes(t) for t in x)
    return 0


def _group(args: tuple) -> tuple[int, int]:
    """``(size, rank)`` of the process group among an operator's arguments."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, torch.ScriptObject):
            a = dist.ProcessGroup.unbox(a)
        if isinstance(a, dist.ProcessGroup):
            return a.size(), a.rank()
        if isinstance(a, str) and a not in ("sum", "avg", "max", "min", "product"):
            try:
                pg = _resolve_process_group(a)
            except (ValueError, RuntimeError, KeyError):
                continue
            return pg.size(), pg.rank()
    raise ValueError("no process group among the collective's arguments")


def _received(name: str, args: tuple) -> float:
    size, rank = _group(args)
    f = (size - 1) / size
    if name in ("allreduce_", "all_reduce", "all_reduce_coalesced"):
        return 2 * f * _bytes(args[0])
    if name == "reduce_":  # a ring's reduce-scatter, then the parts to the root
        return f * _bytes(args[0])
    if name in ("broadcast_", "broadcast"):
        root = args[2] if name == "broadcast_" else args[1]
        return 0.0 if rank == root else _bytes(args[0])
    if name == "scatter_":
        return 0.0 if rank == args[3] else _bytes(args[0])
    if name in ("_allgather_base_", "allgather_"):
        return f * _bytes(args[0])
    if name in ("all_gather_into_tensor",):
        return f * size * _bytes(args[0])
    if name in ("_reduce_scatter_base_", "reduce_scatter_tensor"):
        return f * _bytes(args[1] if name.startswith("_") else args[0])
    return float(_bytes(args[0]))  # anything else: its first argument, once


def _layout_model(model: torch.nn.Module, layout: str, rank: int, world: int) -> None:
    """Shard ``model`` in place as the trainer does for ``layout`` (``ddp``: nothing; ``2d``:
    a ``(2, world / 2)`` mesh)."""
    if layout == "ddp":
        return
    from spectra_lab.train.config import TrainConfig
    from spectra_lab.train.parallel import wrap_model
    from spectra_lab.train.runtime import Runtime

    parallel = layout.split("-")[0]  # fsdp2-whole and fsdp2-gram shard alike
    tp = {"tp": world, "2d": world // 2}.get(parallel, 1)
    cfg = TrainConfig(parallel=parallel, tp_size=tp if parallel == "2d" else None)
    wrap_model(model, cfg, Runtime(rank, world, torch.device("cpu"), None, rank // tp, world // tp))


def _traffic_worker(rank: int, world: int, init: str, spec: dict[str, Any], out: str) -> None:
    from spectra.optim import distributed as spectra_dist
    from spectra.optim.distributed import local
    from spectra_lab.model import Llama, model_config
    from spectra_lab.train.config import TrainConfig
    from spectra_lab.train.optimizers import build_optimizer

    torch.set_num_threads(spec["threads"])
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        result = {}
        for layout in spec["layouts"]:
            torch.manual_seed(0)
            model = Llama(model_config(spec["preset"], spec["vocab"]))
            _layout_model(model, layout, rank, world)
            spectra_dist.GRAM_ROUTE = layout != "fsdp2-whole"
            cfg = TrainConfig(preset=spec["preset"])
            opt = build_optimizer(model, cfg, lambda k: 1.0)
            g = torch.Generator().manual_seed(1)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
                local(p.grad).copy_(0.01 * torch.randn(local(p).shape, generator=g))
            opt.step()  # the first step builds the state
            with CollectiveCounter() as counter:
                opt.step()
            received = [None] * world
            dist.all_gather_object(received, counter.received)
            result[layout] = {"received": received, "calls": counter.calls}
        spectra_dist.GRAM_ROUTE = True
        if rank == 0:
            Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def measure_traffic(procs: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Bytes each rank receives in one ``optimizer.step()`` of each layout, ``procs`` ranks."""
    return _spawn(_traffic_worker, procs, spec)


def _mesh_of(layout: str, n: int) -> tuple[int, ...]:
    if layout == "2d":  # TP within a node of 8 at most, FSDP across
        tp = min(8, n // 2)
        return (n // tp, tp)
    return (n,)


def traffic_model(preset: str, vocab: int, n: int, bytes_per: int = 4) -> dict[str, float]:
    """Modelled bytes received per rank by the spectral links of one step of the training
    recipe (the hidden and attention matrices post-clipped), per layout, from the routes'
    own model (:func:`spectra.optim.distributed.route_of`) and, for DDP, the owners'
    broadcasts ``(N−1)/N·M``. The 2-D mesh is ``(N/tp, tp)`` with ``tp = min(8, N/2)``."""
    from torch.distributed.tensor import Replicate, Shard

    from spectra.optim import distributed as spectra_dist
    from spectra_lab.model import Llama, model_config
    from spectra_lab.train.optimizers import DECAY_GROUPS, group_of
    from spectra_lab.train.parallel import TP_PLAN

    with torch.device("meta"):
        model = Llama(model_config(preset, vocab))
    dtype = {4: torch.float32, 2: torch.bfloat16}[bytes_per]
    out = {layout: 0.0 for layout in LAYOUTS}
    for name, p in model.named_parameters():
        if group_of(name, p) not in DECAY_GROUPS:
            continue
        shape = (p.shape[0], p.numel() // p.shape[0])
        out["ddp"] += (n - 1) / n * p.numel() * bytes_per
        tp = next((s for key, s in TP_PLAN.items() if name.endswith(key + ".weight")), None)
        tp_shard = Shard(0 if tp == "colwise" else 1) if tp else Replicate()
        for layout in LAYOUTS[1:]:
            mesh = _mesh_of(layout, n)
            placements = {
                "fsdp2-whole": [Shard(0)], "fsdp2-gram": [Shard(0)], "tp": [tp_shard],
                "2d": [Shard(0), tp_shard],
            }[layout]  # fmt: skip
            spectra_dist.GRAM_ROUTE = layout != "fsdp2-whole"
            try:
                route = spectra_dist.route_of(_Stub(mesh, placements, dtype), shape)
            finally:
                spectra_dist.GRAM_ROUTE = True
            out[layout] += route.volume
    return out


class _Stub:
    """What :func:`~spectra.optim.distributed.route_of` reads of a DTensor."""

    def __init__(self, mesh: tuple[int, ...], placements: list, dtype: torch.dtype) -> None:
        self.device_mesh = type("Mesh", (), {"shape": mesh})()
        self.placements = placements
        self.dtype = dtype
        self.device = torch.device("cpu")


def _layouts_for(layouts: list[str], n: int, preset: str, vocab: int) -> list[str]:
    """The layouts that ``n`` processes can take on ``preset``: ``2d`` needs an even count of 4
    or more, and a layout's tensor-parallel part must divide the heads and the MLP's width."""
    from spectra_lab.model import model_config

    mc = model_config(preset, vocab)
    tp = {"tp": n, "2d": n // 2}

    def fits(x: str) -> bool:
        if x == "2d" and (n < 4 or n % 2):
            return False
        size = tp.get(x, 1)
        return mc.n_heads % size == 0 and mc.hidden_dim % size == 0

    return [x for x in layouts if fits(x)]


def print_traffic(args: argparse.Namespace, report: dict[str, Any]) -> None:
    mib = 2**20
    print(
        f"\nMiB received per rank in one optimizer step of spectra-adamw on {args.preset} "
        "(gloo; every collective counted; mean over ranks, the model in brackets)"
    )
    print(f"{'procs':>5} " + " ".join(f"{x:>18}" for x in args.layouts))
    for n in args.traffic_procs:
        layouts = _layouts_for(args.layouts, n, args.preset, args.vocab)
        spec = {"preset": args.preset, "vocab": args.vocab, "threads": 1, "layouts": layouts}
        measured = measure_traffic(n, spec)
        model = traffic_model(args.preset, args.vocab, n)
        cells = []
        for layout in args.layouts:
            if layout not in measured:
                cells.append(f"{'–':>18}")
                continue
            got = statistics.fmean(measured[layout]["received"])
            cells.append(f"{got / mib:>9.3f} [{model[layout] / mib:>6.3f}]")
            report["traffic"].append(
                {"procs": n, "layout": layout, **measured[layout], "model": model[layout]}
            )
        print(f"{n:>5} " + " ".join(cells), flush=True)


def print_traffic_model(args: argparse.Namespace, report: dict[str, Any]) -> None:
    mib = 2**20
    print(
        "\nModel: MiB received per rank by the spectral links of one step (float32 matrices; "
        "2d: (N/tp, tp) with tp = min(8, N/2))"
    )
    print(f"{'preset':>7} {'N':>3} " + " ".join(f"{x:>11}" for x in args.layouts))
    for preset in args.model_presets:
        for n in args.ranks:
            model = traffic_model(preset, 50304, n)
            print(f"{preset:>7} {n:>3} " + " ".join(f"{model[x] / mib:>11.0f}"
                                                    for x in args.layouts))  # fmt: skip
            report["traffic_model"].append({"preset": preset, "n": n, **model})


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
    parser.add_argument("--no-timing", action="store_true", help="skip the timing")
    parser.add_argument(
        "--traffic-procs",
        type=int,
        nargs="*",
        default=[2, 4],
        help="process counts whose optimizer-step traffic is measured per layout (2 4; none: skip)",
    )
    parser.add_argument(
        "--layouts",
        nargs="+",
        default=list(LAYOUTS),
        choices=LAYOUTS,
        help="layouts measured and modelled (all; 2d needs an even count of 4 or more)",
    )
    parser.add_argument(
        "--model-presets",
        nargs="*",
        default=["124m", "780m", "1.5b"],
        help="presets of the traffic model (124m 780m 1.5b)",
    )
    parser.add_argument(
        "--ranks", type=int, nargs="+", default=[8, 64], help="rank counts of the model (8 64)"
    )
    parser.add_argument("--json", default=None, help="also write the results to this file")


def run(args: argparse.Namespace) -> int:
    try:
        for n in args.procs:
            check_int("--procs", n, low=1)
        check_int("--repeats", args.repeats, low=1)
        check_int("--warmup", args.warmup, low=0)
        check_int("--threads", args.threads, low=1, none_ok=True)
        check_int("--vocab", args.vocab, low=2)
        for n in args.traffic_procs:
            check_int("--traffic-procs", n, low=2)
        for n in args.ranks:
            check_int("--ranks", n, low=2)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    from spectra_lab.machine import device_about

    report: dict[str, Any] = {"machine": device_about("cpu"), "timing": [], "volume": [],
                              "traffic": [], "traffic_model": []}  # fmt: skip
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
    if args.traffic_procs:
        print_traffic(args, report)
    if args.model_presets:
        print_traffic_model(args, report)
    if args.json:
        from spectra_lab.files import atomic_write

        atomic_write(args.json, json.dumps(report, indent=2))
    return 0
