"""What a clip method is: the row of :data:`spectra.ops.methods.METHODS`.

A method (``"eigh"``, ``"polar"``, ``"muon"``, ...) lives in a module of its own and offers one
:class:`Operator` to each of the spectral operators it computes (``soft_clip``, ``hard_clip``,
``orthogonalize``). The public functions of :mod:`spectra.ops.spectral` check their input, look
the method up and call its :class:`Operator` on matrices (``X.dim() ≥ 2``, finite where the
method does not check that itself, not empty); 1-D and empty input never reach a method.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from spectra.ops._common import check_finite, vector_rule

#: Target relative error per singular direction of the polynomial soft clips (``"polar"``,
#: ``"mixed"``) in exact arithmetic.
POLAR_TOL = 1e-3


@dataclass(frozen=True)
class Options:
    """A call's iteration settings, passed whole to its method.

    ``ns_steps`` and ``ns_dtype`` go to the iterative methods (``None``: the method's own
    default); ``tol`` to the soft clips that iterate to a tolerance. ``capturable``: the call
    reads nothing back to the host (no finite check, no schedule read from the data), so that
    ``torch.compile(fullgraph=True)`` and CUDA graphs take it whole; only methods whose
    :class:`Operator` is ``capturable`` accept it. ``ratio_bound``: the largest σ_max/c a
    capturable soft clip by ``"polar"`` or ``"mixed"`` schedules for (``None``: the most its
    precision resolves; :meth:`spectra.ops.polar.TwoPhase.capturable`).
    """

    ns_steps: int | None = None
    ns_dtype: torch.dtype | None = None
    tol: float = POLAR_TOL
    capturable: bool = False
    ratio_bound: float | None = None


#: ``apply(X, c, options) -> op(X)``, on checked matrices (``c`` is None for orthogonalize)
Apply = Callable[[Tensor, Any, Options], Tensor]
#: ``gram_factor(G, c, options, source_dtype) -> K`` with ``op(X) = K·X`` for every X with
#: ``XXᵀ = G``; ``None`` where a float32 G is too coarse (the caller then passes a float64 one)
GramFactor = Callable[[Tensor, Any, Options, torch.dtype], "Tensor | None"]


@dataclass(frozen=True)
class Operator:
    """What a method offers one operator.

    Attributes:
        apply: the operator on a batch of matrices.
        gram_factor: its factor from the Gram matrix alone (the Gram route of sharded
            matrices, :mod:`spectra.ops.gram`); every operator names one, so a sharded run
            computes what the single-process one does, or the exact operator where the method
            approximates it.
        check: validates ``options`` before any work (for every input, 1-D and empty included).
        with_norm: ``(op(X), σ̂_max(X))`` from the work ``apply`` does anyway (soft clip only;
            without it :func:`~spectra.ops.soft_clip_with_norm` takes σ_max from an SVD).
        begin: a two-phase method's device half: ``(request, state)``, where ``request`` is a
            1-D float64 tensor the caller reads on the host (for many calls at once).
        end: ``end(X, c, options, state, values)``: the rest, given the host values.
        checks_finite: ``apply`` rejects non-finite input itself (from work it does anyway, such
            as the host read of the two-phase methods); otherwise the caller checks first.
        capturable: ``apply`` with ``options.capturable`` reads nothing on the host (a
            non-finite input then gives a non-finite result instead of an error).
        products_only: ``apply`` runs matrix products and elementwise work only (no LAPACK
            call), as the two-phase methods do: :func:`~spectra.ops.batched_apply_` runs its
            batches one after another, with the intra-op threads (see :attr:`matmul_only`).
    """

    apply: Apply
    gram_factor: GramFactor
    check: Callable[[Options], None] = lambda options: None
    with_norm: Callable[[Tensor, float, Options], tuple[Tensor, Tensor]] | None = None
    begin: Callable[[Tensor, float, Options], tuple[Tensor, Any]] | None = None
    end: Callable[[Tensor, float, Options, Any, Sequence[float]], Tensor] | None = None
    checks_finite: bool = False
    capturable: bool = False
    products_only: bool = False

    @property
    def two_phase(self) -> bool:
        """Whether the method runs in two halves around one host read (matmul-only methods
        that read their α; they run fastest on large batches)."""
        return self.begin is not None

    @property
    def matmul_only(self) -> bool:
        """Whether the method runs matrix products only: the two-phase methods and those marked
        ``products_only``."""
        return self.two_phase or self.products_only


@dataclass(frozen=True)
class ClipMethod:
    """A method's name and what it offers each operator (``None``: not offered)."""

    name: str
    soft_clip: Operator | None = None
    hard_clip: Operator | None = None
    orthogonalize: Operator | None = None


def apply_checked(
    op: Operator, X: Tensor, c: Any, options: Options, vector_weight: Callable[[Tensor], Tensor]
) -> Tensor:
    """``op`` on X (shape and threshold already checked), as every entry point runs it: the
    options checked first; a 1-D X by the vector rule ``x · w(‖x‖)`` with ``vector_weight``;
    an empty X returned as a copy; non-finite input refused (passed through, with
    ``options.capturable``: a check would read the device)."""
    op.check(options)
    if (X.dim() == 1 or not op.checks_finite) and not options.capturable:
        check_finite(X)
    if X.dim() == 1:
        return vector_rule(X, vector_weight)
    if X.numel() == 0:
        return X.clone()
    return op.apply(X, c, options)
