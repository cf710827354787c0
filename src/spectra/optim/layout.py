r"""How a parameter's dimensions map to the matrices the spectral links clip.

By default a tensor with two or more dimensions is one matrix, ``(d0, d1·d2·…)``. Three
per-group settings describe the tensors of real models that hold several matrices, or hold one
the other way round:

* ``clip_batch_dims=k``: the first ``k`` dimensions index separate matrices. A mixture of
  experts' stack ``(E, m, n)`` with ``k = 1`` is ``E`` matrices ``(m, n)``.
* ``clip_split=(sizes, dim)``: the tensor is the concatenation, along ``dim``, of blocks of
  these sizes (``torch.split``'s arguments), each its own matrix: fused q/k/v or gate/up
  projections.
* ``clip_transposed=True``: the tensor stores each matrix as ``(in, out)`` (Hugging Face's
  ``Conv1D``), so α reads the ``(out, in)`` shape. Singular values, and so the clip itself,
  are the same either way: ``H_c(Xᵀ) = H_c(X)ᵀ``.

Each matrix ``W_i`` of a tensor then takes its own step, ``W_i ← (1 − λη)W_i −
α_i η·post(U_i)`` with ``U_i`` the direction's block at the same place and ``α_i =
max(1, √(m_i/n_i))`` for its ``(out, in)`` shape ``(m_i, n_i)``; a pre-clip clips each
gradient block the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor


def default_scale(shape: tuple[int, int]) -> float:
    """α = ``max(1, √(m/n))`` for an ``(m, n)`` matrix, the paper's default."""
    m, n = shape
    return max(1.0, math.sqrt(m / n))


@dataclass(frozen=True)
class MatrixLayout:
    """The matrices of a tensor of a given ``ndim`` (see the module's docstring).

    ``split_dim`` is a dimension of the tensor (not negative) among its last two; the tensor's
    dimensions after the ``batch_dims`` are then exactly two. Without a split the dimensions
    after the batch ones are flattened to ``(d0, d1·d2·…)`` as for a plain tensor.
    """

    batch_dims: int = 0
    split_sizes: tuple[int, ...] | None = None
    split_dim: int = 0
    transposed: bool = False

    def matrices(self, t: Tensor) -> list[Tensor]:
        """The 2-D views of ``t`` (a contiguous tensor of the parameter's shape, or a local
        shard of whole batch entries), blocks outer, batch entries inner. They share ``t``'s
        storage: writing to them writes to ``t``."""
        b = self.batch_dims
        x = t.view(-1, *t.shape[b:]) if b else t.unsqueeze(0)
        if self.split_sizes is None:
            parts = [x.view(x.shape[0], x.shape[1], math.prod(x.shape[2:]))]
        else:
            parts = list(x.split(self.split_sizes, dim=self.split_dim - b + 1))
        return [X for part in parts for X in part.unbind(0)]

    def shapes(self, shape: Sequence[int]) -> list[tuple[int, int]]:
        """The stored ``(rows, columns)`` of each matrix of a tensor of ``shape``, in the order
        of :meth:`matrices`."""
        b = self.batch_dims
        count = math.prod(shape[:b])
        rest = list(shape[b:])
        if self.split_sizes is None:
            blocks = [(rest[0], math.prod(rest[1:]))]
        else:
            axis = self.split_dim - b
            blocks = [
                (size, rest[1]) if axis == 0 else (rest[0], size) for size in self.split_sizes
            ]
        return [block for block in blocks for _ in range(count)]

    def scales(self, shape: Sequence[int]) -> list[float]:
        """α of each matrix: :func:`default_scale` of its ``(out, in)`` shape."""
        return [default_scale((n, m) if self.transposed else (m, n)) for m, n in self.shapes(shape)]

    @property
    def several(self) -> bool:
        """Whether a tensor may hold more than one matrix (a batch or a split)."""
        return self.batch_dims > 0 or self.split_sizes is not None
