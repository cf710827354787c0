"""Spectral operators: functions of a matrix's singular values.

Every operator acts on the last two dimensions of its input and is batched over
the leading ones. Writing ``X = U diag(σ) Vᵀ`` for each matrix, an operator maps
``X ↦ U diag(φ(σ)) Vᵀ``:

=================  ===========================  ==================================
operator           φ(σ)                         reference
=================  ===========================  ==================================
``soft_clip``      σ / √(1 + σ²/c²)             H_c of "Enhancing LLM Training via
                                                Spectral Clipping", Sec. 5.1
``hard_clip``      min(σ, c)                    clip^sp_c, same paper, Sec. 2
``orthogonalize``  1 (0 where σ = 0)            orth(X) = UVᵀ (Muon)
=================  ===========================  ==================================

A 1-D tensor is treated as a vector, and φ is applied to its Euclidean norm
(the paper's vector rule): ``x ↦ x · φ(‖x‖)/‖x‖``.

Operators never modify their input and return a tensor of the input's shape,
dtype and device. Each ``method`` is a module of its own (:mod:`spectra.ops.eigh`, ``svd``,
``polar``, ``mixed``, ``paper``, ``muon``, ``polar_express``), looked up in one table
(:mod:`spectra.ops.methods`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import torch
from torch import Tensor

from spectra.ops._common import check_finite, check_matrix_input, check_threshold, compute_dtype
from spectra.ops.base import POLAR_TOL, Options, apply_checked
from spectra.ops.eigh import hard_weight, soft_weight
from spectra.ops.methods import METHODS, default_method, operator, resolve
from spectra.ops.polar import check_ratio_bound
from spectra.validate import check_int

if TYPE_CHECKING:
    from typing_extensions import Unpack

SoftClipMethod = Literal["auto", "eigh", "svd", "paper", "polar", "mixed", "chebyshev"]
HardClipMethod = Literal["auto", "eigh", "svd"]
OrthMethod = Literal["auto", "svd", "muon", "polar_express"]


class SoftClipKeywords(TypedDict, total=False):
    """The keyword arguments of :func:`soft_clip`, taken as they are by its other entry points."""

    method: SoftClipMethod
    ns_steps: int
    ns_dtype: torch.dtype | None
    tol: float
    capturable: bool


def soft_clip_method(method: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The method ``soft_clip(..., method=method)`` runs for a ``dtype`` input on ``device``:
    ``"auto"`` resolved (ValueError for a method ``soft_clip`` does not have)."""
    return resolve("soft_clip", method, device, dtype)


# --------------------------------------------------------------------------- soft clip


def soft_clip(
    X: Tensor,
    c: float,
    *,
    method: SoftClipMethod = "auto",
    ns_steps: int = 10,
    ns_dtype: torch.dtype | None = None,
    tol: float = POLAR_TOL,
    capturable: bool = False,
    ratio_bound: float | None = None,
) -> Tensor:
    r"""Soft spectral clipping ``H_c(X) = (I + XXᵀ/c²)^{-1/2} X``.

    Maps each singular value σ of X to ``h_c(σ) = σ/√(1+σ²/c²)``, which is close to σ
    for σ ≪ c and saturates at c for σ ≫ c; ``h_c(σ) ≤ min(σ, c)``.

    Args:
        X: tensor whose last two dimensions are the matrix; 1-D tensors use the vector rule.
        c: threshold, finite and > 0.
        method: ``"auto"`` (default: ``"mixed"`` for float32 and bf16 input on CUDA and on
            a CPU with bf16 units, ``"chebyshev"`` on a CPU without them; ``"polar"`` for
            float64 input on CUDA; ``"eigh"`` for float64 input on a CPU),
            ``"eigh"`` (exact: float64 eigh of the smaller Gram matrix), ``"svd"`` (exact:
            float64 SVD), ``"polar"`` (matmul-only: coupled minimax-polynomial iteration for
            the inverse square root, see :func:`soft_clip_polar`), ``"mixed"`` (the same
            iteration, its last steps in bf16, see :func:`soft_clip_mixed`), ``"chebyshev"``
            (matmul-only: one Chebyshev polynomial of the Gram matrix, see
            :mod:`spectra.ops.chebyshev`), or ``"paper"``
            (Algorithm 1 of the paper with the Newton–Schulz inverse square root,
            ``ns_steps`` iterations in ``ns_dtype``; kept for reproduction).
        ns_steps: Newton–Schulz steps for ``method="paper"`` (the paper's N_s).
        ns_dtype: working precision for ``method="paper"`` (default: float32, or float64
            for float64 input), ``method="polar"`` (default: chosen from α;
            ``torch.bfloat16``: split bf16 products while ``α ≤ 1e4``, see
            :func:`soft_clip_polar`), ``method="mixed"`` (the same for its float32 products,
            see :func:`soft_clip_mixed`), ``method="chebyshev"`` (default: float32, or
            float64 for float64 input) and ``method="eigh"`` (default: chosen from σ_max/c).
        tol: relative error per singular direction that ``"polar"`` and ``"mixed"`` iterate to
            and that ``"chebyshev"``'s polynomial meets.
        capturable: read nothing back to the host, so that ``torch.compile(fullgraph=True)``
            and CUDA graphs take the call whole: methods ``"polar"``, ``"mixed"`` (their
            schedule then covers every α their precision resolves, see
            :meth:`spectra.ops.polar.TwoPhase.capturable`) and ``"paper"``; ``"auto"`` takes
            ``"polar"`` where it would take ``"eigh"``. Non-finite input then gives a
            non-finite result instead of a ``ValueError``.
        ratio_bound: with ``capturable`` and ``"polar"`` or ``"mixed"``, a bound on
            σ_max/c that the caller vouches for: the schedule covers it alone (fewer steps,
            and split bf16 products of two parts for ``ratio_bound ≤ 100``); a matrix
            beyond it is damped, not amplified (:meth:`spectra.ops.polar.TwoPhase.capturable`).
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    op = operator("soft_clip", method, X.device, X.dtype, capturable)
    options = Options(ns_steps, ns_dtype, tol, capturable, ratio_bound)
    check_ratio_bound_method(options, resolve("soft_clip", method, X.device, X.dtype, capturable))
    return apply_checked(op, X, c, options, soft_weight(c))


def check_ratio_bound_method(options: Options, method: str) -> None:
    """Refuse a ``ratio_bound`` that is not a number ≥ 1 or comes without ``capturable``, and
    one for a method whose schedule it does not set."""
    if options.ratio_bound is None:
        return
    check_ratio_bound(options)
    if method not in ("polar", "mixed"):
        raise ValueError(
            f"ratio_bound={options.ratio_bound!r} sets the schedule of the capturable "
            f"'polar' and 'mixed' soft clips; method {method!r} takes none"
        )


@dataclass
class SoftClipPending:
    """A :func:`soft_clip` call between its device work and its host read.

    ``request`` (float64, 1-D, on the input's device) holds what the call must read on the
    host: for the two-phase methods (``"polar"``, ``"mixed"``) the batch's largest α and
    whether the input was finite; for the others nothing (they run whole in
    :func:`soft_clip_end`). ``state`` is the method's device work.
    """

    request: Tensor
    c: float
    method: str
    options: Options
    state: Any = None


def soft_clip_begin(X: Tensor, c: float, **kwargs: Unpack[SoftClipKeywords]) -> SoftClipPending:
    """The first half of ``soft_clip(X, c, **kwargs)`` (the same keyword arguments): for a
    two-phase method the Gram matrices and the α bound, without a host synchronisation.
    Reading ``request`` for many calls at once (one ``torch.cat(...).tolist()``) and passing
    each its values with :func:`soft_clip_end` gives one host synchronisation for all of them.
    The arguments are checked here, as by :func:`soft_clip`."""
    method, options = _keywords(**kwargs)
    check_matrix_input(X)
    c = check_threshold(c, "c")
    method = resolve("soft_clip", method, X.device, X.dtype, options.capturable)
    op = METHODS[method].soft_clip
    op.check(options)
    pending = SoftClipPending(torch.empty(0, dtype=torch.float64, device=X.device), c, method,
                              options)  # fmt: skip
    if op.two_phase and X.dim() > 1 and X.numel() and not options.capturable:
        pending.request, pending.state = op.begin(X, c, options)
    return pending


def soft_clip_end(X: Tensor, pending: SoftClipPending, values: Sequence[float]) -> Tensor:
    """The second half of :func:`soft_clip_begin`: ``H_c(X)`` for the same ``X``, given the
    host values of ``pending.request``."""
    p = pending
    op = operator("soft_clip", p.method, X.device, X.dtype, p.options.capturable)
    if p.state is None:
        return apply_checked(op, X, p.c, p.options, soft_weight(p.c))
    return op.end(X, p.c, p.options, p.state, values)


def soft_clip_with_norm(
    X: Tensor, c: float, **kwargs: Unpack[SoftClipKeywords]
) -> tuple[Tensor, Tensor]:
    r"""``(H_c(X), σ̂_max(X))``: :func:`soft_clip` (the same keyword arguments) and each matrix's
    spectral scale, read off the Gram matrix the clip forms anyway (no extra pass over X).

    ``σ̂_max`` is float64 with shape ``X.shape[:-2]`` (``()`` for a 1-D X):

    * ``"eigh"``, ``"svd"``: σ_max itself (the largest eigenvalue of the Gram matrix);
    * ``"polar"``, ``"mixed"``, ``"chebyshev"``: the bound ``s_max = min(‖G‖_F, max_i Σ_j |G_ij|,
      ‖G²‖_F^{1/2})^{1/2}`` that sets their α, with ``σ_max ≤ s_max ≤ r^{1/4}·σ_max`` for a
      matrix of rank r (equal to σ_max when one direction dominates);
    * ``"paper"``: Algorithm 1's ``s_max = min(‖G‖_F, max_i Σ_j |G_ij|)^{1/2}``
      (``σ_max ≤ s_max ≤ r^{1/2}·σ_max``);
    * a 1-D X: its Euclidean norm.

    ``H_c(X)`` is exactly what :func:`soft_clip` returns.
    """
    method, options = _keywords(**kwargs)
    if options.capturable:
        raise ValueError("soft_clip_with_norm reads its σ̂_max; it takes no capturable=True")
    check_matrix_input(X)
    c = check_threshold(c, "c")
    op = operator("soft_clip", method, X.device, X.dtype)
    op.check(options)
    if X.dim() == 1 or X.numel() == 0:
        Y = apply_checked(op, X, c, options, soft_weight(c))
        norm = torch.linalg.vector_norm(X.to(torch.float64), dim=-1 if X.dim() == 1 else (-1, -2))
        return Y, norm
    if not op.checks_finite:
        check_finite(X)
    if op.with_norm is None:  # σ_max itself, by a float64 SVD
        return op.apply(X, c, options), torch.linalg.matrix_norm(X.to(torch.float64), ord=2)
    return op.with_norm(X, c, options)


def _keywords(
    method: SoftClipMethod = "auto",
    ns_steps: int = 10,
    ns_dtype: torch.dtype | None = None,
    tol: float = POLAR_TOL,
    capturable: bool = False,
    ratio_bound: float | None = None,
) -> tuple[str, Options]:
    """:func:`soft_clip`'s keyword arguments, for the entry points that take them as they are."""
    return method, Options(ns_steps, ns_dtype, tol, capturable, ratio_bound)


# --------------------------------------------------------------------------- hard clip


def hard_clip(X: Tensor, c: float, *, method: HardClipMethod = "auto") -> Tensor:
    r"""Exact spectral clipping ``clip^sp_c(X) = U · min(Σ, c) · Vᵀ``.

    Args:
        X: tensor whose last two dimensions are the matrix; 1-D tensors use the vector rule
            ``x · min(1, c/‖x‖)``.
        c: threshold, finite and > 0.
        method: ``"auto"``/``"eigh"`` (float64 eigh of the smaller Gram matrix) or ``"svd"``.
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    op = operator("hard_clip", method, X.device, X.dtype)
    return apply_checked(op, X, c, Options(), hard_weight(c))


# --------------------------------------------------------------------------- orthogonalize


def orthogonalize(
    X: Tensor,
    *,
    method: OrthMethod = "auto",
    ns_steps: int = 5,
    ns_dtype: torch.dtype | None = None,
    capturable: bool = False,
) -> Tensor:
    r"""Orthogonalization ``orth(X) = UVᵀ``, Muon's operator.

    Args:
        X: tensor whose last two dimensions are the matrix; 1-D tensors map to ``x/‖x‖``.
        method: ``"auto"``/``"svd"`` (exact: float64 SVD, singular values zero below
            ``σ_max · max(m, n) · ε₆₄`` stay zero), ``"muon"`` (the classic quintic
            Newton–Schulz, ``ns_steps`` steps in ``ns_dtype``, default bfloat16; singular values
            with ``σ/‖X‖_F ≥ 10⁻²`` end in [0.68, 1.14] after 5 steps, those ``≥ 10⁻³`` in
            [0.47, 1.21]), or
            ``"polar_express"`` (greedy minimax quintics, ``ns_steps`` steps in ``ns_dtype``,
            default float32; band [0.875, 1.125] after 5 steps, [0.9986, 1.0014] after 6,
            for ``σ/‖X‖_F ≥ 10⁻³``). The bands are computed in docs/operators.md.
        ns_steps: iterations of the ``"muon"``/``"polar_express"`` schedules.
        ns_dtype: working precision of the iterative methods.
        capturable: read nothing back to the host (``"muon"``, ``"polar_express"``; ``"auto"``
            takes ``"polar_express"``); non-finite input then gives a non-finite result.
    """
    check_matrix_input(X)
    check_int("ns_steps", ns_steps, low=0)
    op = operator("orthogonalize", method, X.device, X.dtype, capturable)
    options = Options(ns_steps, ns_dtype, capturable=capturable)
    return apply_checked(op, X, None, options, lambda r: torch.where(r > 0, 1 / r, 0.0))


# --------------------------------------------------------------------------- other clips


def global_clip(X: Tensor, c: float) -> Tensor:
    r"""Global (Frobenius) clipping ``clip^g_c(X) = min(1, c/‖X‖_F) · X`` over the last two dims.

    A 1-D tensor uses its Euclidean norm.
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    dims = (-1,) if X.dim() == 1 else (-2, -1)
    wd = compute_dtype(X)
    norm = torch.linalg.vector_norm(X.to(wd), dim=dims, keepdim=True)
    factor = torch.clamp(c / norm.clamp_min(torch.finfo(wd).tiny), max=1.0)
    return (X.to(wd) * factor).to(X.dtype)


def coordinate_clip(X: Tensor, c: float) -> Tensor:
    r"""Coordinate-wise clipping ``clip^cw_c(X)_ij = sign(X_ij) · min(|X_ij|, c)``."""
    check_matrix_input(X)
    c = check_threshold(c, "c")
    return X.clamp(min=-c, max=c)


__all__ = [
    "SoftClipPending",
    "coordinate_clip",
    "default_method",
    "global_clip",
    "hard_clip",
    "orthogonalize",
    "soft_clip",
    "soft_clip_begin",
    "soft_clip_end",
    "soft_clip_method",
    "soft_clip_with_norm",
]
