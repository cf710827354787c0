"""Where a training process runs: rank, world size, device, numerics, and the collectives.

Under ``torchrun`` (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set) :func:`build_runtime` starts
the process group (gloo on CPU, NCCL on CUDA); in a single process every collective of
:class:`Runtime` is a no-op. ``parallel="fsdp2"`` in a single process starts a process group
of one (an in-memory store, no rendezvous), since FSDP2 and its checkpoints need one (and
so do ``"tp"`` and ``"2d"``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from spectra_lab.train.config import ConfigError, TrainConfig


@dataclass
class Runtime:
    """Where this process runs: rank, world size, device and numerics."""

    rank: int
    world_size: int
    device: torch.device
    autocast_dtype: torch.dtype | None
    #: the data-parallel coordinate and size: the rank and world size, except under tensor
    #: parallelism, whose ranks of one TP group read the same batches (``parallel="tp"``: one
    #: group; ``"2d"``: ``world_size / tp_size`` groups)
    dp_rank: int = 0
    dp_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (a collective)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (a collective)."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of ``value`` over the ranks."""
        if self.distributed:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.world_size
        return value


def build_runtime(cfg: TrainConfig) -> Runtime:
    """Read the torchrun environment, start the process group and pick the device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    if cfg.device == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        kind = cfg.device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"config field 'device' = {cfg.device!r}: CUDA is not available")
    device = torch.device("cpu")
    if kind == "cuda":
        index = local_rank if world_size > 1 or ":" not in cfg.device else int(cfg.device[5:])
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    backend = "nccl" if kind == "cuda" else "gloo"
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend=backend)
    elif cfg.parallel != "ddp" and not dist.is_initialized():
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    bf16 = cfg.autocast == "bf16" or (
        cfg.autocast == "auto" and kind == "cuda" and torch.cuda.is_bf16_supported()
    )
    tp = {"tp": world_size, "2d": cfg.tp_size or 1}.get(cfg.parallel, 1)
    if world_size % tp:
        raise ConfigError(
            f"config field 'tp_size' = {cfg.tp_size}: does not divide the {world_size} processes"
        )
    dtype = torch.bfloat16 if bf16 else None
    return Runtime(rank, world_size, device, dtype, rank // tp, world_size // tp)
