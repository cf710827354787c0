r"""Method ``"eigh"``: the exact operators from the eigendecomposition of the small Gram matrix.

Writing ``X = U diag(σ) Vᵀ`` (``m ≤ n`` after :func:`~spectra.ops._common.wide_view`), every
operator maps X to ``U diag(φ(σ)) Vᵀ = K·X`` with ``K = Q diag(w(σ)) Qᵀ``, where
``G = XXᵀ = Q diag(σ²) Qᵀ`` and ``w(σ) = φ(σ)/σ`` are the operator's weights:

=================  =========================  ================================
operator           ``w(σ) = φ(σ)/σ``
=================  =========================  ================================
``soft_clip``      ``1/√(1 + σ²/c²)``         H_c of the paper, Sec. 5.1
``hard_clip``      ``min(1, c/σ)``            clip^sp_c, Sec. 2
``orthogonalize``  ``1/σ`` (0 for σ ≈ 0)      orth(X) = UVᵀ (Gram route only)
=================  =========================  ================================

The same weights give every method's exact Gram-route factor (:func:`exact_gram_factor`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from spectra.ops._common import (
    compute_dtype,
    fp32_products_are_ieee,
    orient,
    pow2_scale,
    single_thread_lapack,
    wide_view,
)
from spectra.ops.base import ClipMethod, Operator, Options

# The Gram matrix is summed over GRAM_BLOCKS column blocks (of at least GRAM_MIN_BLOCK
# columns), so that its scaled float64 copy of X is an eighth of X at a time. It works in
# float32 while (σ_max/c)² ≤ EIGH_FP32_MAX_RATIO2 and in float64 beyond.
GRAM_BLOCKS = 8
GRAM_MIN_BLOCK = 64
EIGH_FP32_MAX_RATIO2 = 1e4
#: Directions with σ ≤ ORTH_GRAM_TOL·σ_max are dropped by the Gram route's orthogonalization:
#: the float64 eigendecomposition of G resolves σ² only to about ε₆₄·σ²_max.
ORTH_GRAM_TOL = math.sqrt(torch.finfo(torch.float64).eps)

Weight = Callable[[Tensor], Tensor]


def soft_weight(c: float) -> Weight:
    """``w(σ) = 1/√(1+σ²/c²) = 1/hypot(1, σ/c)``: finite for every σ."""
    return lambda sigma: torch.hypot(torch.ones_like(sigma), sigma / c).reciprocal()


def hard_weight(c: float) -> Weight:
    """``w(σ) = min(1, c/σ)``."""
    return lambda sigma: torch.where(sigma > c, c / sigma.clamp_min(c), torch.ones_like(sigma))


def orth_weight(sigma: Tensor) -> Tensor:
    """``w(σ) = 1/σ`` above ``ORTH_GRAM_TOL·σ_max``, 0 below."""
    keep = sigma > sigma.amax(dim=-1, keepdim=True) * ORTH_GRAM_TOL
    return torch.where(keep, sigma.clamp_min(torch.finfo(sigma.dtype).tiny).reciprocal(), 0)


def scaled_gram(Xw: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The small-side Gram matrix ``G = X̂X̂ᵀ`` in ``dtype``, with ``X̂ = X/s``.

    ``s`` is a power of two near ``max|X|`` per matrix (float64, shape ``(..., 1, 1)``), so the
    scaling is exact and G stays finite for entries anywhere in the float range. In float32,
    when every ``1/s`` is a normal float32 number, X̂ is formed directly in float32; otherwise
    (and in float64) the scaled copy is made in float64, over column blocks so that it is an
    eighth of X at a time.
    """
    scale = pow2_scale(Xw)
    if dtype == torch.float32:
        inv = scale.reciprocal()
        if bool(((inv >= 2.0**-120) & (inv <= 2.0**120)).all()):
            Xh = Xw.to(torch.float32) * inv.to(torch.float32)
            return Xh @ Xh.mT, scale
    n = Xw.shape[-1]
    block = max(GRAM_MIN_BLOCK, -(-n // GRAM_BLOCKS))
    G = None
    for j in range(0, n, block):
        Xh = (Xw[..., j : j + block].to(torch.float64) / scale).to(dtype)
        G = Xh @ Xh.mT if G is None else G.add_(Xh @ Xh.mT)
        del Xh
    return G, scale


def _eigh(G: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenvectors Q of G and the singular values ``s·√μ`` of X (float64, ascending)."""
    with single_thread_lapack(G.device):
        mu, Q = torch.linalg.eigh(G)
    return Q, mu.to(torch.float64).clamp_min(0.0).sqrt() * scale.squeeze(-1)


def sigma_max_lower_bound(Xw: Tensor) -> Tensor:
    """A cheap lower bound on each matrix's σ_max (float64): ``‖X v‖`` for ``v`` the direction
    of X's largest row, which is at least that row's norm (one matrix-vector product)."""
    B = Xw.reshape(-1, *Xw.shape[-2:]).to(compute_dtype(Xw))
    rows = torch.linalg.vector_norm(B, dim=-1)
    top = rows.argmax(dim=-1)
    v = B[torch.arange(B.shape[0], device=B.device), top]
    v = v / rows.gather(-1, top[:, None]).clamp_min(torch.finfo(v.dtype).tiny)
    bound = torch.linalg.vector_norm(B @ v[..., None], dim=(-2, -1))
    return torch.maximum(bound, rows.amax(dim=-1)).to(torch.float64)


def _precision(Xw: Tensor, c: float, dtype: torch.dtype | None) -> torch.dtype:
    """The Gram matrix's precision before its eigenvalues are seen."""
    wd = dtype or compute_dtype(Xw)
    if dtype is None and wd == torch.float32 and not fp32_products_are_ieee(Xw.device):
        return torch.float64  # TF32 or bf16 float32 products cannot form the Gram matrix
    if dtype is None and wd == torch.float32 and Xw.numel():
        # a batch that clearly needs float64 goes there first
        if sigma_max_lower_bound(Xw).square().amax() > EIGH_FP32_MAX_RATIO2 * c * c:
            return torch.float64
    return wd


def spectral_map(
    X: Tensor,
    c: float,
    weight: Weight,
    dtype: torch.dtype | None = None,
    gram: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """``X ↦ U diag(σ·w(σ)) Vᵀ`` through the eigendecomposition of the small Gram matrix, and
    each matrix's σ_max (float64, shape ``X.shape[:-2]``) from the same eigenvalues.

    ``weight(sigma)`` returns ``w(σ) = φ(σ)/σ`` as float64 for a clip at threshold ``c``. The
    result is ``K X`` with ``K = Q diag(w) Qᵀ``.

    Precision is chosen from the input when ``dtype`` is None: float32 while every matrix of
    the batch has ``(σ_max/c)² ≤ EIGH_FP32_MAX_RATIO2``, float64 beyond (and for float64
    input, and where float32 products run in TF32 or bf16). Rounding the float32 Gram matrix
    and its eigh moves every eigenvalue by about ``ε₃₂·σ²_max``, which changes the clip's
    weights by up to about ``ε₃₂·σ²_max/(2c²)``; the measured error grows like
    ``1e-7·(σ_max/c)²`` (docs/operators.md), so the bound keeps it near 1e-3. One power step
    from X's largest row bounds σ_max from below, so a batch that clearly needs float64 goes
    there directly; otherwise the float32 eigenvalues decide.

    ``gram = (G, s)`` passes a Gram matrix the caller has formed already, ``G = X̂X̂ᵀ`` of the
    wide view with ``X̂ = X/s`` (``s`` of shape ``(..., 1, 1)``), in the precision
    :func:`scaled_gram` would take or float64: a float32 one is formed again in float64 where
    its largest row norm (``≤ λ_max``) already shows the need, and otherwise kept while its own
    eigenvalues allow it.
    """
    Xw, transposed = wide_view(X)
    if gram is None:
        wd = _precision(Xw, c, dtype)
        G, scale = scaled_gram(Xw, wd)
    else:
        G, scale = gram
        wd = G.dtype
        if dtype is None and wd == torch.float32 and G.numel():
            # ‖G e_i‖ ≤ λ_max(G): a batch that this already shows to need float64 goes there
            low = torch.linalg.vector_norm(G, dim=-1).amax(dim=-1).to(torch.float64)
            low = low * scale.reshape(low.shape).square()  # of X's λ = σ²
            if bool(low.amax() > EIGH_FP32_MAX_RATIO2 * c * c):
                wd = torch.float64
                G, scale = scaled_gram(Xw, wd)
    eig = None
    if dtype is None and wd == torch.float32 and G.numel():
        eig = _eigh(G, scale)
        if bool(eig[1][..., -1].square().amax() > EIGH_FP32_MAX_RATIO2 * c * c):
            eig = None
            wd = torch.float64
            G, scale = scaled_gram(Xw, wd)
    Q, sigma = eig if eig is not None else _eigh(G, scale)
    del G
    top = sigma[..., -1] if sigma.shape[-1] else sigma.new_zeros(sigma.shape[:-1])
    # The last product in float32 unless float32 products are not IEEE (then it stays in wd).
    kd = compute_dtype(Xw) if fp32_products_are_ieee(Xw.device) else wd
    K = ((Q * weight(sigma).to(wd).unsqueeze(-2)) @ Q.mT).to(kd)
    del Q
    Y = (K @ Xw.to(K.dtype)).to(X.dtype)
    return orient(Y, transposed), top


def exact_gram_factor(weight_of: Callable[[float | None], Weight]):
    """The Gram-route factor ``K = Q diag(w(σ)) Qᵀ`` of the float64 eigendecomposition of G,
    for the weights ``weight_of(c)``; ``None`` for a float32 G of a clip with
    ``(σ_max/c)² > EIGH_FP32_MAX_RATIO2``, which :func:`spectral_map` would form in float64."""

    def factor(G: Tensor, c: float | None, options: Options, source_dtype: torch.dtype):
        G64 = G.to(torch.float64)
        with single_thread_lapack(G64.device):
            mu, Q = torch.linalg.eigh(G64)
        if G.dtype == torch.float32 and c is not None:
            if float(mu[..., -1].amax()) > EIGH_FP32_MAX_RATIO2 * c * c:
                return None
        sigma = mu.clamp_min(0.0).sqrt()
        return (Q * weight_of(c)(sigma).unsqueeze(-2)) @ Q.mT

    return factor


def _soft_with_norm(X: Tensor, c: float, options: Options) -> tuple[Tensor, Tensor]:
    return spectral_map(X, c, soft_weight(c), options.ns_dtype)


METHOD = ClipMethod(
    "eigh",
    soft_clip=Operator(
        apply=lambda X, c, o: spectral_map(X, c, soft_weight(c), o.ns_dtype)[0],
        gram_factor=exact_gram_factor(soft_weight),
        with_norm=_soft_with_norm,
    ),
    hard_clip=Operator(
        apply=lambda X, c, o: spectral_map(X, c, hard_weight(c))[0],
        gram_factor=exact_gram_factor(hard_weight),
    ),
)
