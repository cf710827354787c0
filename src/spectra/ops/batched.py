"""Apply a batched matrix operator to a list of matrices of mixed shapes, in place."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

#: ``max_elements=None`` caps a batch at ``total / BATCH_FRACTION`` elements (or one matrix, if
#: larger): the operators' float64 temporaries are several times their batch, and this keeps
#: them at a small fraction of all the matrices.
BATCH_FRACTION = 32


def batched_apply_(
    op: Callable[[Tensor], Tensor],
    matrices: Sequence[Tensor],
    *,
    max_elements: int | None = None,
) -> None:
    r"""``X ← op(X)`` for every matrix, with one ``op`` call per batch of same-shaped matrices.

    ``op`` maps a ``(B, m, n)`` batch to a tensor of the same shape (any operator of
    :mod:`spectra.ops`). Matrices that share shape, dtype and device are stacked into batches of
    at most ``max_elements`` elements (at least one matrix each; ``None``: the total over
    :data:`BATCH_FRACTION`) and the results are copied back.
    The transient memory of a call is one batch, its stack and ``op``'s own temporaries.
    """
    mats = list(matrices)
    for X in mats:
        if X.dim() != 2:
            raise ValueError(f"batched_apply_ takes 2-D matrices, got shape {tuple(X.shape)}")
    if not mats:
        return
    if max_elements is None:
        max_elements = -(-sum(X.numel() for X in mats) // BATCH_FRACTION)
    groups: dict[tuple, list[Tensor]] = {}
    for X in mats:
        groups.setdefault((tuple(X.shape), X.dtype, X.device), []).append(X)
    for (shape, _, _), group in groups.items():
        per_batch = max(1, max_elements // max(1, shape[0] * shape[1]))
        for start in range(0, len(group), per_batch):
            batch = group[start : start + per_batch]
            stacked = batch[0].unsqueeze(0) if len(batch) == 1 else torch.stack(batch)
            torch._foreach_copy_(batch, list(op(stacked).unbind(0)))
