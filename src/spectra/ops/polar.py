r"""Method ``"polar"``: the soft clip with matrix products only, by a minimax-polynomial
inverse square root on the Gram side.

With ``G = XXᵀ`` (``m ≤ n``, X scaled by a power of two near ``max|X|``), a bound
``s²_max ≥ λ_max(G)`` and ``α = 1 + s²_max/c²``, the matrix ``M̂ = (I + G/c²)/α`` has
eigenvalues in ``[1/α, 1]``; the coupled iteration of
:func:`spectra.ops.quintics.coupled_inverse_sqrt` gives ``Z ≈ M̂^{-1/2}`` and
``H_c(X) = Z X/√α``. A call runs in two halves around one host read of α (which sets the
schedule and the precision) and of whether the input was finite: :func:`begin` forms the Gram
matrix and the bounds, :func:`end` decides and iterates. :mod:`spectra.ops.mixed` shares the
first half and the plan (:class:`Plan`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from spectra.ops._common import (
    check_finite,
    check_matrix_input,
    check_threshold,
    compute_dtype,
    fp32_products_are_ieee,
    matmul,
    orient,
    pow2_scale,
    split_bf16_gram,
    split_bf16_matmul,
    wide_view,
)
from spectra.ops.base import POLAR_TOL, ClipMethod, GramFactor, Operator, Options, apply_checked
from spectra.ops.eigh import exact_gram_factor, scaled_gram, soft_weight
from spectra.ops.quintics import coupled_inverse_sqrt, inverse_sqrt_schedule

# Above this α = 1 + s²_max/c², rounding of the float32 Gram matrix alone costs more than
# ≈ 1e-3 relative error in the bulk (measured; docs/operators.md), so "polar" switches its
# working precision to float64.
POLAR_FP32_MAX_ALPHA = 1e5


# With ``dtype=torch.bfloat16``, "polar" forms every product from three bf16 products (the Gram
# matrix and G² from two; about 1e-5 relative error each) while α ≤ this bound, where the measured
# error stays below 1.5e-3 (docs/operators.md); beyond it, float32 or float64 as by default.
POLAR_SPLIT_MAX_ALPHA = 1e4


# Largest α each working precision resolves: eigenvalues of M̂ = M/α below 1/α_cap are lifted
# to 1/α_cap. Rounding makes such eigenvalues noise of either sign, and the iteration would
# amplify a negative one without bound; lifting them only shrinks H_c on directions with
# σ/c ≲ 10·√(α/α_cap), which exist only for σ_max/c beyond 1e3 (float32) or 1e6 (float64).
# Split bf16 products (``dtype=torch.bfloat16``) run only while α ≤ POLAR_SPLIT_MAX_ALPHA, so
# their cap lifts nothing.
POLAR_MAX_ALPHA = {
    torch.float64: 1e12,
    torch.float32: 1e6,
    torch.bfloat16: POLAR_SPLIT_MAX_ALPHA,
}

# A capturable call cannot read α, so its split bf16 products (``dtype=torch.bfloat16``) take
# three parts (:func:`~spectra.ops._common.split_bf16_matmul` with ``parts=3``: six bf16
# products, float32's accuracy) and float32's schedule, for every α that float32 resolves. A
# call that reads α takes two parts while ``α ≤ POLAR_SPLIT_MAX_ALPHA``.
CAPTURABLE_SPLIT_PARTS = 3


def max_alpha(wd: torch.dtype, parts: int) -> float:
    """The largest α the working precision ``wd`` resolves (``POLAR_MAX_ALPHA``); split bf16
    products of three parts resolve float32's."""
    if wd == torch.bfloat16 and parts == CAPTURABLE_SPLIT_PARTS:
        wd = torch.float32
    return POLAR_MAX_ALPHA.get(wd, 1e2)


def check_tol(options: Options) -> None:
    """Refuse a ``tol`` outside ``[1e-6, 1)``, and a bad ``ratio_bound``
    (:func:`check_ratio_bound`)."""
    tol = options.tol
    if not (math.isfinite(tol) and 1e-6 <= tol < 1):
        raise ValueError(f"tol must be a number in [1e-06, 1), got {tol!r}")
    check_ratio_bound(options)


def check_ratio_bound(options: Options) -> None:
    """Refuse a ``ratio_bound`` that is not a finite number ``≥ 1`` or comes without
    ``capturable``."""
    bound = options.ratio_bound
    if bound is None:
        return
    if isinstance(bound, bool) or not isinstance(bound, (int, float)):
        raise ValueError(f"ratio_bound must be a number >= 1 or None, got {bound!r}")
    if not (math.isfinite(bound) and bound >= 1):
        raise ValueError(f"ratio_bound must be a finite number >= 1 or None, got {bound!r}")
    if not options.capturable:
        raise ValueError(
            f"ratio_bound={bound!r} bounds the schedule of a call that reads nothing; it needs "
            "capturable=True (a call that reads α needs no bound)"
        )


def _take_grams(holder: Plan | GramState) -> tuple[Tensor, Tensor]:
    """``(G, G²)`` from ``holder``, which holds them no longer: whoever takes them may overwrite
    them, and they are freed once the taker lets go (the peak of a GPU step is the working set
    of one batch, which the Gram matrix and its square would otherwise stay in until the end)."""
    G, G2 = holder.G, holder.G2
    if G is None or G2 is None:
        raise RuntimeError("the Gram matrices of this call were already taken")
    holder.G = holder.G2 = None
    return G, G2


@dataclass
class Plan:
    """What the iteration of a polar call needs once its host read has set the schedule."""

    Xh: Tensor | None  # X / scale in the Gram precision (X itself when x_inv is set)
    G: Tensor | None  # Xh Xhᵀ, until taken (take_grams)
    G2: Tensor | None  # G², until taken
    scale: Tensor  # power of two per matrix (float64)
    r: Tensor  # s_max/c in original units (float64, may be inf)
    w_id: Tensor  # max(1/α, 1/α_cap)
    w_g: Tensor  # (1 − 1/α)/s²_max, scaled units
    lam_safe: Tensor  # s²_max (scaled units), 1 where 0
    alpha: float  # largest α over the batch
    dtype: torch.dtype  # working precision of the iteration
    coeffs: tuple[tuple[float, float, float], ...]  # the quintics to run
    x_inv: Tensor | None  # Xh is X itself, to be multiplied by x_inv (see GramState)
    parts: int = 2  # bf16 parts of each split product (dtype bf16): 2, or 3 (capturable)

    take_grams = _take_grams


@dataclass
class GramState:
    """A polar call's device work before its host read: the first Gram matrix and the bounds.
    :func:`decide` hands G and G² on to the :class:`Plan` (``take_grams``)."""

    G: Tensor | None
    G2: Tensor | None
    scale: Tensor
    r: Tensor
    w_id: Tensor
    w_g: Tensor
    lam_safe: Tensor
    dtype: torch.dtype  # precision of G
    split: bool  # G from split bf16 products
    exact: bool  # float64 wherever the default would choose
    c: float  # the threshold
    # float32 G formed from X itself, then scaled by x_inv² (no scaled copy of X); per-matrix
    # 1/scale (float64, shape (..., 1, 1)), or None for G from X/scale
    x_inv: Tensor | None
    # float64 (3,) on the device: the largest α, whether the input was finite, whether X's
    # scale let G be formed from X itself (see DIRECT_RANGE)
    request: Tensor
    parts: int = 2  # bf16 parts of each split product (2, or 3 in a capturable call)

    take_grams = _take_grams


def scaled_x(Xw: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """``X/scale`` in ``dtype``, exact up to the final rounding (scale is a power of two)."""
    if dtype == torch.float32 and Xw.dtype != torch.float64:
        # float32 passes: inv = 1/scale ∈ [2⁻¹²⁷, 2¹⁴⁹] is split into two float32 powers of two;
        # the first product rounds like the float64 route, the second (≥ 1) is then exact
        inv = scale.reciprocal()
        first = inv.clamp(max=2.0**100)
        return torch.mul(Xw, first.to(torch.float32)).mul_((inv / first).to(torch.float32))
    return (Xw.to(torch.float64) / scale).to(dtype)


def _grams(
    Xh: Tensor, split: bool, x_inv: Tensor | None = None, parts: int = 2
) -> tuple[Tensor, Tensor, Tensor]:
    """``G = X̂X̂ᵀ`` (times ``x_inv²``), ``G²`` and the bound ``s²_max ≥ λ_max(G)`` of
    :func:`gram_square_and_bound`; with ``split``, G and G² (``= GGᵀ``: split G is exactly
    symmetric) by :func:`~spectra.ops._common.split_bf16_gram` of that many ``parts``."""
    square = partial(split_bf16_gram, parts=parts) if split else None
    G = square(Xh) if square is not None else matmul(Xh, Xh.mT)
    if x_inv is not None:
        G.mul_((x_inv * x_inv).to(G.dtype))
    return gram_square_and_bound(G, square)


def gram_square_and_bound(
    G: Tensor, square: Callable[[Tensor], Tensor] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``(G, G², s²_max)`` with ``s²_max = min(max_i Σ_j |G_ij|, ‖G²‖_F^{1/2}) ≥ λ_max``
    (float64; ``‖G²‖_F^{1/2} ≤ ‖G‖_F``, so the Frobenius norm of G would not tighten it). The
    norms are taken in G's precision: rounding can put the bound ~1e-7 below λ_max, which the
    quintics' cushion above 1 absorbs. ``square``: how G² is formed (default ``G @ G``)."""
    G2 = matmul(G, G) if square is None else square(G)
    # max_i Σ_j |G_ij| (matrix_norm(ord=inf) gives the same, six times slower on the CPU)
    gersh = G.abs().sum(-1).amax(-1)
    fro2 = torch.linalg.matrix_norm(G2, ord="fro").sqrt()
    return G, G2, torch.minimum(gersh, fro2).to(torch.float64)


# Scales (powers of two near max|X|) for which a float32 X·Xᵀ can neither overflow nor lose
# terms to underflow: G is then formed from X itself and scaled afterwards.
DIRECT_RANGE = (2.0**-40, 2.0**40)


def gram_state(
    Xw: Tensor, c: float, dtype: torch.dtype | None, direct: bool = True, parts: int = 2
) -> GramState:
    """The part of a polar call before its host read; no host synchronisation. ``parts``: of
    each split bf16 product, where ``dtype`` asks for them."""
    scale = pow2_scale(Xw)
    split = dtype == torch.bfloat16  # split bf16 products while α ≤ POLAR_SPLIT_MAX_ALPHA
    exact = Xw.dtype == torch.float64 or dtype == torch.float64
    if dtype in (None, torch.bfloat16) and not fp32_products_are_ieee(Xw.device):
        exact = True  # TF32 or bf16 float32 products cannot form the Gram matrix
    first = torch.float64 if exact and not split else torch.float32
    x_inv = None
    in_range = torch.ones((), dtype=torch.bool, device=Xw.device)
    if direct and first == torch.float32 and Xw.dtype != torch.float64:
        x_inv = scale.reciprocal()
        in_range = ((scale >= DIRECT_RANGE[0]) & (scale <= DIRECT_RANGE[1])).all()
        G, G2, lam = _grams(Xw.to(torch.float32), split, x_inv, parts)
    else:
        G, G2, lam = _grams(scaled_x(Xw, scale, first), split, parts=parts)
    return bounds(G, G2, lam, scale, c, split, exact, x_inv, in_range, parts)


def bounds(
    G: Tensor,
    G2: Tensor,
    lam: Tensor,
    scale: Tensor,
    c: float,
    split: bool,
    exact: bool,
    x_inv: Tensor | None,
    in_range: Tensor,
    parts: int = 2,
) -> GramState:
    """α and the weights of M̂ from the scaled Gram matrix ``G`` and its bound ``lam``."""
    # r² = s²_max/c² in the original units; α = 1 + r². Everything below stays finite for
    # any finite X and c: w_id = 1/α (0 where r or r² overflows) and w_G = (1 − 1/α)/s²_max
    # (scaled units; 0 where s²_max = 0, since w_id is then 1). Each operation is a kernel
    # launch on a GPU, a dispatch on its host, for a handful of numbers: none is spent on a
    # case the arithmetic already covers.
    scale0 = scale.reshape(scale.shape[:-2])
    r = lam.sqrt() * (scale0 / c)  # may be inf for tiny c
    w_id = torch.reciprocal(1.0 + r * r)
    lam_safe = torch.where(lam > 0, lam, 1.0)
    w_g = (1.0 - w_id) / lam_safe
    # α for the schedule (1/min w_id), and whether the input was finite: an inf or nan entry
    # makes the scale or the Gram matrix non-finite, and so their sum (both are ≥ 0)
    finite = torch.isfinite(scale0 + lam).all()
    alpha = w_id.amin().clamp_min(1e-300).reciprocal()
    request = torch.stack([alpha, finite.to(torch.float64), in_range.to(torch.float64)])
    return GramState(
        G, G2, scale, r, w_id, w_g, lam_safe, G.dtype, split, exact, c, x_inv, request, parts
    )


def regram(
    Xw: Tensor, c: float, g: GramState, values: Sequence[float], dtype: torch.dtype | None
) -> tuple[GramState, Sequence[float]]:
    """``(g, values)``, or the Gram matrix from X/scale and its request when X's scale kept G
    from being formed from X itself (a second host read, for extreme scales only)."""
    if g.x_inv is None or values[2]:
        return g, values
    check_finite(Xw)
    g = gram_state(Xw, c, dtype, direct=False)
    return g, g.request.tolist()


def decide(
    Xw: Tensor | None,
    g: GramState,
    values: Sequence[float] | None,
    tol: float,
    dtype: torch.dtype | None,
    float32_last: bool = False,
    alpha_cap: float | None = None,
) -> Plan:
    """Working precision and schedule from the host read ``values`` (``g.request``); with
    ``Xw=None`` (a factor from the Gram matrix alone) no ``Xh``, and G must be fine as it is.
    ``float32_last``: ``Xh`` is X itself in float32 (not float64) for non-float64 input, for a
    last product in float32 whatever the working precision.

    ``values=None`` (nothing read, see :func:`capturable_precision`): the precision follows
    from the input and the device alone, and the schedule covers every α it resolves, or
    those up to ``alpha_cap`` (eigenvalues of M̂ below ``1/alpha_cap`` then lifted to it)."""
    if values is None:
        wd = capturable_precision(g, dtype)
        alpha_max = max_alpha(wd, g.parts)
        alpha_max = alpha_max if alpha_cap is None else min(alpha_max, alpha_cap)
    else:
        alpha_max, ok, in_range = values
        if not (ok and in_range):
            check_finite(Xw if Xw is not None else g.G, "X" if Xw is not None else "G")
        wd = read_precision(g, alpha_max, dtype)
    if Xw is not None and wd != torch.bfloat16 and (g.split or wd != g.dtype):
        # the first Gram matrix is not accurate enough here: G (from X/scale in column blocks),
        # its bounds and the weights again in wd, on the device (the schedule keeps the α read
        # from the first one)
        G, scale = scaled_gram(Xw, wd)
        ones = torch.ones((), dtype=torch.bool, device=G.device)
        g = bounds(*gram_square_and_bound(G), scale, g.c, False, g.exact, None, ones)
    (G, G2), x_inv, Xh = g.take_grams(), g.x_inv, None  # the plan alone holds them from here
    if Xw is not None:
        if x_inv is None and float32_last and Xw.dtype != torch.float64:
            x_inv = g.scale.reciprocal()
        Xh = Xw.to(torch.float32) if x_inv is not None else scaled_x(Xw, g.scale, g.dtype)
    w_floor = 1.0 / (max_alpha(wd, g.parts) if values is not None else alpha_max)
    coeffs = inverse_sqrt_schedule(math.sqrt(max(1.0 / alpha_max, w_floor)), tol)
    w_id = g.w_id.clamp_min(w_floor)
    return Plan(
        Xh, G, G2, g.scale, g.r, w_id, g.w_g, g.lam_safe, alpha_max, wd, coeffs, x_inv, g.parts
    )


def read_precision(g: GramState, alpha_max: float, dtype: torch.dtype | None) -> torch.dtype:
    """The working precision once α is read: split bf16 products while ``α ≤ 1e4`` when asked,
    ``dtype`` when asked, float64 where exact or for ``α > 1e5``, float32 otherwise."""
    if g.split and alpha_max <= POLAR_SPLIT_MAX_ALPHA:
        return torch.bfloat16
    if dtype is not None and not g.split:
        return dtype
    if g.exact or alpha_max > POLAR_FP32_MAX_ALPHA:
        return torch.float64
    return torch.float32


def capturable_precision(g: GramState, dtype: torch.dtype | None) -> torch.dtype:
    """The working precision of a call that reads nothing (``capturable``): ``dtype`` when asked
    (``torch.bfloat16``: split bf16 products, of three parts, or of two under a bound
    ``α ≤ 1e4``, :func:`TwoPhase.capturable`), float64 where the default would always choose
    it (float64 input, a device whose float32 products are not IEEE), float32 otherwise; α
    beyond 1e5 does not switch it to float64 (see :func:`TwoPhase.capturable`)."""
    if g.split:
        return torch.bfloat16
    if dtype is not None and not g.split:
        return dtype
    return torch.float64 if g.exact and not g.split else torch.float32


def _polar_plan(Xw: Tensor, c: float, tol: float, dtype: torch.dtype | None) -> Plan:
    """Scale, Gram matrices, α bound, working precision and schedule for ``soft_clip_polar``;
    the call's one host synchronisation reads α and whether the input was finite."""
    g = gram_state(Xw, c, dtype)
    g, values = regram(Xw, c, g, g.request.tolist(), dtype)
    return decide(Xw, g, values, tol, dtype)


def polar_steps(
    X: Tensor, c: float, *, tol: float = POLAR_TOL, dtype: torch.dtype | None = None
) -> tuple[int, torch.dtype]:
    """Quintic steps and working precision ``soft_clip(X, c, method="polar", ns_dtype=dtype)``
    would use (``torch.bfloat16``: split bf16 products)."""
    check_matrix_input(X)
    c = check_threshold(c, "c")
    if X.dim() < 2:
        return 0, compute_dtype(X)
    Xw, _ = wide_view(X)
    plan = _polar_plan(Xw, c, tol, dtype)
    return len(plan.coeffs), plan.dtype


def soft_clip_polar(
    X: Tensor, c: float, *, tol: float = POLAR_TOL, dtype: torch.dtype | None = None
) -> Tensor:
    r"""``H_c(X)`` with matrix products only: a minimax-polynomial inverse square root.

    With ``G = XXᵀ`` (``m ≤ n``, after scaling X by a power of two near ``max|X|``),
    ``s²_max = min(‖G‖_F, max_i Σ_j |G_ij|, ‖G²‖_F^{1/2}) ≥ λ_max(G)`` and
    ``α = 1 + s²_max/c²``, the matrix ``M̂ = (I + G/c²)/α`` has eigenvalues in ``[1/α, 1]``.
    The coupled iteration of :func:`spectra.ops.quintics.coupled_inverse_sqrt` with the
    greedy minimax quintics of "The Polar Express" (Amsel et al., 2025) for the interval
    ``[1/√α, 1]`` returns ``Z ≈ M̂^{-1/2}``, and ``H_c(X) = Z X/√α``. The schedule starts at
    the tabulated interval just below ``1/√α`` and stops once every direction is within
    ``tol`` of exact (``tol ≥ 1e-6``), so the relative Frobenius error is ``≤ tol`` in exact
    arithmetic for ``σ_max/c ≤ 1e10``.

    Working precision ``dtype``: by default float32 when ``α ≤ 1e5`` and float64 beyond (the
    float32 Gram matrix's rounding grows like ``ε₃₂·α``); float64 input always uses float64,
    and so does a device whose float32 products run in TF32 or bf16 (on an H100 or A100 float64
    products run at the IEEE float32 rate). A call synchronises with the host once, to read α
    for the schedule and whether the input was finite; the optimizers call it once per batch
    of same-shaped matrices.
    The Gram matrix and ``G²`` are accumulated in float32 at least (bf16/fp16 are upcast).

    ``dtype=torch.bfloat16`` runs every product as three bf16 tensor-core products with float32
    accumulation (:func:`spectra.ops._common.split_bf16_matmul`; the Gram matrix and ``G²`` as
    two, :func:`~spectra.ops._common.split_bf16_gram`), about 1e-5 relative error per product,
    while ``α ≤ 1e4`` (``σ_max/c ≲ 100``), where the measured error stays below 1.5e-3; beyond
    that bound it works as with ``dtype=None``. On a GPU this trades float32 products for two to
    three times as many bf16 ones (an H100 runs bf16
    about 15× faster); on a CPU without bf16 units the bf16 products are emulated in float32,
    so there it is slower than float32 and serves to check the numerics.

    Cost for ``K`` steps: the Gram matrix and the final product (``2m²n`` flops each), ``G²``,
    and ``4K − 3`` products of ``m × m`` matrices (``2m³`` each); the paper's Algorithm 1
    with ``N_s = 10`` takes the same two ``m²n`` products and 30 ``m × m`` products.
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    return apply_checked(METHOD.soft_clip, X, c, Options(ns_dtype=dtype, tol=tol), soft_weight(c))


def _polar_run(Xw: Tensor, c: float, plan: Plan) -> Tensor:
    """The coupled iteration of ``soft_clip_polar`` on the wide ``Xw``, its result in the working
    precision (float32 for split bf16 products)."""
    Xh, wd = plan.Xh, plan.dtype
    # split bf16 products keep float32 operands
    split = partial(split_bf16_matmul, parts=plan.parts)
    store, mm = (torch.float32, split) if wd == torch.bfloat16 else (wd, matmul)
    M_hat, M_hat_sq = _polar_start(plan, store)
    Z = coupled_inverse_sqrt(M_hat, M_hat_sq, plan.coeffs, matmul=mm)
    del M_hat, M_hat_sq
    # the float64 factor multiplies in float64 and rounds once, into the product's own storage
    return mm(Z, Xh.to(store)).mul_(output_factor(c, plan))


def _polar_start(plan: Plan, store: torch.dtype) -> tuple[Tensor, Tensor]:
    """``M̂ = w_G·G + w_I·I`` and ``M̂² = w_G²·G² + 2w_G·w_I·G + w_I²·I`` in ``store``, in the
    storage of the plan's G and G² (which the plan then holds no longer)."""
    G, G2 = plan.take_grams()
    wi, wg = plan.w_id[..., None, None].to(store), plan.w_g[..., None, None].to(store)
    G, G2 = G.to(store), G2.to(store)
    G2.mul_(wg * wg).addcmul_(G, 2.0 * wg * wi).diagonal(dim1=-2, dim2=-1).add_((wi * wi)[..., 0])
    G.mul_(wg).diagonal(dim1=-2, dim2=-1).add_(wi[..., 0])
    return G, G2


def output_factor(c: float, plan: Plan) -> Tensor:
    """The per-matrix factor (float64, shape ``(..., 1, 1)``) with ``H_c(X) = f·Z·Xh`` for
    ``Z ≈ M̂^{-1/2}``: ``scale/√α = scale/hypot(1, r)``, or ``c/√s²_max`` when r overflowed,
    times ``x_inv`` when Xh is X itself."""
    finite = plan.scale.reshape(plan.r.shape) / torch.hypot(torch.ones_like(plan.r), plan.r)
    factor = torch.where(torch.isinf(plan.r), plan.lam_safe.rsqrt().mul_(c), finite)
    factor = factor.reshape(plan.scale.shape)
    return factor if plan.x_inv is None else factor * plan.x_inv


@dataclass(frozen=True)
class TwoPhase:
    """A Gram-side soft clip in two halves around its host read: the Gram matrix and the α
    bound on the device (:meth:`begin`), then the plan and the iteration (:meth:`end`).

    ``gram_dtype(options, X)`` is the precision asked of the Gram matrix of X (``None``:
    chosen from α); ``finish(X, c, plan)`` returns ``H_c(X)`` in X's layout and dtype; with
    ``float32_last`` the plan keeps X itself in float32 for a last product in float32.
    """

    gram_dtype: Callable[[Options, Tensor], torch.dtype | None]
    finish: Callable[[Tensor, float, Plan], Tensor]
    float32_last: bool = False

    def begin(self, X: Tensor, c: float, options: Options) -> tuple[Tensor, GramState]:
        g = gram_state(wide_view(X)[0], c, self.gram_dtype(options, X))
        return g.request, g

    def end(
        self, X: Tensor, c: float, options: Options, g: GramState, values: Sequence[float]
    ) -> Tensor:
        return self._end(X, c, options, g, values)[0]

    def _end(
        self, X: Tensor, c: float, options: Options, g: GramState, values: Sequence[float]
    ) -> tuple[Tensor, GramState]:
        Xw = wide_view(X)[0]
        dtype = self.gram_dtype(options, X)
        g, values = regram(Xw, c, g, values, dtype)
        plan = decide(Xw, g, values, options.tol, dtype, float32_last=self.float32_last)
        return self.finish(X, c, plan), g

    def apply(self, X: Tensor, c: float, options: Options) -> Tensor:
        if options.capturable:
            return self.capturable(X, c, options)
        request, g = self.begin(X, c, options)
        return self.end(X, c, options, g, request.tolist())  # rejects non-finite input

    def capturable(self, X: Tensor, c: float, options: Options) -> Tensor:
        r"""``H_c(X)`` with nothing read on the host: α is not read, so the schedule is the
        one for the largest α the working precision resolves (``POLAR_MAX_ALPHA``: 1e6 in
        float32, 7 quintic steps at ``tol=1e-3``, against 2 for ``α ≤ 10``, 3 for 100 and 4
        for 1e3 when read), and the precision is not raised to float64 for ``α > 1e5``
        (:func:`capturable_precision`): there the error grows like ``ε₃₂·α``. Split bf16
        products (``dtype=torch.bfloat16``) take three parts here (``CAPTURABLE_SPLIT_PARTS``:
        six bf16 products each, float32's accuracy) and the same schedule. A quintic
        schedule for an interval ``[ℓ, 1]`` also brings every narrower interval within
        ``tol``, so a smaller α loses nothing but the extra steps. Non-finite input gives a
        non-finite result. The Gram matrix is formed from ``X/scale`` (no range check).

        ``options.ratio_bound`` (a bound ``b`` on σ_max/c that the caller vouches for): the
        schedule covers ``α ≤ 1 + b²`` alone, or the α its precision resolves where that is
        less (at ``tol=1e-3``: 4 steps for ``b`` from 10 to 31, 5 to 99, 6 to 316, against
        7), and split bf16 products take two parts for ``b ≤ 100`` (whose precision resolves
        ``α ≤ 1e4``: 5 steps). A matrix
        beyond the bound is damped, not amplified: M̂'s eigenvalues below ``1/(1 + b²)`` are
        lifted to it, so its directions of σ below about ``c·√(α/(1 + b²))`` come out shrunk
        by up to ``√((1 + b²)/α)``; its largest ones are still clipped to about c."""
        Xw, dtype = wide_view(X)[0], self.gram_dtype(options, X)
        bound = None if options.ratio_bound is None else float(options.ratio_bound)
        cap = None if bound is None else 1.0 + bound * bound
        two = bound is not None and bound * bound <= POLAR_SPLIT_MAX_ALPHA  # b ≤ 100
        g = gram_state(Xw, c, dtype, direct=False, parts=2 if two else CAPTURABLE_SPLIT_PARTS)
        plan = decide(Xw, g, None, options.tol, dtype, self.float32_last, alpha_cap=cap)
        return self.finish(X, c, plan)

    def with_norm(self, X: Tensor, c: float, options: Options) -> tuple[Tensor, Tensor]:
        """``(H_c(X), s_max)`` with the bound ``s_max`` that set α (float64, one per matrix)."""
        request, g = self.begin(X, c, options)
        Y, g = self._end(X, c, options, g, request.tolist())  # rejects non-finite input
        return Y, (g.r * c).reshape(X.shape[:-2])

    def operator(self, gram_factor: GramFactor) -> Operator:
        """The :class:`~spectra.ops.base.Operator` of a method that runs this way."""
        return Operator(
            self.apply, gram_factor, check=check_tol, with_norm=self.with_norm,
            begin=self.begin, end=self.end, checks_finite=True, capturable=True,
        )  # fmt: skip


def _finish(X: Tensor, c: float, plan: Plan) -> Tensor:
    Xw, transposed = wide_view(X)
    return orient(_polar_run(Xw, c, plan).to(X.dtype), transposed)


#: The Gram route has no polynomial iteration of its own for "polar": it takes the exact clip,
#: which "polar" approximates to its tol.
METHOD = ClipMethod(
    "polar",
    soft_clip=TwoPhase(lambda o, X: o.ns_dtype, _finish).operator(exact_gram_factor(soft_weight)),
)
