"""A model on several ranks: DDP, FSDP2 and tensor parallelism, and what they change in a step.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) :func:`wrap_model` puts the model in DDP (gloo
on CPU, NCCL on CUDA; see ``runtime.py``), or with ``parallel="fsdp2"`` shards it in place by
FSDP2 (``fully_shard`` on each block, then on the whole model); ``"tp"`` and ``"2d"`` split
each block's matrices by :data:`TP_PLAN`. :func:`gradient_sync` reduces the gradients of the
last micro-batch only, :func:`clip_grad_norm` clips a gradient whose parts live on several
meshes, and :func:`full` gathers a sharded scalar.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from spectra.optim.distributed import is_sharded
from spectra_lab.train.config import ConfigError, TrainConfig
from spectra_lab.train.runtime import Runtime

#: the tensor-parallel plan of a block (``"tp"``, ``"2d"``): q, k, v and the MLP's w1, w3 split
#: by rows (``ColwiseParallel``: each rank computes its heads and its part of the hidden
#: layer), o and w2 by columns (``RowwiseParallel``: their outputs are summed), as in
#: Megatron-LM; embeddings, norms and the head stay whole on every rank
TP_PLAN = {"attn.wq": "colwise", "attn.wk": "colwise", "attn.wv": "colwise",
           "attn.wo": "rowwise", "mlp.w1": "colwise", "mlp.w3": "colwise",
           "mlp.w2": "rowwise"}  # fmt: skip


def wrap_model(model: nn.Module, cfg: TrainConfig, rt: Runtime) -> nn.Module:
    """The module the loop calls: ``model``, compiled if asked, in DDP when distributed.

    With ``parallel="fsdp2"``: ``model`` itself, sharded in place over a 1-D mesh of all
    ranks by ``fully_shard`` on each block, then on the root (torchtitan's layout: a block's
    weights are gathered for its forward and backward only); ``compile`` compiles each block.
    With ``"tp"``: each block's matrices split over all ranks by :data:`TP_PLAN`. With
    ``"2d"``: both, on a ``(dp, tp)`` mesh of ``(world / tp_size, tp_size)``: TP within each
    row, FSDP2 across.
    """
    if cfg.parallel in ("tp", "2d"):
        return _tensor_parallel(model, cfg, rt)
    if cfg.parallel == "fsdp2":
        mesh = init_device_mesh(rt.device.type, (rt.world_size,))
        for block in model.layers:
            if cfg.compile:
                block.compile()
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    forward = torch.compile(model) if cfg.compile else model
    if rt.distributed:
        device_ids = [rt.device.index] if rt.device.type == "cuda" else None
        forward = nn.parallel.DistributedDataParallel(forward, device_ids=device_ids)
    return forward


def _tensor_parallel(model: nn.Module, cfg: TrainConfig, rt: Runtime) -> nn.Module:
    tp = rt.world_size // rt.dp_size
    mc = model.cfg
    for what, size in (("n_heads", mc.n_heads), ("the MLP's hidden size", mc.hidden_dim)):
        if size % tp:
            raise ConfigError(
                f"config field 'parallel' = {cfg.parallel!r}: {tp} tensor-parallel processes do "
                f"not divide {what} ({size})"
            )
    mesh = init_device_mesh(rt.device.type, (rt.dp_size, tp), mesh_dim_names=("dp", "tp"))
    if cfg.parallel == "2d":
        # The gradient norm of a matrix split on both dimensions is reduced over the whole
        # mesh: with a flattened mesh DTensor does that in one all-reduce, not two in turn.
        mesh._flatten()
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for block in model.layers:
        parallelize_module(block, mesh["tp"], {k: styles[v]() for k, v in TP_PLAN.items()})
        if cfg.compile:
            block.compile()
        if cfg.parallel == "2d":
            fully_shard(block, mesh=mesh["dp"])
    if cfg.parallel == "2d":
        fully_shard(model, mesh=mesh["dp"])
    return model


def gradient_sync(forward: nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """Gradients are reduced across ranks on the last micro-batch only.

    DDP: ``no_sync()`` around the others. FSDP2: ``set_requires_gradient_sync(last)``; the
    unsharded gradients accumulate locally until the last micro-batch reduce-scatters them.
    """
    if isinstance(forward, FSDPModule):
        forward.set_requires_gradient_sync(last)
    elif isinstance(forward, nn.parallel.DistributedDataParallel) and not last:
        return forward.no_sync()
    return contextlib.nullcontext()


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for parameters that may be plain tensors and
    ``DTensor``s on several meshes (tensor parallelism leaves the embeddings and norms whole;
    a 2-D run shards those over its data-parallel mesh only): the norm of each kind is
    reduced by its own mesh, the total is their root sum of squares, and every gradient is
    scaled by ``min(1, max_norm / (total + 1e-6))``."""
    kinds: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            kinds.setdefault(p.grad.device_mesh if is_sharded(p.grad) else None, []).append(p)
    if len(kinds) <= 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norms = []
    for ps in kinds.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in ps])
        norms.append(norm.full_tensor() if is_sharded(norm) else norm)
    total = torch.linalg.vector_norm(torch.stack(norms))
    for ps in kinds.values():
        torch.nn.utils.clip_grads_with_norm_(ps, max_norm, total)
    return total


def full(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole: a ``DTensor`` (FSDP2's gradient norm) gathered, any other tensor as is."""
    return t.full_tensor() if isinstance(t, DTensor) else t
