r"""The spectral links of the SPECTRA chain across the ranks of ``torch.distributed``.

Two layouts.

* **Replicated** parameters (DDP): every rank holds the same matrices. Each matrix gets one
  owner rank (:func:`assign_owners`, balanced by the operator's cost ``m·n·min(m, n)``, not by
  count); a rank applies the operator to the matrices it owns only, then each owner broadcasts
  its results to the others in one flat buffer per owner and dtype. The math runs once, not
  once per rank.
* **Sharded** parameters (FSDP2, ``DTensor`` on a 1-D mesh): a shard is not a matrix. For each
  matrix in turn, every rank contributes its shard to the full matrix (an all-gather), the
  owner applies the operator, and the result is scattered back as shards
  (``distribute_tensor(..., src_data_rank=owner)``; uneven and empty shards follow DTensor's
  rules). Only one full matrix is held at a time.

Owners are computed from shapes alone, so every rank agrees without communicating.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

Op = Callable[[Tensor], Tensor]


def is_sharded(t: Tensor) -> bool:
    """Whether ``t`` is a ``DTensor`` (a parameter sharded by FSDP2 or any DTensor layout)."""
    if not dist.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local(t: Tensor) -> Tensor:
    """The local shard of a ``DTensor`` (sharing its storage), or ``t`` itself."""
    return t.to_local() if is_sharded(t) else t


def shaped_like(p: Tensor, t: Tensor) -> Tensor:
    """``t`` (a local shard) as a ``DTensor`` with ``p``'s layout when ``p`` is one."""
    if not is_sharded(p):
        return t
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(t, p.device_mesh, p.placements, shape=p.shape, stride=p.stride())


@contextlib.contextmanager
def whole_parameter(p: Tensor) -> Iterator[tuple[Tensor, Tensor]]:
    """``(weights, gradient)`` of ``p`` as whole plain tensors, for an update that needs them.

    For a ``DTensor`` parameter both are all-gathered; every rank then computes the same update
    on the whole tensor, and on exit keeps its own shard of the result (sliced locally, with no
    communication). For a plain parameter they are ``p`` and ``p.grad`` themselves.
    """
    if not is_sharded(p):
        yield p, p.grad
        return
    from torch.distributed.tensor import distribute_tensor

    check_layout(p)
    full = p.full_tensor()
    yield full, p.grad.full_tensor()
    local(p).copy_(
        distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
    )


def sparse_error(owner: str, p: Tensor) -> str:
    return (
        f"{owner} does not support sparse gradients: a parameter of shape {tuple(p.shape)} has "
        "one; use spectra.Spectra around an optimizer that does (e.g. torch.optim.SGD)"
    )


def check_layout(p: Tensor) -> None:
    """Refuse DTensor layouts the chain cannot assemble into whole matrices."""
    from torch.distributed.tensor import Replicate, Shard

    mesh, placements = p.device_mesh, p.placements
    ok = mesh.ndim == 1 and all(isinstance(pl, (Shard, Replicate)) for pl in placements)
    if not ok:
        raise ValueError(
            f"a DTensor parameter of shape {tuple(p.shape)} with placements {placements} on a "
            f"{mesh.ndim}-D mesh is not supported: spectra's optimizers take FSDP2 sharding "
            "(Shard or Replicate on a 1-D mesh), not tensor parallelism or partial placements"
        )


def split_group(params: Sequence[Tensor], enabled: bool) -> dist.ProcessGroup | None:
    """The process group that shares the spectral work of replicated parameters, or ``None``.

    ``None`` when ``enabled`` is false, no process group is initialised, it has one rank, or
    the parameters are ``DTensor`` (their own mesh then decides).
    """
    if not (enabled and dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size() == 1 or any(is_sharded(p) for p in params):
        return None
    return dist.group.WORLD


def assign_owners(shapes: Sequence[tuple[int, int]], world: int) -> list[int]:
    """The owner rank of each ``(m, n)`` matrix: greedy longest-first on ``m·n·min(m, n)``.

    Deterministic (ties go to the lower index and rank), so every rank computes the same map.
    """
    costs = [m * n * min(m, n) for m, n in shapes]
    load = [0] * world
    owners = [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owners[i] = r
        load[r] += costs[i]
    return owners


def apply_replicated(
    items: Sequence[tuple[Op, Tensor]],
    group: dist.ProcessGroup,
    apply_local: Callable[[Sequence[tuple[Op, Tensor]]], None],
) -> None:
    """``X ← op(X)`` for replicated 2-D matrices, each computed by its owner and broadcast.

    ``apply_local(items)`` applies the operators to this rank's share (batched).
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    owners = assign_owners([tuple(X.shape) for _, X in items], world)
    apply_local([it for it, o in zip(items, owners, strict=True) if o == rank])
    for r in range(world):
        by_dtype: dict[torch.dtype, list[Tensor]] = {}
        for (_, X), o in zip(items, owners, strict=True):
            if o == r:
                by_dtype.setdefault(X.dtype, []).append(X)
        for mats in by_dtype.values():  # the same order on every rank
            if rank == r:
                flat = torch.cat([X.reshape(-1) for X in mats])
            else:
                flat = mats[0].new_empty(sum(X.numel() for X in mats))
            dist.broadcast(flat, src=dist.get_global_rank(group, r), group=group)
            if rank != r:
                for X, part in zip(mats, flat.split([X.numel() for X in mats]), strict=True):
                    X.copy_(part.view(X.shape))


def apply_sharded(items: Sequence[tuple[Op, Tensor, Tensor, tuple[int, int]]]) -> None:
    """``U ← op(U)`` for matrices held as shards: ``(op, local shard of U, DTensor parameter,
    (m, n))``. The full matrix is assembled for the operator only, on one matrix at a time."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not items:
        return
    mesh = items[0][2].device_mesh
    rank, world = mesh.get_local_rank(), mesh.size()
    owners = assign_owners([shape for *_, shape in items], world)
    for (op, u, p, shape), owner in zip(items, owners, strict=True):
        check_layout(p)
        full = DTensor.from_local(
            u, p.device_mesh, p.placements, shape=p.shape, stride=p.stride()
        ).full_tensor()
        if rank == owner:
            full = op(full.reshape(1, *shape)).reshape(p.shape)
        # src_data_rank is the rank within the mesh's dimension, which the owner indexes.
        out = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=owner)
        u.copy_(out.to_local())


def frobenius_norms(tensors: Sequence[Tensor], params: Sequence[Tensor]) -> list[Tensor]:
    """‖t‖_F of each tensor, where ``tensors[i]`` is the local shard of ``params[i]`` when that
    is a ``DTensor``: the shards' squared norms are summed over its mesh."""
    norms = list(torch._foreach_norm(list(tensors)))
    sharded = [i for i, p in enumerate(params) if is_sharded(p)]
    if sharded:
        sq = torch.stack([norms[i].square() for i in sharded])
        dist.all_reduce(sq, group=params[sharded[0]].device_mesh.get_group())
        for j, i in enumerate(sharded):
            norms[i] = sq[j].sqrt()
    return norms


def shard_group(tensors: Sequence[Tensor]) -> dist.ProcessGroup | None:
    """The process group of the first ``DTensor``'s mesh, or ``None`` if there is none."""
    for t in tensors:
        if t is not None and is_sharded(t):
            return t.device_mesh.get_group()
    return None


def check_replicated(params: Sequence[Tensor], group: dist.ProcessGroup) -> None:
    """Raise ``ValueError`` unless every rank of ``group`` holds the same parameter values.

    A cheap fingerprint (each parameter's sum) is compared across ranks; the replicated split
    would otherwise silently mix different models.
    """
    sums = torch.stack([p.detach().double().sum() for p in params])
    gathered = [torch.empty_like(sums) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, sums, group=group)
    if any(not torch.equal(g, sums) for g in gathered):
        raise ValueError(
            "split_work: the parameters differ across ranks, so the spectral work cannot be "
            "divided among them (use DDP, which keeps them replicated, or pass "
            "split_work=False)"
        )


def all_agree_finite(finite: bool, tensors: Sequence[Tensor], group) -> bool:
    """Combine each rank's verdict so that every rank takes the same branch."""
    flag = torch.tensor([1.0 if finite else 0.0], device=tensors[0].device if tensors else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
