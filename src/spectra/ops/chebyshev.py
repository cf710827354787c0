r"""Method ``"chebyshev"``: the soft clip as one polynomial of the Gram matrix, for CPUs without
bf16 units.

``H_c(X) = K·X`` with ``K = w(G)``, ``G = XXᵀ`` (``m ≤ n`` after
:func:`~spectra.ops._common.wide_view``) and the weights of :mod:`spectra.ops.eigh` written in
the eigenvalues ``λ = σ²`` of G: ``w(λ) = (1 + λ/c²)^{-1/2}``. With an upper bound
``u ≥ λ_max(G)`` (the one that sets ``"polar"``'s α, :func:`spectra.ops.polar.
gram_square_and_bound`) and ``L = u/c²``, the eigenvalues map into ``[−1, 1]`` by
``t = 2λ/u − 1``, where the weights are ``g_L(t) = (1 + L(t + 1)/2)^{-1/2}``. ``K = p(T)`` for
``T = 2G/u − I`` and ``p`` the degree-``d`` polynomial that interpolates ``g_L`` at the
Chebyshev points ``t_k = cos(π(k + ½)/(d + 1))``.

``g_L`` is analytic except at ``t = −1 − 2/L``, so the interpolant's error falls like
``ρ^{-d}`` with ``ρ = 1 + 2/L + 2·√((1 + 1/L)/L)`` (Trefethen, *Approximation Theory and
Approximation Practice*, Thm. 8.2), about ``e^{-2d/√L}`` for large L. The degree of each
matrix is the least one whose relative error ``max_t |p(t)/g_L(t) − 1|`` is at most ``tol``
(``1e-3`` by default, ``"polar"``'s target) for its L (:func:`degree_limits`): the error bound
holds on the whole of ``[0, u]``, so no iteration is needed to check it. The relative error of
the weights is that of every singular direction of the result.

The polynomial runs by Paterson and Stockmeyer's scheme (SIAM J. Comput. 2(1), 1973) in the
monomial basis of T: the powers ``T², …, T^s`` (``T²`` from the ``G²`` the bound needs, with no
product), then Horner's rule in ``T^s`` over blocks of s coefficients; ``s`` minimises the
products, ``(s − 2) + ⌈(d + 1)/s⌉ − 1``; a batch runs at its highest degree. (Running the
matrices whose degrees take the same products together, at the highest of theirs, saved a
quarter of the main job's polynomial products but made its optimizer step 2.7 ms slower on a
2-core AVX2 EPYC: small batches and their copies cost more.) The main job's 192-wide matrices
take degrees 2–12, five products of ``m × m`` or fewer besides the Gram matrix and ``K·X``: its
optimizer step is faster than with ``"eigh"`` or ``"mixed"`` on a CPU without bf16 units
(docs/operators.md).
The monomial coefficients of the interpolant grow with the degree (their absolute sum is 7 at
d = 12, 240 at d = 17 and 1e5 at d = 25), and float32 rounding grows with them, so the degree
stops at ``CHEB_MAX_DEGREE``: matrices whose L needs more (``L ≳ 25`` at ``tol = 1e-3``, i.e.
``σ_max ≳ 5c``) take the exact weights of :mod:`spectra.ops.eigh` instead, from the same Gram
matrix; those that a lower bound of u from G alone already puts there skip ``G²``
(:func:`_plan`), so they cost what ``"eigh"`` costs.

Two host reads per call (a lower bound of each σ_max, then the degrees); the Gram route
computes the same polynomial from G alone.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch
from torch import Tensor

from spectra.ops._common import (
    add_to_diagonal,
    compute_dtype,
    fp32_products_are_ieee,
    orient,
    pow2_floor,
    pow2_scale,
    side_by_side,
    wide_view,
)
from spectra.ops.base import ClipMethod, Operator, Options
from spectra.ops.eigh import exact_gram_factor, soft_weight, spectral_map
from spectra.ops.polar import DIRECT_RANGE, check_tol, gram_square_and_bound, scaled_x

#: The highest degree of the polynomial: its monomial coefficients then sum to at most ~240 in
#: absolute value, so float32 rounding adds at most ~1e-5 to the result.
CHEB_MAX_DEGREE = 16
#: Points of [−1, 1] on which :func:`degree_limits` measures an interpolant's relative error:
#: over a hundred per oscillation of the error up to ``CHEB_MAX_DEGREE``.
_GRID = 2001


def weights_in_t(L: Tensor, t: Tensor) -> Tensor:
    """``g_L(t) = (1 + L(t + 1)/2)^{-1/2}``: the soft clip's weights with ``λ = u(t + 1)/2``
    (``L = u/c²``); ``L`` of shape ``(B,)``, ``t`` of shape ``(N,)``, result ``(B, N)``."""
    return torch.rsqrt(1.0 + L[:, None] * (t[None, :] + 1.0) * 0.5)


# Tables computed once, in plain dicts: torch.compile traces through a functools cache and
# warns of "potential silent incorrectness" for it, where it reads a dict as the data it is.
_MONOMIAL: dict[int, Tensor] = {}
_DEGREE_LIMITS: dict[float, tuple[float, ...]] = {}


def _chebyshev_to_monomial(d: int) -> Tensor:
    """Row j: the coefficients of ``T_j(t)`` in ``1, t, …, t^d`` (float64)."""
    if d in _MONOMIAL:
        return _MONOMIAL[d]
    P = torch.zeros(d + 1, d + 1, dtype=torch.float64)
    P[0, 0] = 1.0
    if d >= 1:
        P[1, 1] = 1.0
    for j in range(2, d + 1):  # T_j = 2t·T_{j−1} − T_{j−2}
        P[j, 1:] = 2.0 * P[j - 1, :-1]
        P[j] -= P[j - 2]
    _MONOMIAL[d] = P
    return P


def interpolant(L: Tensor, d: int) -> Tensor:
    """The monomial coefficients ``a`` (float64, ``(B, d + 1)``) of ``p(t) = Σ_k a_k t^k``, the
    degree-``d`` interpolant of ``g_L`` at the ``d + 1`` Chebyshev points, for each L."""
    theta = math.pi * (torch.arange(d + 1, dtype=torch.float64) + 0.5) / (d + 1)
    j = torch.arange(d + 1, dtype=torch.float64)
    basis = torch.cos(j[:, None] * theta[None, :])  # T_j(t_k)
    coeffs = weights_in_t(L.to(torch.float64), torch.cos(theta)) @ basis.T * (2.0 / (d + 1))
    coeffs[:, 0] *= 0.5
    return coeffs @ _chebyshev_to_monomial(d)


def relative_error(L: float, d: int) -> float:
    """``max_t |p(t)/g_L(t) − 1|`` over ``[−1, 1]`` for the degree-``d`` interpolant."""
    Lt = torch.tensor([float(L)], dtype=torch.float64)
    t = torch.linspace(-1.0, 1.0, _GRID, dtype=torch.float64)
    a = interpolant(Lt, d)[0]
    p = torch.zeros_like(t)
    for coeff in a.flip(0):
        p = p * t + coeff
    return float((p / weights_in_t(Lt, t)[0] - 1.0).abs().max())


def degree_limits(tol: float) -> tuple[float, ...]:
    """``L_max(d)`` for ``d = 0, …, CHEB_MAX_DEGREE``: the largest ``L`` (to 0.1%) whose
    degree-``d`` interpolant meets ``tol``; the relative error grows with L for each d, so
    every smaller L meets it too. Found once per ``tol`` by bisection on ``log L``."""
    if tol in _DEGREE_LIMITS:
        return _DEGREE_LIMITS[tol]
    limits = []
    for d in range(CHEB_MAX_DEGREE + 1):
        lo, hi = -30.0, 12.0  # log L: e^-30 meets any tol ≥ 1e-6 at d = 0; e^12 no d ≤ 16 does
        while hi - lo > 1e-3:
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if relative_error(math.exp(mid), d) <= tol else (lo, mid)
        limits.append(math.exp(lo))
    _DEGREE_LIMITS[tol] = tuple(limits)
    return _DEGREE_LIMITS[tol]


def degrees(L: list[float], tol: float) -> list[int | None]:
    """Each matrix's degree: the least ``d`` with ``L ≤ L_max(d)``; ``None`` where no
    ``d ≤ CHEB_MAX_DEGREE`` meets ``tol``."""
    limits = degree_limits(tol)
    return [next((d for d, top in enumerate(limits) if x <= top), None) for x in L]


def block_size(d: int) -> int:
    """``s`` of the Paterson–Stockmeyer scheme: the fewest products ``(s − 2) + ⌈(d + 1)/s⌉ − 1``
    with ``T²`` given (the smaller s on a tie)."""
    return min(range(2, max(d, 2) + 1), key=lambda s: (max(s - 2, 0) + -(-(d + 1) // s) - 1, s))


def polynomial(G: Tensor, G2: Tensor, u: Tensor, a: Tensor) -> Tensor:
    """``p(T) = Σ_k a_k T^k`` with ``T = 2G/u − I`` for a ``(B, m, m)`` batch, given ``G²``,
    ``u`` (float64, ``(B,)``, > 0) and the coefficients ``a`` (float64, ``(B, d + 1)``), in
    G's dtype: the blocks ``B_j = Σ_{i<s} a_{js+i} T^i`` (``J = ⌊d/s⌋ + 1`` of them), then
    ``K = B_{J−1}`` and ``K ← B_j + K·T^s`` for ``j = J − 2, …, 0``.

    ``G`` and ``G2`` are overwritten (with T and T²): on a CPU every fresh batch-sized
    temporary is memory the allocator may have handed back to the system, so a step that
    allocates fewer of them faults in fewer pages (the main job's 16 × 192² batch faulted in
    6.75 MiB a step before, at about 2.6 µs a page on a 2-core AVX2 EPYC)."""
    d = a.shape[-1] - 1
    s = block_size(d)
    lead = (2.0 / u).to(G.dtype)[:, None, None]
    if d >= 2:  # T² = (2/u)²G² − (4/u)G + I: no product
        T2 = add_to_diagonal(G2.mul_(lead.square()).addcmul_(G, lead, value=-2.0), 1.0)
    powers = [None, add_to_diagonal(G.mul_(lead), -1.0)]  # powers[k] = T^k
    if d >= 2:
        powers.append(T2)
    for _ in range(3, s + 1):
        powers.append(torch.bmm(powers[-1], powers[1]))
    a = a.to(G.dtype)[:, :, None, None]

    def block(j: int) -> Tensor:
        k = j * s
        out = powers[1] * a[:, k + 1] if k < d else torch.zeros_like(powers[1])
        for i in range(2, min(s, d - k + 1)):
            out.addcmul_(powers[i], a[:, k + i])
        return add_to_diagonal(out, a[:, k, 0, 0])

    K = block(d // s)
    for j in range(d // s - 1, -1, -1):  # Horner's rule in T^s: K ← B_j + K·T^s in B_j
        K = block(j).baddbmm_(K, powers[s])
    return K


def _gram(Xb: Tensor, wd: torch.dtype) -> tuple[Tensor, Tensor]:
    """``(G, s)`` for a ``(B, m, n)`` batch: the Gram matrix of ``X/s`` in ``wd``, ``s`` a power
    of two near ``max|X|`` (float64, ``(B, 1, 1)``), as :func:`spectra.ops.eigh.scaled_gram`
    forms it. A float32 G is formed from X itself and scaled afterwards where the scales allow
    it (no scaled copy of X), as ``"polar"`` does."""
    scale = pow2_scale(Xb)
    direct = wd == torch.float32 and Xb.dtype != torch.float64
    if direct and bool(((scale >= DIRECT_RANGE[0]) & (scale <= DIRECT_RANGE[1])).all()):
        Xf = Xb.to(torch.float32)
        return (Xf @ Xf.mT).mul_(scale.reciprocal().square().to(torch.float32)), scale
    Xh = scaled_x(Xb, scale, wd)
    return Xh @ Xh.mT, scale


def _plan(
    G: Tensor, scale2: Tensor, c: float, tol: float
) -> tuple[Tensor | None, Tensor, list[int], list[int]]:
    """``(K, u, poly, exact)`` for a ``(B, m, m)`` batch of Gram matrices of ``X/s``
    (``scale2 = s²``, float64 ``(B,)``): the polynomial factor of the matrices ``poly`` (in
    that order; ``None`` if there are none), their bounds ``u ≥ λ_max(G)`` (float64), and the
    matrices ``exact`` whose L needs a higher degree than ``CHEB_MAX_DEGREE``.

    The bound is ``u = min(g, ‖G²‖_F^{1/2})`` with g the largest absolute row sum (Gershgorin),
    and ``‖G²‖_F² ≥ Σ_i ((G²)_ii)² = Σ_i ‖G_{i,:}‖⁴``, so ``min(g, (Σ_i ‖G_{i,:}‖⁴)^{1/4}) ≤ u``
    comes from G alone: the matrices it already puts beyond that degree go to ``exact`` before
    ``G²`` is formed (one host read), and the bounds u of the others decide (a second). The
    split is the one the bounds u give (up to the rounding of the two).
    """
    top = degree_limits(tol)[-1]
    gersh = G.abs().sum(dim=-1).amax(dim=-1).to(torch.float64)
    rows4 = torch.linalg.vector_norm(G, dim=-1).to(torch.float64).pow(4).sum(dim=-1)
    # L = u·s²/c², divided by c twice: c² underflows to 0 for c < 1e-162 (0/0 for a zero G)
    low = (torch.minimum(gersh, rows4.pow(0.25)) * scale2 / c / c).tolist()
    maybe = [i for i, x in enumerate(low) if x <= top]
    exact = [i for i, x in enumerate(low) if not x <= top]  # nan included
    if not maybe:
        return None, scale2.new_zeros(0), [], exact
    if exact:
        rows = torch.tensor(maybe, device=G.device)
        G, scale2 = G[rows], scale2[rows]
    G, G2, u = gram_square_and_bound(G)
    L = (u * scale2 / c / c).cpu()
    found = degrees(L.tolist(), tol)
    keep = [k for k, d in enumerate(found) if d is not None]
    poly = [maybe[k] for k in keep]
    exact = sorted(exact + [maybe[k] for k, d in enumerate(found) if d is None])
    if not keep:
        return None, u[:0], poly, exact
    if len(keep) < len(found):
        rows = torch.tensor(keep, device=G.device)
        G, G2, u, L = G[rows], G2[rows], u[rows], L[keep]
    a = interpolant(L, max(found[k] for k in keep)).to(G.device)
    safe = torch.where(u > 0, u, torch.ones_like(u))  # G = 0: T = −I and p(−1) = 1
    return polynomial(G, G2, safe, a), u, poly, exact


def _precision(X: Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The working precision: ``dtype``, else float64 for float64 input and where float32
    products are not IEEE (TF32, bf16), float32 otherwise."""
    if dtype is not None:
        return dtype
    wd = compute_dtype(X)
    return wd if wd == torch.float64 or fp32_products_are_ieee(X.device) else torch.float64


def _soft_with_norm(X: Tensor, c: float, options: Options) -> tuple[Tensor, Tensor]:
    """``(H_c(X), s_max)``: the polynomial clip where its degree suffices, the exact one of
    :func:`spectra.ops.eigh.spectral_map` on the same Gram matrix elsewhere; ``s_max = √u``
    (``σ_max ≤ s_max ≤ r^{1/4}·σ_max``, as for ``"polar"``), σ_max itself for the exact
    matrices."""
    Xw, transposed = wide_view(X)
    batch, (m, n) = Xw.shape[:-2], Xw.shape[-2:]
    Xb = Xw.reshape(-1, m, n)
    wd = _precision(Xb, options.ns_dtype)
    G, scale = _gram(Xb, wd)
    s = scale.reshape(-1)
    K, u, poly, exact = _plan(G, s.square(), c, options.tol)
    if not exact:
        del G
        Y, norm = (K @ Xb.to(wd)).to(X.dtype), u.sqrt() * s
    elif not poly:
        Y, norm = _exact(Xb, (G, scale), c, options)
    else:
        Y, norm = torch.empty_like(Xb), torch.empty_like(s)
        rows = torch.tensor(poly, device=X.device)
        Y[rows], norm[rows] = (K @ Xb[rows].to(wd)).to(X.dtype), u.sqrt() * s[rows]
        rows = torch.tensor(exact, device=X.device)
        gram = (G[rows], scale[rows])
        del G, K
        Y[rows], norm[rows] = _exact(Xb[rows], gram, c, options)
    return orient(Y.reshape(*batch, m, n), transposed), norm.reshape(batch)


def _exact(
    Xb: Tensor, gram: tuple[Tensor, Tensor], c: float, options: Options
) -> tuple[Tensor, Tensor]:
    """:func:`spectra.ops.eigh.spectral_map`'s soft clip of a ``(B, m, n)`` batch and its σ_max,
    from its Gram matrices ``gram = (G, s)``. Each eigendecomposition runs on one intra-op
    thread, so on a CPU with ``T > 1`` threads, T slices of the batch run side by side, one
    thread each, as ``"eigh"``'s own batches run (:mod:`spectra.ops.batched`)."""
    G, scale = gram
    B, weight = Xb.shape[0], soft_weight(c)
    parts = min(torch.get_num_threads(), B) if Xb.device.type == "cpu" else 1
    if parts < 2:
        return spectral_map(Xb, c, weight, options.ns_dtype, gram)
    Y = torch.empty_like(Xb)
    norm = torch.empty(B, dtype=torch.float64, device=Xb.device)
    grad = torch.is_grad_enabled()  # thread-local: the workers take the caller's

    def run(lo: int, hi: int) -> None:
        with torch.set_grad_enabled(grad):
            part = (G[lo:hi], scale[lo:hi])
            Y[lo:hi], norm[lo:hi] = spectral_map(Xb[lo:hi], c, weight, options.ns_dtype, part)

    edges = [B * k // parts for k in range(parts + 1)]
    calls = [functools.partial(run, lo, hi) for lo, hi in itertools.pairwise(edges)]
    side_by_side(Xb.device, calls, parts)
    return Y, norm


def _gram_factor(
    G: Tensor, c: float, options: Options, source_dtype: torch.dtype | None
) -> Tensor | None:
    """``K`` with ``soft_clip(X, c, method="chebyshev") = K·X`` for ``XXᵀ = G``: the same
    polynomial from G alone (scaled by a power of two near its largest diagonal entry, which
    leaves L and so the degree as they are), the exact factor for the matrices that need it.
    ``None`` for a float32 G of float64 matrices, which the call on X works with in float64."""
    if source_dtype == torch.float64 and G.dtype != torch.float64:
        return None
    batch, m = G.shape[:-2], G.shape[-1]
    Gb = G.reshape(-1, m, m).to(options.ns_dtype or G.dtype)
    dmax = Gb.diagonal(dim1=-2, dim2=-1).amax(dim=-1).to(torch.float64)
    scale2 = pow2_floor(dmax.sqrt()).square()
    K, _, poly, exact = _plan(Gb / scale2.to(Gb.dtype)[:, None, None], scale2, c, options.tol)
    if exact:
        K_exact = exact_gram_factor(soft_weight)(Gb[exact], c, options, source_dtype)
        if K_exact is None:
            return None
        out = torch.empty(Gb.shape, dtype=torch.float64, device=G.device)
        out[exact] = K_exact
        if poly:
            out[poly] = K.to(torch.float64)
        K = out
    return K.reshape(*batch, m, m)


def _check(options: Options) -> None:
    check_tol(options)
    if options.ns_dtype not in (None, torch.float32, torch.float64):
        raise ValueError(
            "ns_dtype must be None, torch.float32 or torch.float64 for chebyshev, "
            f"got {options.ns_dtype!r}"
        )


METHOD = ClipMethod(
    "chebyshev",
    soft_clip=Operator(
        apply=lambda X, c, o: _soft_with_norm(X, c, o)[0],
        gram_factor=_gram_factor,
        check=_check,
        with_norm=_soft_with_norm,
        products_only=True,
    ),
)
