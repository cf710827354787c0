"""What the SPECTRA chain applies to one parameter on one step: its spectral operators
(:class:`SpectralOp`) and its scalars (:class:`ParamPlan`).

:mod:`spectra.optim.chain` runs the links with them and :mod:`spectra.optim.distributed`
divides their work among ranks; both import this module, which imports neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

from spectra.ops import hard_clip, orthogonalize, soft_clip, soft_clip_begin, soft_clip_end
from spectra.ops.gram import gram_factor
from spectra.ops.methods import OPERATORS, operator
from spectra.ops.spectral import SoftClipPending
from spectra.optim.layout import MatrixLayout

PostKind = Literal["soft_clip", "hard_clip", "orthogonalize"]
POST_KINDS: tuple[str, ...] = OPERATORS


#: Whether the matmul-only soft clips also read their α in one batch on the CPU (the path every
#: other device takes). A host read costs nothing on the CPU, which has no queue to drain, and
#: there the batches run side by side on threads instead (holding one batch's Gram matrices,
#: not every batch's); the tests turn it on to count the reads of the GPU's path.
READ_ONCE_ON_CPU = False


class SpectralOp(NamedTuple):
    """A spectral operator with its settings, applied to a batch of matrices ``(B, m, n)``.

    ``kind`` names the function of :mod:`spectra.ops` (``soft_clip``, ``hard_clip`` or
    ``orthogonalize``); ``c`` is its threshold (unused by ``orthogonalize``). ``ns_steps`` and
    ``ns_dtype``, when given, go to the iterative methods of ``soft_clip`` and
    ``orthogonalize`` (e.g. the paper's N_s and precision for ``method="paper"``).
    ``capturable``: the operator reads nothing back to the host, and ``ratio_bound`` bounds its
    schedule (see :func:`spectra.ops.soft_clip`).

    A named tuple, not a frozen dataclass: torch 2.11's ``torch.compile`` cannot call a frozen
    dataclass built inside the traced step (an ``AttributeError`` on its first field).
    """

    kind: PostKind
    c: float | None = None
    method: str = "auto"
    ns_steps: int | None = None
    ns_dtype: torch.dtype | None = None
    capturable: bool = False
    ratio_bound: float | None = None

    def _iteration(self) -> dict[str, Any]:
        iteration: dict[str, Any] = {}
        if self.ns_steps is not None:
            iteration["ns_steps"] = self.ns_steps
        if self.ns_dtype is not None:
            iteration["ns_dtype"] = self.ns_dtype
        if self.capturable:
            iteration["capturable"] = True
        if self.ratio_bound is not None:
            iteration["ratio_bound"] = self.ratio_bound
        return iteration

    def __call__(self, U: Tensor) -> Tensor:
        iteration = self._iteration()
        if self.kind == "orthogonalize":
            return orthogonalize(U, method=self.method, **iteration)
        if self.kind == "hard_clip":
            return hard_clip(U, self.c, method=self.method)
        return soft_clip(U, self.c, method=self.method, **iteration)

    def gram_factor(self, G: Tensor, dtype: torch.dtype | None = None) -> Tensor | None:
        """``K`` with ``self(X) = K·X`` for ``XXᵀ = G`` (:func:`spectra.ops.gram.gram_factor`)
        for ``dtype`` matrices, for the Gram route of sharded matrices; ``None`` where a float32
        G is too coarse."""
        return gram_factor(
            G, self.kind, self.c, method=self.method, source_dtype=dtype, **self._iteration()
        )

    def matmul_only(self, X: Tensor) -> bool:
        """Whether this operator runs on matrices like ``X`` with matrix products only (its
        method's row in :data:`spectra.ops.METHODS` says so: a soft clip by ``"polar"``,
        ``"mixed"`` or ``"chebyshev"``, or ``"auto"`` where it picks one of them); such methods
        run fastest on large batches. Every capturable method has products only."""
        return self.capturable or operator(self.kind, self.method, X.device, X.dtype).matmul_only

    def deferred(self, X: Tensor) -> bool:
        """Whether :func:`spectra.ops.batched_apply_all_` runs this operator on matrices like
        ``X`` in two halves around one host read: a two-phase method (``"polar"``,
        ``"mixed"``), off the CPU (see :data:`READ_ONCE_ON_CPU`)."""
        if self.capturable or not (X.device.type != "cpu" or READ_ONCE_ON_CPU):
            return False
        return operator(self.kind, self.method, X.device, X.dtype).two_phase

    def begin(self, U: Tensor) -> SoftClipPending:
        """The device half of a soft clip (:func:`spectra.ops.soft_clip_begin`)."""
        return soft_clip_begin(U, self.c, method=self.method, **self._iteration())

    def end(self, U: Tensor, pending: SoftClipPending, values: Sequence[float]) -> Tensor:
        return soft_clip_end(U, pending, values)


@dataclass(frozen=True)
class ParamPlan:
    """One parameter's links for one step.

    Attributes:
        lr: η (including any per-parameter scale); a 0-d tensor on the parameters' device
            under ``capturable``, where the group's lr is one.
        weight_decay: λ; the weights are multiplied by ``1 − λη``.
        shape: the ``(m, n)`` matrix the spectral links see (with a ``layout``, the stored
            shape of its first matrix); ``None`` when they skip it.
        pre: the operator on the raw gradient, or ``None``.
        post: the operator on the direction, or ``None``.
        scale: α, the factor of the update (1 without a post operator).
        shard: the ``DTensor`` parameter when the chain gets its local shard (FSDP2); the
            spectral links then assemble the whole matrix (see :mod:`spectra.optim.distributed`).
        pre_state: for an adaptive pre-clip, the parameter's optimizer state, whose
            ``"pre_clip_ema"`` the pre-clip link updates (``pre`` then has ``c = inf`` on a
            step that only measures); see :mod:`spectra.optim.settings`.
        pre_beta: β of that running scale.
        pre_cs: the adaptive pre-clip's threshold of each matrix, where the ``layout`` makes
            the tensor several (each keeps its own running scale, a list in ``pre_clip_ema``;
            ``pre`` then has the largest finite one); ``None`` otherwise.
        layout: where the tensor holds several matrices, or stores them as ``(in, out)``
            (:mod:`spectra.optim.layout`); ``None``: the tensor is the one matrix ``shape``.
        scales: α of each block of the ``layout``'s split, where they differ (``scale`` is
            then their largest); ``None``: every matrix takes ``scale``.
        relative: ``post``'s threshold is relative: each matrix ``U_i`` of the direction is
            clipped at ``c·‖U_i‖_F`` (``clip_kappa``; see :mod:`spectra.optim.settings`).
    """

    lr: float | Tensor
    weight_decay: float = 0.0
    shape: tuple[int, int] | None = None
    pre: SpectralOp | None = None
    post: SpectralOp | None = None
    scale: float = 1.0
    shard: Tensor | None = field(default=None, compare=False, repr=False)
    pre_state: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    pre_beta: float = 0.0
    pre_cs: tuple[float, ...] | None = None
    layout: MatrixLayout | None = None
    scales: tuple[float, ...] | None = None
    relative: bool = False

    def matrices(self, t: Tensor) -> list[Tensor]:
        """The matrices the spectral links see in ``t`` (the parameter, its gradient or its
        direction, or a local shard of whole batch entries), as views of it."""
        if self.layout is None:
            return [t.view(self.shape)]
        return self.layout.matrices(t)
