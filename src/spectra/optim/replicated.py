r"""The spectral links of the SPECTRA chain for replicated parameters (DDP), and the owner map
both layouts use.

Every rank holds the same matrices. Each matrix gets one owner rank, with the batch one process
would put it in (:func:`apply_replicated`; batches balanced by the operator's cost
``m·n·min(m, n)``, not by count); a rank applies the operator to the matrices it owns only,
then each owner broadcasts its results to the others in one flat buffer per owner and dtype.
The math runs once, not once per rank. Owners are computed from shapes alone, so every rank
agrees without communicating. Sharded parameters: :mod:`spectra.optim.distributed`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from spectra.ops.batched import batch_indices

Op = Callable[[Tensor], Tensor]


def assign_owners(shapes: Sequence[tuple[int, int]], world: int) -> list[int]:
    """The owner rank of each ``(m, n)`` matrix: greedy longest-first on ``m·n·min(m, n)``.

    Deterministic (ties go to the lower index and rank), so every rank computes the same map.
    """
    return balanced([cost(shape) for shape in shapes], world)


def cost(shape: Sequence[int]) -> int:
    """An operator's cost on an ``(m, n)`` matrix, ``m·n·min(m, n)``, to balance owners by."""
    m, n = shape
    return m * n * min(m, n)


def balanced(costs: Sequence[int], world: int) -> list[int]:
    """Owners of items of these costs: greedy longest-first, ties to the lower index and rank."""
    load = [0] * world
    owners = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owners[i] = r
        load[r] += costs[i]
    return owners


def apply_replicated(
    items: Sequence[tuple[Op, Tensor]],
    group: dist.ProcessGroup,
    apply_local: Callable[[Sequence[tuple[Op, Tensor]], int], None],
    max_elements: int | None = None,
) -> None:
    """``X ← op(X)`` for replicated 2-D matrices, each computed by its owner and broadcast.

    The owners take whole batches, the ones one process would form
    (:func:`spectra.ops.batched.batch_indices` with ``max_elements``), balanced by the
    operators' cost: each matrix meets the same batch-mates as in one process, so the methods
    whose iteration a batch shares (the matmul-only soft clips' schedule) give its results.
    ``apply_local(items, total)`` applies the operators to this rank's share, batched as a
    call on ``total`` elements.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    jobs: dict[Op, list[int]] = {}
    for i, (op, _) in enumerate(items):
        jobs.setdefault(op, []).append(i)
    positions = list(jobs.values())
    batches = batch_indices(
        [(op, [items[i][1] for i in idx]) for op, idx in jobs.items()], max_elements=max_elements
    )
    costs = [sum(cost(items[positions[j][k]][1].shape) for k in batch) for j, batch in batches]
    owners = [0] * len(items)
    for (j, batch), owner in zip(batches, balanced(costs, world), strict=True):
        for k in batch:
            owners[positions[j][k]] = owner
    total = sum(X.numel() for _, X in items)
    apply_local([it for it, o in zip(items, owners, strict=True) if o == rank], total)
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
