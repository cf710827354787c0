r"""Method ``"mixed"``: the coupled iteration of :mod:`spectra.ops.polar`, its first steps in
the Gram matrix's precision and its last ones in bf16 on a well-conditioned matrix.

The first half of a call (the Gram matrix, the α bound, the host read) is ``"polar"``'s; the
steps after forming G see only G, so the Gram route of sharded matrices runs the same
iteration from G alone (:func:`mixed_gram_factor`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from spectra.ops._common import (
    add_to_diagonal,
    bf16_matmul,
    check_matrix_input,
    check_threshold,
    has_bf16_units,
    matmul,
    pow2_floor,
    split_bf16_gram,
    split_bf16_left,
    split_bf16_matmul,
    split_bf16_product,
    split_bf16_right,
    wide_view,
)
from spectra.ops.base import POLAR_TOL, ClipMethod, Options, apply_checked
from spectra.ops.eigh import soft_weight
from spectra.ops.polar import (
    POLAR_FP32_MAX_ALPHA,
    Plan,
    TwoPhase,
    bounds,
    check_tol,
    decide,
    gram_square_and_bound,
    output_factor,
)

# soft_clip_mixed runs its steps in bf16 once every singular value of the iterate is at
# least this (relative to the largest, ≈ 1): the matrix its bf16 steps invert is then
# conditioned by at most 1/MIXED_BF16_FROM² = 4 (0.2 and 0.3 measured up to 1.2e-2 error at
# σ_max/c = 1e5, 0.5 at most 6.5e-3; docs/operators.md).
MIXED_BF16_FROM = 0.5


# ...and at most this many steps, the last ones, run in bf16: the coupled iteration corrects
# the error of a step's polynomial but not the rounding of its iterates, so each bf16 step
# adds its roundings to the result. Over 400 random products of Gaussian matrices (shapes up
# to 48×96, σ_max/c up to 1e5) the worst error was 1.6e-2 with three or more and 8.0e-3 with
# two (experiments/mixed_error_sweep.py, docs/operators.md).
MIXED_MAX_BF16_STEPS = 2


#: On CUDA the exact part (the Gram matrix, G², the exact steps, the last product) runs on split
#: bf16 products by default (dtype=None) for matrices whose smaller side is at least this, and
#: in float32 below it. In the H200 run of docs/gpu.md (commit dab824e, bench optim) the split
#: products made the step faster at the 780M shapes (smaller sides 1280) and slower at the 124M
#: ones (768), where a step is bound by its launches more than by its products.
MIXED_SPLIT_FROM = 1024

#: The devices on which :data:`MIXED_SPLIT_FROM` applies. CPUs are left out, even those with
#: bf16 units: there a bf16 product runs about twice as fast as a float32 one, not the 15× of
#: a GPU's tensor cores, which does not pay for a split's two or three products.
SPLIT_DEVICES: tuple[str, ...] = ("cuda",)


def exact_precision(options: Options, X: Tensor) -> torch.dtype | None:
    """The precision asked of the exact part of a call on X: ``options.ns_dtype`` when set;
    otherwise split bf16 products (``torch.bfloat16``) on a device of :data:`SPLIT_DEVICES`
    when X's matrices are at least :data:`MIXED_SPLIT_FROM` on their smaller side, and
    ``None`` (float32, or float64 where :func:`soft_clip_polar` would take it) elsewhere. A
    capturable call keeps ``None``: it cannot read whether α allows split products."""
    if options.ns_dtype is not None:
        return options.ns_dtype
    large = X.dim() >= 2 and min(X.shape[-2:]) >= MIXED_SPLIT_FROM
    if large and X.device.type in SPLIT_DEVICES and not options.capturable:
        return torch.bfloat16
    return None


def soft_clip_mixed(
    X: Tensor, c: float, *, tol: float = POLAR_TOL, dtype: torch.dtype | None = None
) -> Tensor:
    r"""``H_c(X)`` by the coupled iteration of :func:`soft_clip_polar`, its first steps in
    float32 and the rest in bf16 on a well-conditioned matrix.

    With ``M̂ = (I + XXᵀ/c²)/α`` (eigenvalues in ``[1/α, 1]``) and the quintics ``p_k`` of
    :func:`soft_clip_polar`, the first ``e`` steps of the coupled iteration run in the Gram
    matrix's precision (float32; float64 where :func:`soft_clip_polar` would use it) and give
    ``Z_e = p_e(…)·…·p_1(M̂)`` and ``E = Z_e M̂ Z_e``, whose eigenvalues ``s_e²`` lie in
    ``[ℓ_e², 1]``. ``e`` is the first step with ``ℓ_e ≥ MIXED_BF16_FROM`` (0.5), so E is
    conditioned by at most 4 whatever α is, and at least ``K − 2`` (``MIXED_MAX_BF16_STEPS``):
    each bf16 step's roundings stay in the result. The remaining quintics run in bf16 on E alone
    (bf16 products; each ``aI + bE + cE²`` one fused product that sums in float32), giving
    ``W ≈ E^{-1/2}``; then ``K = W Z_e ≈ M̂^{-1/2}`` (all factors are functions of M̂) and
    ``H_c(X) = K X/√α``, both products in the Gram matrix's precision.

    Why the split keeps the error at the bf16 floor for any α: an error δW of W (a few bf16
    roundings relative to ‖W‖ ≤ 2) enters H as ``δW·(Z_e X/√α)``, and ``Z_e X/√α`` has singular
    values at most 1 (relative to c), so it moves every direction by about that much — not by
    ``σ_max/c`` times as much, which is the paper's bf16 error on a spike (its Newton–Schulz
    iterate carries the whole dynamic range of ``M^{-1/2}``). The measured error is 3.5–6.4e-3
    for σ_max/c from 1 to 1e5 (docs/operators.md), against 5e-4 for ``method="polar"``. The Gram
    matrix and the last product stay in float32: rounding X or K to bf16 would move the bulk of
    the spectrum by ``≈ 4e-3·σ_max``.

    Cost for ``K`` steps of which ``e ≥ 1`` exact and ``r = K − e ≥ 1`` in bf16, ``m ≤ n``
    (:func:`spectra_lab.bench.flops.mixed_flops` has every case): ``2m²n`` twice (Gram matrix,
    last product) and ``2m³`` times ``4e`` (``G²``, the exact steps, ``K = W Z_e``) in
    float32; ``(4r − 3)·2m³`` in bf16. The paper's Algorithm 1 (``N_s = 10``) takes ``4m²n + 60m³``
    in bf16. One host synchronisation per call, as in :func:`soft_clip_polar`.

    ``dtype=torch.bfloat16`` (bf16 first): while ``α ≤ 1e4`` the float32 products (the exact
    steps and the last product) are each three bf16 products with float32 sums
    (:func:`spectra.ops._common.split_bf16_matmul`, about 1e-5 relative error each), and the
    Gram matrix, ``G²`` and each exact step's ``E² = EEᵀ`` two
    (:func:`spectra.ops._common.split_bf16_gram`), as ``"polar"`` does with the same ``dtype``
    for the Gram matrix and ``G²``; so every product runs on bf16 units. Beyond that bound it
    works as by default, its Gram matrix formed again in float32. ``dtype=None`` takes this
    route on CUDA for matrices at least ``MIXED_SPLIT_FROM`` (1024) on their smaller side
    (:func:`exact_precision`), and float32 otherwise; ``dtype=torch.float32``/``float64``
    fixes the precision of the exact part.
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    options = Options(ns_dtype=dtype, tol=tol)
    return apply_checked(METHOD.soft_clip, X, c, options, soft_weight(c))


def _mixed_run(c: float, plan: Plan, transposed: bool) -> Tensor:
    """``soft_clip_mixed`` of the matrix whose wide view is ``plan.Xh`` (in Xh's precision):
    ``K·Xh``, or ``Xhᵀ·Kᵀ`` in the input's own layout when the wide view is its transpose."""
    K = _mixed_factor(c, plan).to(plan.Xh.dtype)
    mm = partial(split_bf16_matmul, parts=plan.parts) if plan.dtype == torch.bfloat16 else matmul
    return mm(plan.Xh.mT, K.mT) if transposed else mm(K, plan.Xh)


def mixed_gram_factor(
    G: Tensor, c: float, *, tol: float = POLAR_TOL, source_dtype: torch.dtype | None = None
) -> Tensor | None:
    r"""``K`` with ``soft_clip(X, c, method="mixed") = K·X`` for every X with ``XXᵀ = G``: the
    same iteration as :func:`soft_clip_mixed` (whose steps after forming G see only G), from
    G alone, for the Gram route of sharded matrices (:mod:`spectra.optim.distributed`).

    G (float32 or float64, batched) is scaled by a power of two near its largest diagonal entry
    instead of ``max|X|``; powers of two scale exactly, so K equals the single-process one for
    the same G. Returns ``None`` where :func:`soft_clip_mixed` on ``source_dtype`` matrices
    (default: G's dtype) would work in float64 (α > 1e5, or float64 input) but G is float32:
    the caller then passes the float64 Gram matrix. One host read (α).
    """
    c = check_threshold(c, "c")
    check_tol(Options(tol=tol))
    exact = G.dtype == torch.float64
    dmax = G.diagonal(dim1=-2, dim2=-1).amax(dim=-1)[..., None, None].to(torch.float64)
    scale = pow2_floor(dmax.sqrt())  # ≈ √max G_ii = max row norm of X
    x_inv = scale.reciprocal()
    in_range = torch.ones((), dtype=torch.bool, device=G.device)
    Gs, G2, lam = gram_square_and_bound(G * (x_inv * x_inv).to(G.dtype))
    g = bounds(Gs, G2, lam, scale, c, False, exact, x_inv, in_range)
    values = g.request.tolist()
    wants64 = source_dtype == torch.float64 or values[0] > POLAR_FP32_MAX_ALPHA
    if wants64 and not exact:
        return None
    return _mixed_factor(c, decide(None, g, values, tol, None))


def _mixed_factor(c: float, plan: Plan) -> Tensor:
    """``K`` (in the plan's dtype; float32 for split bf16 products) with ``H_c(X) = K·plan.Xh``
    for ``soft_clip_mixed``. The plan's G and G² become M̂ and the first step in their own
    storage, and the iteration frees them once used: a batch's working set holds no Gram matrix
    and no square of it through the steps."""
    split = plan.dtype == torch.bfloat16  # the exact steps by split bf16 products
    parts = plan.parts if split else 0
    mm = partial(split_bf16_matmul, parts=parts) if split else torch.bmm
    wd, coeffs = (torch.float32 if split else plan.dtype), plan.coeffs
    factor = output_factor(c, plan).to(wd)
    batch, m = plan.G.shape[:-2], plan.G.shape[-1]
    if not coeffs:
        plan.take_grams()  # unused: freed before the last product
        return factor * torch.eye(m, dtype=wd, device=factor.device).expand(*batch, m, m)
    wi = plan.w_id.to(wd).reshape(-1, 1, 1)
    wg = plan.w_g.to(wd).reshape(-1, 1, 1)
    exact = exact_steps(coeffs, math.sqrt(1.0 / plan.alpha))
    if exact:
        # M̂ and the first step go to the steps unnamed, so that the steps free each once used
        # (_m_hat first: _first_step takes M̂ from the plan)
        Z, E = _coupled_steps(
            _m_hat(plan, wd, wg, wi),
            coeffs[:exact],
            _first_step(plan, wd, wg, wi),
            parts,
        )
    else:
        _m_hat(plan, wd, wg, wi)
        Z, E = None, plan.take_grams()[0]
    if exact < len(coeffs):
        # the bf16 steps take E in bf16 unnamed (popped from a list), so that they free it
        # once used, and E itself goes before them
        E16 = [E.to(torch.bfloat16)]
        del E
        W = _coupled_steps(E16.pop(), coeffs[exact:])[0].to(wd)  # ≈ E^{-1/2}
        Z = W if Z is None else mm(W, Z)
    return Z.mul_(factor.reshape(-1, 1, 1)).reshape(*batch, m, m)


def _m_hat(plan: Plan, wd: torch.dtype, wg: Tensor, wi: Tensor) -> Tensor:
    """``M̂ = w_G·G + w_I·I`` (a ``(B, m, m)`` batch in ``wd``) in the storage of the plan's G,
    which then holds M̂."""
    m = plan.G.shape[-1]
    plan.G = plan.G.to(wd).reshape(-1, m, m)
    return add_to_diagonal(plan.G.mul_(wg), wi)


def _first_step(plan: Plan, wd: torch.dtype, wg: Tensor, wi: Tensor) -> Tensor:
    """The coupled iteration's first step ``aI + bM̂ + cM̂²`` in the storage of the plan's G²,
    once :func:`_m_hat` has made the plan's G into M̂, through ``M̂² = w_G²·G² + 2w_I·M̂ −
    w_I²·I``: ``c·w_G²·G² + (b + 2c·w_I)·M̂ + (a − c·w_I²)·I``. Takes M̂ and G² from the plan."""
    a, b, c = plan.coeffs[0]
    M_hat, G2 = plan.take_grams()
    Z = G2.to(wd).reshape(M_hat.shape).mul_(c * wg * wg).addcmul_(M_hat, b + 2.0 * c * wi)
    return add_to_diagonal(Z, a - c * wi * wi)


def _fused_quintic(
    E: Tensor, a: float, b: float, c: float, square: Callable[[Tensor], Tensor] | None = None
) -> Tensor:
    """``aI + bE + cE²`` for a ``(B, m, m)`` batch with one fused product (``baddbmm``), which
    sums in float32 and rounds once for bf16 E (emulated through float32 on devices without
    bf16 units, with the same rounding); with ``square``, ``E²`` is ``square(E)`` and the sum
    is formed in its storage."""
    if square is not None:
        return add_to_diagonal(square(E).mul_(c).add_(E, alpha=b), a)
    if E.dtype == torch.bfloat16 and not has_bf16_units(E.device):
        E32 = E.float()
        return add_to_diagonal(torch.baddbmm(E32, E32, E32, beta=b, alpha=c), a).bfloat16()
    return add_to_diagonal(torch.baddbmm(E, E, E, beta=b, alpha=c), a)


def _coupled_steps(
    M_hat: Tensor,
    coeffs: tuple[tuple[float, float, float], ...],
    Z1: Tensor | None = None,
    parts: int = 0,
) -> tuple[Tensor, Tensor | None]:
    """``Z = p_K(…)·…·p_1(M̂)`` and, when the first step's ``Z1 = p_1(M̂)`` is given, also
    ``E = Z M̂ Z``, after the ``K = len(coeffs) ≥ 1`` steps of the coupled iteration of
    :func:`spectra.ops.quintics.coupled_inverse_sqrt`, in M̂'s precision (a ``(B, m, m)`` batch;
    bf16: bf16 products with float32 sums; ``parts`` 2 or 3: float32 M̂ by split bf16 products
    of that many parts).
    Without ``Z1`` the first step is one fused product; each later step takes four products
    (``E = ZY``, ``Q = p(E)``, ``QZ``, ``YQ``), the last one three when E is not wanted.
    ``ZQ`` would equal ``QZ`` (Z, Y and Q are polynomials in M̂), but the coupled iteration is
    stable in this order alone: with ``ZQ`` a spike of 1e5c (float64) diverged. E is symmetric
    (``Z M̂ Z``), and split products form ``E² = EEᵀ`` from two bf16 products
    (:func:`~spectra.ops._common.split_bf16_gram`)."""
    split = parts > 0
    if split:
        square, mm = partial(split_bf16_gram, parts=parts), partial(split_bf16_matmul, parts=parts)
    else:
        square, mm = None, bf16_matmul if M_hat.dtype == torch.bfloat16 else torch.bmm
    want_e = Z1 is not None
    Z = _fused_quintic(M_hat, *coeffs[0], square) if Z1 is None else Z1
    del Z1  # Z alone holds it: the second step frees it
    if len(coeffs) == 1 and not want_e:
        return Z, None
    Y = mm(M_hat, Z)
    del M_hat  # the caller passes it unnamed: freed from here on
    for k, (a, b, cc) in enumerate(coeffs[1:], start=2):
        Q = _fused_quintic(mm(Z, Y), a, b, cc, square)
        more = want_e or k < len(coeffs)
        if split:  # the parts of the operand a product replaces first, and it freed before the
            pieces = split_bf16_right(Z, parts)  # product: the split operands outweigh it
            Z = None
            Z = split_bf16_product(split_bf16_left(Q, parts), pieces, parts)
            del pieces
            if more:
                pieces = split_bf16_left(Y, parts)
                Y = None
                Y = split_bf16_product(pieces, split_bf16_right(Q, parts), parts)
                del pieces
        else:
            Z = mm(Q, Z)
            if more:
                Y = mm(Y, Q)
        del Q  # the next step's quintic would otherwise hold two Q at once
    return Z, (mm(Z, Y) if want_e else None)


def exact_steps(coeffs: tuple[tuple[float, float, float], ...], ell: float) -> int:
    """Steps of ``soft_clip_mixed`` that run in the Gram matrix's precision: until the
    smallest singular value ``ℓ_k = p_k(ℓ_{k−1})`` reaches ``MIXED_BF16_FROM``, and all but
    the last ``MIXED_MAX_BF16_STEPS``."""
    exact = len(coeffs)
    for k, (a, b, c) in enumerate(coeffs):
        if ell >= MIXED_BF16_FROM:
            exact = k
            break
        ell = a * ell + b * ell**3 + c * ell**5
    return max(exact, len(coeffs) - MIXED_MAX_BF16_STEPS)


def _gram_factor(
    G: Tensor, c: float, options: Options, source_dtype: torch.dtype | None
) -> Tensor | None:
    return mixed_gram_factor(G, c, tol=options.tol, source_dtype=source_dtype)


def _finish(X: Tensor, c: float, plan: Plan) -> Tensor:
    return _mixed_run(c, plan, wide_view(X)[1]).to(X.dtype)


def _check(options: Options) -> None:
    check_tol(options)
    if options.ns_dtype not in (None, torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(
            "ns_dtype must be None, torch.bfloat16, torch.float32 or torch.float64 for mixed, "
            f"got {options.ns_dtype!r}"
        )


def _operator():
    op = TwoPhase(exact_precision, _finish, float32_last=True).operator(_gram_factor)
    return dataclasses.replace(op, check=_check)


METHOD = ClipMethod("mixed", soft_clip=_operator())
