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
dtype and device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from spectra.ops._common import (
    bf16_matmul,
    check_finite,
    check_matrix_input,
    check_threshold,
    compute_dtype,
    fp32_products_are_ieee,
    single_thread_lapack,
    split_bf16_matmul,
    wide_view,
)
from spectra.ops.polar import (
    ORTH_COEFFS,
    coupled_inverse_sqrt,
    inverse_sqrt_schedule,
)
from spectra.validate import check_int

SoftClipMethod = Literal["auto", "eigh", "svd", "paper", "polar", "mixed"]
HardClipMethod = Literal["auto", "eigh", "svd"]
OrthMethod = Literal["auto", "svd", "muon", "polar_express"]

# Target relative error per singular direction of ``method="polar"`` (exact arithmetic).
POLAR_TOL = 1e-3
# Above this α = 1 + s²_max/c², rounding of the float32 Gram matrix alone costs more than
# ≈ 1e-3 relative error in the bulk (measured; docs/operators.md), so "polar" switches its
# working precision to float64.
POLAR_FP32_MAX_ALPHA = 1e5
# With ``dtype=torch.bfloat16``, "polar" forms every product from three bf16 products
# (split_bf16_matmul, about 1e-5 relative error each) while α ≤ this bound, where the measured
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

# soft_clip_mixed runs its steps in bf16 once every singular value of the iterate is at
# least this (relative to the largest, ≈ 1): bf16 rounding then costs each direction at most
# ≈ 2⁻⁹/MIXED_BF16_FROM of its size.
MIXED_BF16_FROM = 0.2

# Method "eigh" sums the Gram matrix over GRAM_BLOCKS column blocks (of at least
# GRAM_MIN_BLOCK columns), so that its scaled float64 copy of X is an eighth of X at a time.
# It works in float32 while (σ_max/c)² ≤ EIGH_FP32_MAX_RATIO2 and in float64 beyond.
GRAM_BLOCKS = 8
GRAM_MIN_BLOCK = 64
EIGH_FP32_MAX_RATIO2 = 1e4

# Coefficients of the classic quintic Newton–Schulz iteration used by Muon
# (K. Jordan et al., 2024): p(x) = a x + b x³ + c x⁵, 5 steps.
MUON_NS_COEFFS = (3.4445, -4.7750, 2.0315)


# --------------------------------------------------------------------------- helpers


def _vector_rule(x: Tensor, weight_of_norm) -> Tensor:
    """Apply ``x ↦ x · w(‖x‖)`` to a 1-D tensor, with ``w(r) = φ(r)/r``."""
    wd = compute_dtype(x)
    xw = x.to(wd)
    r = torch.linalg.vector_norm(xw)
    return (xw * weight_of_norm(r)).to(x.dtype)


def _scaled_gram(Xw: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The small-side Gram matrix ``G = X̂X̂ᵀ`` in ``dtype``, with ``X̂ = X/s``.

    ``s`` is a power of two near ``max|X|`` per matrix (float64, shape ``(..., 1, 1)``), so the
    scaling is exact and G stays finite for entries anywhere in the float range. In float32,
    when every ``1/s`` is a normal float32 number, X̂ is formed directly in float32; otherwise
    (and in float64) the scaled copy is made in float64, over column blocks so that it is an
    eighth of X at a time.
    """
    scale = _pow2_scale(Xw)
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


def _sigma_max_lower_bound(Xw: Tensor) -> Tensor:
    """A cheap lower bound on each matrix's σ_max (float64): ``‖X v‖`` for ``v`` the direction
    of X's largest row, which is at least that row's norm (one matrix-vector product)."""
    B = Xw.reshape(-1, *Xw.shape[-2:]).to(compute_dtype(Xw))
    rows = torch.linalg.vector_norm(B, dim=-1)
    top = rows.argmax(dim=-1)
    v = B[torch.arange(B.shape[0], device=B.device), top]
    v = v / rows.gather(-1, top[:, None]).clamp_min(torch.finfo(v.dtype).tiny)
    bound = torch.linalg.vector_norm(B @ v[..., None], dim=(-2, -1))
    return torch.maximum(bound, rows.amax(dim=-1)).to(torch.float64)


def _spectral_map_eigh(
    X: Tensor, c: float, weight, dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor]:
    """``X ↦ U diag(σ·w(σ)) Vᵀ`` through the eigen-decomposition of the small Gram matrix, and
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
    """
    if X.numel() == 0:
        return X.clone(), torch.zeros(X.shape[:-2], dtype=torch.float64, device=X.device)
    Xw, transposed = wide_view(X)
    wd = dtype or compute_dtype(Xw)
    if dtype is None and wd == torch.float32 and not fp32_products_are_ieee(Xw.device):
        wd = torch.float64  # TF32 or bf16 float32 products cannot form the Gram matrix
    limit = EIGH_FP32_MAX_RATIO2 * c * c
    if dtype is None and wd == torch.float32 and Xw.numel():
        # a batch that clearly needs float64 goes there first
        if _sigma_max_lower_bound(Xw).square().amax() > limit:
            wd = torch.float64
    G, scale = _scaled_gram(Xw, wd)
    eig = None
    if dtype is None and wd == torch.float32 and G.numel():
        eig = _eigh(G, scale)
        if bool(eig[1][..., -1].square().amax() > limit):
            eig = None
            wd = torch.float64
            G, scale = _scaled_gram(Xw, wd)
    Q, sigma = eig if eig is not None else _eigh(G, scale)
    del G
    top = sigma[..., -1] if sigma.shape[-1] else sigma.new_zeros(sigma.shape[:-1])
    # The last product in float32 unless float32 products are not IEEE (then it stays in wd).
    kd = compute_dtype(Xw) if fp32_products_are_ieee(Xw.device) else wd
    K = ((Q * weight(sigma).to(wd).unsqueeze(-2)) @ Q.mT).to(kd)
    del Q
    Y = (K @ Xw.to(K.dtype)).to(X.dtype)
    return (Y.mT if transposed else Y), top


def _spectral_map_svd(X: Tensor, phi) -> Tensor:
    """``X ↦ U diag(φ(σ)) Vᵀ`` through a float64 SVD (the reference)."""
    X64 = X.to(torch.float64)
    U, S, Vh = torch.linalg.svd(X64, full_matrices=False)
    return ((U * phi(S).unsqueeze(-2)) @ Vh).to(X.dtype)


def soft_clip_method(method: str, device: torch.device) -> str:
    """The method ``soft_clip(..., method=method)`` runs on ``device``: ``"auto"`` resolved."""
    return _default_method(device) if method == "auto" else method


def _default_method(device: torch.device) -> str:
    # On CPU, eigh of the small Gram matrix in float64 is exact and cheaper than any
    # Newton–Schulz schedule; on GPUs, matmul-only iterations win (docs/operators.md).
    return "polar" if device.type == "cuda" else "eigh"


def _default_hard_method(X: Tensor) -> str:
    # min(σ, c) has a kink at c, which polynomial iterations resolve only slowly; the
    # float64 eigh of the small Gram matrix is exact on every device.
    return "eigh"


# --------------------------------------------------------------------------- soft clip


def _soft_weight(c: float):
    def weight(sigma: Tensor) -> Tensor:
        # φ(σ)/σ = 1/√(1+σ²/c²) = 1/hypot(1, σ/c): finite for every σ.
        return torch.hypot(torch.ones_like(sigma), sigma / c).reciprocal()

    return weight


def soft_clip(
    X: Tensor,
    c: float,
    *,
    method: SoftClipMethod = "auto",
    ns_steps: int = 10,
    ns_dtype: torch.dtype | None = None,
    tol: float = POLAR_TOL,
) -> Tensor:
    r"""Soft spectral clipping ``H_c(X) = (I + XXᵀ/c²)^{-1/2} X``.

    Maps each singular value σ of X to ``h_c(σ) = σ/√(1+σ²/c²)``, which is close to σ
    for σ ≪ c and saturates at c for σ ≫ c; ``h_c(σ) ≤ min(σ, c)``.

    Args:
        X: tensor whose last two dimensions are the matrix; 1-D tensors use the vector rule.
        c: threshold, finite and > 0.
        method: ``"auto"`` (default: ``"polar"`` on CUDA, ``"eigh"`` elsewhere),
            ``"eigh"`` (exact: float64 eigh of the smaller Gram matrix), ``"svd"`` (exact:
            float64 SVD), ``"polar"`` (matmul-only: coupled minimax-polynomial iteration for
            the inverse square root, see :func:`soft_clip_polar`), or ``"paper"``
            (Algorithm 1 of the paper with the Newton–Schulz inverse square root,
            ``ns_steps`` iterations in ``ns_dtype``; kept for reproduction).
        ns_steps: Newton–Schulz steps for ``method="paper"`` (the paper's N_s).
        ns_dtype: working precision for ``method="paper"`` (default: float32, or float64
            for float64 input) and ``method="polar"`` (default: chosen from α;
            ``torch.bfloat16``: split bf16 products while ``α ≤ 1e4``, see
            :func:`soft_clip_polar`).
        tol: relative error per singular direction that ``method="polar"`` iterates to.
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    method = soft_clip_method(method, X.device)
    if X.dim() > 1 and method == "polar":
        return soft_clip_polar(X, c, tol=tol, dtype=ns_dtype)
    if X.dim() > 1 and method == "mixed":
        return soft_clip_mixed(X, c, tol=tol)
    if X.dim() > 1 and method == "paper":
        return soft_clip_paper(X, c, ns_steps=ns_steps, dtype=ns_dtype)
    check_finite(X)
    if X.dim() == 1:
        return _vector_rule(X, lambda r: torch.hypot(torch.ones_like(r), r / c).reciprocal())
    if method == "eigh":
        return _spectral_map_eigh(X, c, _soft_weight(c), ns_dtype)[0]
    if method == "svd":
        return _spectral_map_svd(X, lambda s: s * _soft_weight(c)(s))
    raise ValueError(
        f"unknown soft_clip method {method!r}; expected auto, eigh, svd, polar, mixed or paper"
    )


@dataclass
class SoftClipPending:
    """A :func:`soft_clip` call between its device work and its host read.

    ``request`` (float64, 1-D, on the input's device) holds what the call must read on the
    host: for the matmul-only methods the batch's largest α and whether the input was finite,
    for the others nothing (they run whole in :func:`soft_clip_end`).
    """

    request: Tensor
    c: float
    method: str
    ns_steps: int
    ns_dtype: torch.dtype | None
    tol: float
    gram: _PolarGram | None = field(default=None, repr=False)


def soft_clip_begin(
    X: Tensor,
    c: float,
    *,
    method: SoftClipMethod = "auto",
    ns_steps: int = 10,
    ns_dtype: torch.dtype | None = None,
    tol: float = POLAR_TOL,
) -> SoftClipPending:
    """The first half of ``soft_clip(X, c, ...)``: for ``"polar"`` and ``"mixed"`` (and
    ``"auto"`` where it picks ``"polar"``), the Gram matrices and the α bound, without a host
    synchronisation. Reading ``request`` for many calls at once (one ``torch.cat(...).tolist()``)
    and passing each its values with :func:`soft_clip_end` gives one host synchronisation for
    all of them. The arguments are checked here, as by :func:`soft_clip`."""
    check_matrix_input(X)
    c = check_threshold(c, "c")
    method = soft_clip_method(method, X.device)
    if method in ("polar", "mixed"):
        _check_tol(tol)
    pending = SoftClipPending(
        torch.empty(0, dtype=torch.float64, device=X.device), c, method, ns_steps, ns_dtype, tol
    )
    if method in ("polar", "mixed") and X.dim() > 1 and X.numel():
        dtype = ns_dtype if method == "polar" else None
        pending.gram = _polar_gram(wide_view(X)[0], c, dtype)
        pending.request = pending.gram.request
    return pending


def soft_clip_end(X: Tensor, pending: SoftClipPending, values: Sequence[float]) -> Tensor:
    """The second half of :func:`soft_clip_begin`: ``H_c(X)`` for the same ``X``, given the
    host values of ``pending.request``."""
    p = pending
    if p.gram is None:
        return soft_clip(
            X, p.c, method=p.method, ns_steps=p.ns_steps, ns_dtype=p.ns_dtype, tol=p.tol
        )
    Xw, transposed = wide_view(X)
    if p.method == "polar":
        plan = _polar_decide(Xw, p.gram, values, p.tol, p.ns_dtype)
        return _orient(_polar_run(Xw, p.c, plan).to(X.dtype), transposed)
    plan = _polar_decide(Xw, p.gram, values, p.tol, None)
    return _orient(_mixed_run(Xw, p.c, plan).to(X.dtype), transposed)


def soft_clip_with_norm(
    X: Tensor,
    c: float,
    *,
    method: SoftClipMethod = "auto",
    ns_steps: int = 10,
    ns_dtype: torch.dtype | None = None,
    tol: float = POLAR_TOL,
) -> tuple[Tensor, Tensor]:
    r"""``(H_c(X), σ̂_max(X))``: :func:`soft_clip` and each matrix's spectral scale, read off the
    Gram matrix the clip forms anyway (no extra pass over X).

    ``σ̂_max`` is float64 with shape ``X.shape[:-2]`` (``()`` for a 1-D X):

    * ``"eigh"``, ``"svd"``: σ_max itself (the largest eigenvalue of the Gram matrix);
    * ``"polar"``, ``"mixed"``: the bound ``s_max = min(‖G‖_F, max_i Σ_j |G_ij|,
      ‖G²‖_F^{1/2})^{1/2}`` that sets their α, with ``σ_max ≤ s_max ≤ r^{1/4}·σ_max`` for a
      matrix of rank r (equal to σ_max when one direction dominates);
    * ``"paper"``: Algorithm 1's ``s_max = min(‖G‖_F, max_i Σ_j |G_ij|)^{1/2}``
      (``σ_max ≤ s_max ≤ r^{1/2}·σ_max``);
    * a 1-D X: its Euclidean norm.

    The arguments are those of :func:`soft_clip`, and ``H_c(X)`` is exactly what it returns.
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    method = soft_clip_method(method, X.device)
    batch = X.shape[:-2] if X.dim() > 1 else ()
    if X.dim() == 1:
        check_finite(X)
        norm = torch.linalg.vector_norm(X.to(torch.float64))
        return soft_clip(X, c, method="eigh"), norm
    if X.numel() == 0:
        return X.clone(), X.new_zeros(batch, dtype=torch.float64)
    if method in ("polar", "mixed"):
        pending = soft_clip_begin(X, c, method=method, ns_dtype=ns_dtype, tol=tol)
        Y = soft_clip_end(X, pending, pending.request.tolist())  # rejects non-finite input
        return Y, (pending.gram.r * c).reshape(batch)
    if method == "paper":
        check_finite(X)
        check_int("ns_steps", ns_steps, low=0)
        Y, s2 = _soft_clip_paper(X, c, ns_steps, ns_dtype)
        return Y, s2.to(torch.float64).sqrt()
    check_finite(X)
    if method == "eigh":
        return _spectral_map_eigh(X, c, _soft_weight(c), ns_dtype)
    if method == "svd":
        norm = torch.linalg.matrix_norm(X.to(torch.float64), ord=2)
        return soft_clip(X, c, method="svd"), norm
    raise ValueError(
        f"unknown soft_clip method {method!r}; expected auto, eigh, svd, polar, mixed or paper"
    )


def _check_tol(tol: float) -> None:
    if not (math.isfinite(tol) and 1e-6 <= tol < 1):
        raise ValueError(f"tol must be a number in [1e-06, 1), got {tol!r}")


def _pow2_scale(X: Tensor) -> Tensor:
    """Per-matrix power of two near ``max|X|`` (float64, 1 for all-zero matrices)."""
    amax = X.abs().amax(dim=(-2, -1), keepdim=True).to(torch.float64)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    return torch.exp2(torch.floor(torch.log2(safe)))


@dataclass
class _PolarPlan:
    Xh: Tensor  # X / scale in the Gram precision
    G: Tensor  # Xh Xhᵀ
    G2: Tensor  # G²
    scale: Tensor  # power of two per matrix (float64)
    r: Tensor  # s_max/c in original units (float64, may be inf)
    w_id: Tensor  # max(1/α, 1/α_cap)
    w_g: Tensor  # (1 − 1/α)/s²_max, scaled units
    lam_safe: Tensor  # s²_max (scaled units), 1 where 0
    alpha: float  # largest α over the batch
    dtype: torch.dtype  # working precision of the iteration
    coeffs: tuple[tuple[float, float, float], ...]  # the quintics to run


@dataclass
class _PolarGram:
    """A polar call's device work before its host read: the first Gram matrix and the bounds."""

    G: Tensor
    G2: Tensor
    scale: Tensor
    r: Tensor
    w_id: Tensor
    w_g: Tensor
    lam_safe: Tensor
    dtype: torch.dtype  # precision of G
    split: bool  # G from split bf16 products
    exact: bool  # float64 wherever the default would choose
    request: Tensor  # float64 (2,) on the device: the largest α, whether the input was finite


def _polar_xh(Xw: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    return (Xw.to(torch.float64) / scale).to(dtype)  # exact: scale is a power of two


def _polar_grams(Xh: Tensor, split: bool) -> tuple[Tensor, Tensor, Tensor]:
    """``G = X̂X̂ᵀ``, ``G²`` and ``s²_max = min(‖G‖_F, max_i Σ_j |G_ij|, ‖G²‖_F^{1/2})``."""
    mm = split_bf16_matmul if split else torch.matmul
    G = mm(Xh, Xh.mT)
    G2 = mm(G, G)
    G64 = G.to(torch.float64)
    fro = torch.linalg.matrix_norm(G64, ord="fro")
    gersh = G64.abs().sum(dim=-1).amax(dim=-1)
    fro2 = torch.linalg.matrix_norm(G2.to(torch.float64), ord="fro").sqrt()
    return G, G2, torch.minimum(torch.minimum(fro, gersh), fro2)


def _polar_gram(Xw: Tensor, c: float, dtype: torch.dtype | None) -> _PolarGram:
    """The part of a polar call before its host read; no host synchronisation."""
    scale = _pow2_scale(Xw)
    split = dtype == torch.bfloat16  # split bf16 products while α ≤ POLAR_SPLIT_MAX_ALPHA
    exact = Xw.dtype == torch.float64 or dtype == torch.float64
    if dtype in (None, torch.bfloat16) and not fp32_products_are_ieee(Xw.device):
        exact = True  # TF32 or bf16 float32 products cannot form the Gram matrix
    first = torch.float64 if exact and not split else torch.float32
    G, G2, lam = _polar_grams(_polar_xh(Xw, scale, first), split)
    # r² = s²_max/c² in the original units; α = 1 + r². Everything below stays finite for
    # any finite X and c: w_id = 1/α and w_G = (1 − 1/α)/s²_max (scaled units).
    scale0 = scale.squeeze(-1).squeeze(-1)
    r = lam.sqrt() * (scale0 / c)  # may be inf for tiny c
    w_id = torch.reciprocal(1.0 + r * r)
    w_id = torch.where(torch.isinf(r), torch.zeros_like(w_id), w_id)
    lam_safe = torch.where(lam > 0, lam, torch.ones_like(lam))
    w_g = torch.where(lam > 0, (1.0 - w_id) / lam_safe, torch.zeros_like(lam))
    # α for the schedule, and whether the input was finite (an inf or nan entry makes the
    # scale or the Gram matrix non-finite)
    finite = torch.isfinite(scale).all() & torch.isfinite(lam).all()
    request = torch.stack([(1.0 / w_id.clamp_min(1e-300)).max(), finite.to(torch.float64)])
    return _PolarGram(G, G2, scale, r, w_id, w_g, lam_safe, first, split, exact, request)


def _polar_decide(
    Xw: Tensor, g: _PolarGram, values: Sequence[float], tol: float, dtype: torch.dtype | None
) -> _PolarPlan:
    """Working precision and schedule from the host read ``values`` (``g.request``)."""
    alpha_max, ok = values
    if not ok:
        check_finite(Xw)
    if g.split and alpha_max <= POLAR_SPLIT_MAX_ALPHA:
        wd = torch.bfloat16
    elif dtype is not None and not g.split:
        wd = dtype
    elif g.exact or alpha_max > POLAR_FP32_MAX_ALPHA:
        wd = torch.float64
    else:
        wd = torch.float32
    G, G2 = g.G, g.G2
    if wd != torch.bfloat16 and (g.split or wd != g.dtype):
        # the split Gram matrix is not accurate enough here
        G, G2, _ = _polar_grams(_polar_xh(Xw, g.scale, wd), False)
    Xh = _polar_xh(Xw, g.scale, torch.float32 if wd == torch.bfloat16 else wd)
    w_floor = 1.0 / POLAR_MAX_ALPHA.get(wd, 1e2)
    coeffs = inverse_sqrt_schedule(math.sqrt(max(1.0 / alpha_max, w_floor)), tol)
    w_id = g.w_id.clamp_min(w_floor)
    return _PolarPlan(Xh, G, G2, g.scale, g.r, w_id, g.w_g, g.lam_safe, alpha_max, wd, coeffs)


def _polar_plan(Xw: Tensor, c: float, tol: float, dtype: torch.dtype | None) -> _PolarPlan:
    """Scale, Gram matrices, α bound, working precision and schedule for ``soft_clip_polar``;
    the call's one host synchronisation reads α and whether the input was finite."""
    g = _polar_gram(Xw, c, dtype)
    return _polar_decide(Xw, g, g.request.tolist(), tol, dtype)


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
    The coupled iteration of :func:`spectra.ops.polar.coupled_inverse_sqrt` with the
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

    ``dtype=torch.bfloat16`` runs every product, the Gram matrix's included, as three bf16
    tensor-core products with float32 accumulation (:func:`spectra.ops._common.split_bf16_matmul`,
    about 1e-5 relative error per product) while ``α ≤ 1e4`` (``σ_max/c ≲ 100``), where the
    measured error stays below 1.5e-3; beyond that bound it works as with ``dtype=None``. On a
    GPU this trades float32 products for three times as many bf16 ones (an H100 runs bf16
    about 15× faster); on a CPU without bf16 units the bf16 products are emulated in float32,
    so there it is slower than float32 and serves to check the numerics.

    Cost for ``K`` steps: the Gram matrix and the final product (``2m²n`` flops each), ``G²``,
    and ``4K − 3`` products of ``m × m`` matrices (``2m³`` each); the paper's Algorithm 1
    with ``N_s = 10`` takes the same two ``m²n`` products and 30 ``m × m`` products.
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    _check_tol(tol)
    if X.dim() == 1:
        return soft_clip(X, c, method="eigh")
    if X.numel() == 0:
        return X.clone()
    pending = soft_clip_begin(X, c, method="polar", ns_dtype=dtype, tol=tol)
    return soft_clip_end(X, pending, pending.request.tolist())  # rejects non-finite input


def _polar_run(Xw: Tensor, c: float, plan: _PolarPlan) -> Tensor:
    """The coupled iteration of ``soft_clip_polar`` on the wide ``Xw`` (float64 result)."""
    Xh, G, G2, wd, coeffs = plan.Xh, plan.G, plan.G2, plan.dtype, plan.coeffs
    w_id, w_g, r, lam_safe, scale = plan.w_id, plan.w_g, plan.r, plan.lam_safe, plan.scale
    wi, wg = w_id[..., None, None], w_g[..., None, None]
    eye = torch.eye(G.shape[-1], dtype=torch.float64, device=G.device)
    G64 = G.to(torch.float64)
    M_hat = wg * G64 + wi * eye
    M_hat_sq = (wg * wg) * G2.to(torch.float64) + (2.0 * wg * wi) * G64 + (wi * wi) * eye
    # split bf16 products keep float32 operands
    store, mm = (torch.float32, split_bf16_matmul) if wd == torch.bfloat16 else (wd, torch.matmul)
    Z = coupled_inverse_sqrt(M_hat.to(store), M_hat_sq.to(store), coeffs, matmul=mm)
    # H = Z X/√α; in original units the factor is scale/√α = scale/hypot(1, r), or c/√s²_max
    # when r overflowed.
    scale0 = scale.squeeze(-1).squeeze(-1)
    finite_factor = scale0 / torch.hypot(torch.ones_like(r), r)
    factor = torch.where(torch.isinf(r), c / lam_safe.sqrt(), finite_factor)[..., None, None]
    return mm(Z, Xh.to(store)).to(torch.float64) * factor


def soft_clip_mixed(X: Tensor, c: float, *, tol: float = POLAR_TOL) -> Tensor:
    r"""``H_c(X)`` by a polar iteration on ``[X/c, I]`` whose steps after the first run in bf16.

    ``H_c(X)/c`` is the first block of the polar factor of the ``m × (n+m)`` matrix
    ``B = [X/c, I]`` (``m ≤ n``): ``BBᵀ = M = I + XXᵀ/c²``, and
    ``M^{-1/2}B = [M^{-1/2}X/c, M^{-1/2}]``. With ``α`` and the quintics ``p_k`` of
    :func:`soft_clip_polar` (the singular values of ``B₀ = B/√α`` lie in ``[1/√α, 1]``),
    each step sets ``E = BBᵀ``, ``Q = aI + bE + cE²`` and ``B ← QB``, mapping every singular
    value ``s`` to ``p_k(s)``; at the end ``H_c(X) = c·B₁`` (``B₁``: the first ``n`` columns).

    Precision: the Gram matrix ``XXᵀ``, ``M̂²`` and the first step ``QB₀`` run in float32
    (float64 where :func:`soft_clip_polar` would use it: α > 1e5, TF32 or bf16 float32
    products, float64 input); every later product runs in bf16 with float32 accumulation
    (:func:`spectra.ops._common.bf16_matmul`). The first step must be exact: rounding X to
    bf16 moves the bulk of the spectrum by ``≈ 4e-3·σ_max``, which is the paper's error on a
    spiked input, while after one step the spike's singular value is ≈ 1 and the bulk's has
    grown by the quintic's slope (≈ 3 to 8), so later rounding costs ``≈ 4e-3`` of ``‖H_c‖``
    whatever α is. A polynomial step cannot undo an earlier step's rounding (it acts on the
    rounded iterate), so a float32 step at the end would not restore accuracy; the error is
    the bf16 floor, measured at 3–9e-3 for α up to 1e6 (docs/operators.md), against 5e-4 for
    ``method="polar"``.

    Cost for ``K`` steps, ``m ≤ n``: float32 ``2m²n`` (Gram), ``2m³`` (``M̂²``) and ``2m²n``
    (first step); bf16 ``(K−1)·(4m²(n+m) + 2m³)``. The paper's Algorithm 1 (``N_s = 10``) takes
    ``4m²n + 60m³`` in bf16. One host synchronisation per call, as in :func:`soft_clip_polar`.
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    _check_tol(tol)
    if X.dim() == 1:
        return soft_clip(X, c, method="eigh")
    if X.numel() == 0:
        return X.clone()
    pending = soft_clip_begin(X, c, method="mixed", tol=tol)
    return soft_clip_end(X, pending, pending.request.tolist())  # rejects non-finite input


def _mixed_run(Xw: Tensor, c: float, plan: _PolarPlan) -> Tensor:
    """The iteration of ``soft_clip_mixed`` on the wide ``Xw`` (float64 result)."""
    wd, coeffs = plan.dtype, plan.coeffs
    # B₀ = [√w_G·X̂, √w_I·I] with X̂ = X/scale and w_G = 1/((c/scale)² + s²_max) = scale²·w_I/c²,
    # through hypot: finite for tiny and huge c, 1/s_max when s_max/c overflows.
    scale0 = plan.scale.squeeze(-1).squeeze(-1)
    root_g = torch.hypot(c / scale0, plan.lam_safe.sqrt()).reciprocal()
    wi, wg = plan.w_id[..., None, None], (root_g * root_g)[..., None, None]
    P = plan.Xh.to(torch.float64) * root_g[..., None, None]
    if not coeffs:
        return c * P
    G64 = plan.G.to(torch.float64)
    eye = torch.eye(G64.shape[-1], dtype=torch.float64, device=G64.device)
    M_hat = wg * G64 + wi * eye
    M_hat_sq = (wg * wg) * plan.G2.to(torch.float64) + (2.0 * wg * wi) * G64 + (wi * wi) * eye
    a, b, cc = coeffs[0]
    Q = (a * eye + b * M_hat + cc * M_hat_sq).to(wd)
    # the first step in the Gram matrix's precision: B₁ = Q·[√w_G·X̂, √w_I·I]
    B = torch.cat([Q @ P.to(wd), Q * wi.sqrt().to(wd)], dim=-1)
    del G64, M_hat, M_hat_sq, P
    exact = _mixed_exact_steps(coeffs, math.sqrt(1.0 / plan.alpha))
    for k, (a, b, cc) in enumerate(coeffs[1:], start=1):
        if k == exact:
            B, eye = B.to(torch.bfloat16), eye.to(torch.float32)
        mm = bf16_matmul if k >= exact else torch.matmul
        E = mm(B, B.mT)
        Q = a * eye + b * E.to(eye.dtype) + cc * mm(E, E).to(eye.dtype)
        B = mm(Q.to(B.dtype), B)
    return c * B[..., : Xw.shape[-1]].to(torch.float64)


def _mixed_exact_steps(coeffs: tuple[tuple[float, float, float], ...], ell: float) -> int:
    """Steps of ``soft_clip_mixed`` that run in the Gram matrix's precision: until the
    smallest singular value ``ℓ_k = p_k(ℓ_{k−1})`` reaches ``MIXED_BF16_FROM`` (at least 1)."""
    for k, (a, b, c) in enumerate(coeffs):
        if ell >= MIXED_BF16_FROM:
            return max(k, 1)
        ell = a * ell + b * ell**3 + c * ell**5
    return len(coeffs)


def _orient(Y: Tensor, transposed: bool) -> Tensor:
    return Y.mT if transposed else Y


def misr(A: Tensor, alpha: Tensor, ns_steps: int) -> Tensor:
    r"""Matrix inverse square root by coupled Newton–Schulz (the paper's Algorithm 2, MISR).

    With ``Â = A/α``, ``Y₀ = Â``, ``Z₀ = I``, each step sets ``T = (3I − ZY)/2``,
    ``Y ← YT``, ``Z ← TZ``; returns ``Z_K/√α ≈ A^{-1/2}``. Requires α ≥ λ_max(A).
    """
    mm = bf16_matmul if A.dtype == torch.bfloat16 else torch.matmul
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    Y = A / alpha
    Z = eye.expand_as(A).clone()
    for _ in range(ns_steps):
        T = 0.5 * (3.0 * eye - mm(Z, Y))
        Y = mm(Y, T)
        Z = mm(T, Z)
    return Z / alpha.sqrt()


def soft_clip_paper(
    X: Tensor, c: float, *, ns_steps: int = 10, dtype: torch.dtype | None = None
) -> Tensor:
    r"""The paper's Algorithm 1 (soft spectral clipping via MISR), exactly as written.

    ``s²_max = min(‖XXᵀ‖_F, max_i Σ_j |(XXᵀ)_ij|)``; if ``s_max ≤ c`` return X; else
    ``α = 1 + s²_max/c²`` and return ``MISR(I + XXᵀ/c², α, N_s) · X``. All arithmetic runs
    in ``dtype`` (default float32); bf16 products accumulate in float32 and round to bf16, as
    on tensor cores, also on CPUs without bf16 units (:func:`bf16_matmul`). Inaccurate when
    the spectrum has a large spike: the bulk eigenvalues sit near 1/α, where each step grows
    them only by 1.5×.
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    check_finite(X)
    check_int("ns_steps", ns_steps, low=0)
    if X.dim() == 1:
        return soft_clip(X, c, method="eigh")
    if X.numel() == 0:
        return X.clone()
    return _soft_clip_paper(X, c, ns_steps, dtype)[0]


def _soft_clip_paper(
    X: Tensor, c: float, ns_steps: int, dtype: torch.dtype | None
) -> tuple[Tensor, Tensor]:
    """Algorithm 1 on checked input, and its ``s²_max`` (one per matrix)."""
    wd = dtype or compute_dtype(X)
    Xw, transposed = wide_view(X)
    Xc = Xw.to(wd)
    mm = bf16_matmul if wd == torch.bfloat16 else torch.matmul
    G = mm(Xc, Xc.mT)
    Gn = G.to(compute_dtype(G))  # the bound in at least float32
    fro = torch.linalg.matrix_norm(Gn, ord="fro")
    gersh = Gn.abs().sum(dim=-1).amax(dim=-1)
    s2 = torch.minimum(fro, gersh)
    alpha = (1.0 + s2 / c**2).to(wd)[..., None, None]
    eye = torch.eye(G.shape[-1], dtype=wd, device=G.device)
    A = misr(eye + G / c**2, alpha, ns_steps)
    Y = mm(A, Xc).to(X.dtype)
    keep = (s2.sqrt() <= c)[..., None, None]
    Y = torch.where(keep, Xw, Y)
    return (Y.mT if transposed else Y), s2


# --------------------------------------------------------------------------- hard clip


def _hard_weight(c: float):
    def weight(sigma: Tensor) -> Tensor:
        return torch.where(sigma > c, c / sigma.clamp_min(c), torch.ones_like(sigma))

    return weight


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
    check_finite(X)
    if X.dim() == 1:
        return _vector_rule(X, lambda r: torch.clamp(c / r, max=1.0) if r > 0 else r.new_ones(()))
    if method == "auto":
        method = _default_hard_method(X)
    if method == "eigh":
        return _spectral_map_eigh(X, c, _hard_weight(c))[0]
    if method == "svd":
        return _spectral_map_svd(X, lambda s: s.clamp(max=c))
    raise ValueError(f"unknown hard_clip method {method!r}; expected auto, eigh or svd")


# --------------------------------------------------------------------------- orthogonalize


def newton_schulz_quintic(
    X: Tensor,
    ns_steps: int = 5,
    coeffs: tuple[float, float, float] = MUON_NS_COEFFS,
    dtype: torch.dtype = torch.bfloat16,
    eps: float = 1e-7,
) -> Tensor:
    r"""Muon's quintic Newton–Schulz iteration towards ``orth(X)``.

    ``X₀ = X/max(‖X‖_F, ε)``, then ``A = XXᵀ``, ``X ← aX + (bA + cA²)X`` for ``ns_steps`` steps
    in ``dtype``. With the classic coefficients the singular values of the result lie in
    [0.68, 1.14] for ``σ/‖X‖_F ≥ 10⁻²`` rather than at 1 (K. Jordan, "Muon", 2024).
    """
    Xw, transposed = wide_view(X)
    a, b, cc = coeffs
    # Same arithmetic as torch.optim.Muon (fused addmm updates, norm in the working dtype),
    # so that on a single matrix the two agree bit for bit.
    shape = Xw.shape
    Y = Xw.to(dtype).reshape(-1, *shape[-2:]).clone()
    Y.div_(torch.linalg.vector_norm(Y, dim=(-2, -1), keepdim=True).clamp(min=eps))
    for _ in range(ns_steps):
        A = Y @ Y.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=cc)
        Y = torch.baddbmm(Y, B, Y, beta=a)
    Y = Y.reshape(shape).to(X.dtype)
    return Y.mT if transposed else Y


def polar_express(
    X: Tensor, ns_steps: int = 5, dtype: torch.dtype = torch.float32, safety: float = 1.01
) -> Tensor:
    r"""Orthogonalization by the greedy minimax quintics of "The Polar Express" (Amsel et al.).

    ``X₀ = X/(safety·‖X‖_F)``, then ``A = XXᵀ``, ``X ← aₖX + (bₖA + cₖA²)X`` with the
    hard-coded schedule designed for singular values in ``[10⁻³, 1]``. After ``K`` steps every
    singular value with ``σ/(safety·‖X‖_F) ≥ 10⁻³`` lies in the band
    :func:`spectra.ops.polar.polar_express_band` ``(K)`` (exact arithmetic): [0.876, 1.124]
    for 5 steps, [0.9986, 1.0014] for 6. Smaller ones end in ``(0, 1.124]``.
    """
    coeffs = ORTH_COEFFS
    if not 0 <= ns_steps <= len(coeffs):
        raise ValueError(
            f"ns_steps must be in [0, {len(coeffs)}] for polar_express, got {ns_steps}"
        )
    Xw, transposed = wide_view(X)
    X64 = Xw.to(torch.float64)  # the norm of any finite input, without under/overflow
    norm = torch.linalg.matrix_norm(X64, ord="fro")[..., None, None] * safety
    Y = (X64 / torch.where(norm > 0, norm, torch.ones_like(norm))).to(dtype)
    for a, b, cc in coeffs[:ns_steps]:
        A = Y @ Y.mT
        B = b * A + cc * (A @ A)
        Y = a * Y + B @ Y
    Y = Y.to(X.dtype)
    return Y.mT if transposed else Y


def orthogonalize(
    X: Tensor,
    *,
    method: OrthMethod = "auto",
    ns_steps: int = 5,
    ns_dtype: torch.dtype | None = None,
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
            default float32; band [0.876, 1.124] after 5 steps, [0.9986, 1.0014] after 6,
            for ``σ/‖X‖_F ≥ 10⁻³``). The bands are computed in docs/operators.md.
        ns_steps: iterations of the ``"muon"``/``"polar_express"`` schedules.
        ns_dtype: working precision of the iterative methods.
    """
    check_matrix_input(X)
    check_finite(X)
    if X.dim() == 1:
        return _vector_rule(X, lambda r: r.reciprocal() if r > 0 else r.new_zeros(()))
    check_int("ns_steps", ns_steps, low=0)
    if method == "auto":
        method = "svd"
    if X.numel() == 0 and method in ("svd", "muon", "polar_express"):
        return X.clone()
    if method == "svd":

        def phi(S: Tensor) -> Tensor:
            tol = S.amax(dim=-1, keepdim=True) * max(X.shape[-2:]) * torch.finfo(S.dtype).eps
            return (S > tol).to(S.dtype)

        return _spectral_map_svd(X, phi)
    if method == "muon":
        return newton_schulz_quintic(X, ns_steps=ns_steps, dtype=ns_dtype or torch.bfloat16)
    if method == "polar_express":
        return polar_express(X, ns_steps=ns_steps, dtype=ns_dtype or torch.float32)
    raise ValueError(
        f"unknown orthogonalize method {method!r}; expected auto, svd, muon or polar_express"
    )


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
