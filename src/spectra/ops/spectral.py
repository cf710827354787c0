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
    has_bf16_units,
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


def soft_clip_method(method: str, device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The method ``soft_clip(..., method=method)`` runs for a ``dtype`` input on ``device``:
    ``"auto"`` resolved."""
    return _default_method(device, dtype) if method == "auto" else method


def _default_method(device: torch.device, dtype: torch.dtype) -> str:
    # float32/bf16 input on a CPU with bf16 units (AMX, AVX-512 BF16): "mixed", the fastest
    # there at the bf16 floor of error (4-6e-3); elsewhere on CPU, eigh of the small Gram matrix
    # (exact, cheaper than any float32 iteration); on CUDA, "polar" (measured on an H100;
    # docs/operators.md). float64 input keeps an exact method.
    if device.type == "cuda":
        return "polar"
    if dtype != torch.float64 and has_bf16_units(device):
        return "mixed"
    return "eigh"


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
        method: ``"auto"`` (default: ``"polar"`` on CUDA; on a CPU, ``"mixed"`` for float32
            and bf16 input where the CPU has bf16 units, ``"eigh"`` otherwise),
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
    method = soft_clip_method(method, X.device, X.dtype)
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
    method = soft_clip_method(method, X.device, X.dtype)
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
    dtype = p.ns_dtype if p.method == "polar" else None
    p.gram, values = _polar_regram(Xw, p.c, p.gram, values, dtype)
    plan = _polar_decide(Xw, p.gram, values, p.tol, dtype, float32_last=p.method == "mixed")
    if p.method == "polar":
        return _orient(_polar_run(Xw, p.c, plan).to(X.dtype), transposed)
    return _mixed_run(p.c, plan, transposed).to(X.dtype)


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
    method = soft_clip_method(method, X.device, X.dtype)
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
    # min and max apart, no |X| copy: on the CPU a batched aminmax(dim=...) runs about ten times
    # slower than the two reductions (0.33 against 0.03 ms on 4×192×512, two threads)
    lo, hi = X.amin(dim=(-2, -1), keepdim=True), X.amax(dim=(-2, -1), keepdim=True)
    return _pow2_floor(torch.maximum(-lo, hi).to(torch.float64))


def _pow2_floor(x: Tensor) -> Tensor:
    """The largest power of two ≤ x, elementwise for x ≥ 0 (float64; 1 where x is 0)."""
    safe = torch.where(x > 0, x, torch.ones_like(x))
    return torch.exp2(torch.floor(torch.log2(safe)))


@dataclass
class _PolarPlan:
    Xh: Tensor | None  # X / scale in the Gram precision (X itself when x_inv is set)
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
    x_inv: Tensor | None  # Xh is X itself, to be multiplied by x_inv (see _PolarGram)


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
    c: float  # the threshold
    # float32 G formed from X itself, then scaled by x_inv² (no scaled copy of X); per-matrix
    # 1/scale (float64, shape (..., 1, 1)), or None for G from X/scale
    x_inv: Tensor | None
    # float64 (3,) on the device: the largest α, whether the input was finite, whether X's
    # scale let G be formed from X itself (see _DIRECT_RANGE)
    request: Tensor


def _polar_xh(Xw: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """``X/scale`` in ``dtype``, exact up to the final rounding (scale is a power of two)."""
    if dtype == torch.float32 and Xw.dtype != torch.float64:
        # float32 passes: inv = 1/scale ∈ [2⁻¹²⁷, 2¹⁴⁹] is split into two float32 powers of two;
        # the first product rounds like the float64 route, the second (≥ 1) is then exact
        inv = scale.reciprocal()
        first = inv.clamp(max=2.0**100)
        return torch.mul(Xw, first.to(torch.float32)).mul_((inv / first).to(torch.float32))
    return (Xw.to(torch.float64) / scale).to(dtype)


def _polar_grams(
    Xh: Tensor, split: bool, x_inv: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``G = X̂X̂ᵀ`` (times ``x_inv²``), ``G²`` and the bound ``s²_max ≥ λ_max(G)`` of
    :func:`_gram_square_and_bound`."""
    mm = split_bf16_matmul if split else torch.matmul
    G = mm(Xh, Xh.mT)
    if x_inv is not None:
        G.mul_((x_inv * x_inv).to(G.dtype))
    return _gram_square_and_bound(G, mm)


def _gram_square_and_bound(G: Tensor, mm=torch.matmul) -> tuple[Tensor, Tensor, Tensor]:
    """``(G, G², s²_max)`` with ``s²_max = min(max_i Σ_j |G_ij|, ‖G²‖_F^{1/2}) ≥ λ_max``
    (float64; ``‖G²‖_F^{1/2} ≤ ‖G‖_F``, so the Frobenius norm of G would not tighten it). The
    norms are taken in G's precision: rounding can put the bound ~1e-7 below λ_max, which the
    quintics' cushion above 1 absorbs."""
    G2 = mm(G, G)
    # max_i Σ_j |G_ij| (matrix_norm(ord=inf) gives the same, six times slower on the CPU)
    gersh = G.abs().sum(-1).amax(-1)
    fro2 = torch.linalg.matrix_norm(G2, ord="fro").sqrt()
    return G, G2, torch.minimum(gersh, fro2).to(torch.float64)


# Scales (powers of two near max|X|) for which a float32 X·Xᵀ can neither overflow nor lose
# terms to underflow: G is then formed from X itself and scaled afterwards.
_DIRECT_RANGE = (2.0**-40, 2.0**40)


def _polar_gram(Xw: Tensor, c: float, dtype: torch.dtype | None, direct: bool = True) -> _PolarGram:
    """The part of a polar call before its host read; no host synchronisation."""
    scale = _pow2_scale(Xw)
    split = dtype == torch.bfloat16  # split bf16 products while α ≤ POLAR_SPLIT_MAX_ALPHA
    exact = Xw.dtype == torch.float64 or dtype == torch.float64
    if dtype in (None, torch.bfloat16) and not fp32_products_are_ieee(Xw.device):
        exact = True  # TF32 or bf16 float32 products cannot form the Gram matrix
    first = torch.float64 if exact and not split else torch.float32
    x_inv = None
    in_range = torch.ones((), dtype=torch.bool, device=Xw.device)
    if direct and first == torch.float32 and Xw.dtype != torch.float64:
        x_inv = scale.reciprocal()
        in_range = ((scale >= _DIRECT_RANGE[0]) & (scale <= _DIRECT_RANGE[1])).all()
        G, G2, lam = _polar_grams(Xw.to(torch.float32), split, x_inv)
    else:
        G, G2, lam = _polar_grams(_polar_xh(Xw, scale, first), split)
    return _polar_bounds(G, G2, lam, scale, c, split, exact, x_inv, in_range)


def _polar_bounds(
    G: Tensor,
    G2: Tensor,
    lam: Tensor,
    scale: Tensor,
    c: float,
    split: bool,
    exact: bool,
    x_inv: Tensor | None,
    in_range: Tensor,
) -> _PolarGram:
    """α and the weights of M̂ from the scaled Gram matrix ``G`` and its bound ``lam``."""
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
    alpha = (1.0 / w_id.clamp_min(1e-300)).max()
    request = torch.stack([alpha, finite.to(torch.float64), in_range.to(torch.float64)])
    return _PolarGram(
        G, G2, scale, r, w_id, w_g, lam_safe, G.dtype, split, exact, c, x_inv, request
    )


def _polar_regram(
    Xw: Tensor, c: float, g: _PolarGram, values: Sequence[float], dtype: torch.dtype | None
) -> tuple[_PolarGram, Sequence[float]]:
    """``(g, values)``, or the Gram matrix from X/scale and its request when X's scale kept G
    from being formed from X itself (a second host read, for extreme scales only)."""
    if g.x_inv is None or values[2]:
        return g, values
    check_finite(Xw)
    g = _polar_gram(Xw, c, dtype, direct=False)
    return g, g.request.tolist()


def _polar_decide(
    Xw: Tensor | None,
    g: _PolarGram,
    values: Sequence[float],
    tol: float,
    dtype: torch.dtype | None,
    float32_last: bool = False,
) -> _PolarPlan:
    """Working precision and schedule from the host read ``values`` (``g.request``); with
    ``Xw=None`` (a factor from the Gram matrix alone) no ``Xh``, and G must be fine as it is.
    ``float32_last``: ``Xh`` is X itself in float32 (not float64) for non-float64 input, for a
    last product in float32 whatever the working precision."""
    alpha_max, ok, in_range = values
    if not (ok and in_range):
        check_finite(Xw if Xw is not None else g.G, "X" if Xw is not None else "G")
    if g.split and alpha_max <= POLAR_SPLIT_MAX_ALPHA:
        wd = torch.bfloat16
    elif dtype is not None and not g.split:
        wd = dtype
    elif g.exact or alpha_max > POLAR_FP32_MAX_ALPHA:
        wd = torch.float64
    else:
        wd = torch.float32
    if Xw is not None and wd != torch.bfloat16 and (g.split or wd != g.dtype):
        # the first Gram matrix is not accurate enough here: G (from X/scale in column blocks),
        # its bounds and the weights again in wd, on the device (the schedule keeps the α read
        # from the first one)
        G, scale = _scaled_gram(Xw, wd)
        ones = torch.ones((), dtype=torch.bool, device=G.device)
        g = _polar_bounds(*_gram_square_and_bound(G), scale, g.c, False, g.exact, None, ones)
    G, G2, x_inv, Xh = g.G, g.G2, g.x_inv, None
    if Xw is not None:
        if x_inv is None and float32_last and Xw.dtype != torch.float64:
            x_inv = g.scale.reciprocal()
        Xh = Xw.to(torch.float32) if x_inv is not None else _polar_xh(Xw, g.scale, g.dtype)
    w_floor = 1.0 / POLAR_MAX_ALPHA.get(wd, 1e2)
    coeffs = inverse_sqrt_schedule(math.sqrt(max(1.0 / alpha_max, w_floor)), tol)
    w_id = g.w_id.clamp_min(w_floor)
    return _PolarPlan(
        Xh, G, G2, g.scale, g.r, w_id, g.w_g, g.lam_safe, alpha_max, wd, coeffs, x_inv
    )


def _polar_plan(Xw: Tensor, c: float, tol: float, dtype: torch.dtype | None) -> _PolarPlan:
    """Scale, Gram matrices, α bound, working precision and schedule for ``soft_clip_polar``;
    the call's one host synchronisation reads α and whether the input was finite."""
    g = _polar_gram(Xw, c, dtype)
    g, values = _polar_regram(Xw, c, g, g.request.tolist(), dtype)
    return _polar_decide(Xw, g, values, tol, dtype)


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
    wi, wg = plan.w_id[..., None, None], plan.w_g[..., None, None]
    eye = torch.eye(G.shape[-1], dtype=torch.float64, device=G.device)
    G64 = G.to(torch.float64)
    M_hat = wg * G64 + wi * eye
    M_hat_sq = (wg * wg) * G2.to(torch.float64) + (2.0 * wg * wi) * G64 + (wi * wi) * eye
    # split bf16 products keep float32 operands
    store, mm = (torch.float32, split_bf16_matmul) if wd == torch.bfloat16 else (wd, torch.matmul)
    Z = coupled_inverse_sqrt(M_hat.to(store), M_hat_sq.to(store), coeffs, matmul=mm)
    return mm(Z, Xh.to(store)).to(torch.float64) * _output_factor(c, plan)


def _output_factor(c: float, plan: _PolarPlan) -> Tensor:
    """The per-matrix factor (float64, shape ``(..., 1, 1)``) with ``H_c(X) = f·Z·Xh`` for
    ``Z ≈ M̂^{-1/2}``: ``scale/√α = scale/hypot(1, r)``, or ``c/√s²_max`` when r overflowed,
    times ``x_inv`` when Xh is X itself."""
    scale0 = plan.scale.squeeze(-1).squeeze(-1)
    finite = scale0 / torch.hypot(torch.ones_like(plan.r), plan.r)
    factor = torch.where(torch.isinf(plan.r), c / plan.lam_safe.sqrt(), finite)[..., None, None]
    return factor if plan.x_inv is None else factor * plan.x_inv


def soft_clip_mixed(X: Tensor, c: float, *, tol: float = POLAR_TOL) -> Tensor:
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
    (:func:`spectra_lab.bench.ops.mixed_flops` has every case): ``2m²n`` twice (Gram matrix,
    last product) and ``2m³`` times ``4e`` (``G²``, the exact steps, ``K = W Z_e``) in
    float32; ``(4r − 3)·2m³`` in bf16. The paper's Algorithm 1 (``N_s = 10``) takes ``4m²n + 60m³``
    in bf16. One host synchronisation per call, as in :func:`soft_clip_polar`.
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


def _mixed_run(c: float, plan: _PolarPlan, transposed: bool) -> Tensor:
    """``soft_clip_mixed`` of the matrix whose wide view is ``plan.Xh`` (in Xh's precision):
    ``K·Xh``, or ``Xhᵀ·Kᵀ`` in the input's own layout when the wide view is its transpose."""
    K = _mixed_factor(c, plan).to(plan.Xh.dtype)
    return plan.Xh.mT @ K.mT if transposed else K @ plan.Xh


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
    _check_tol(tol)
    exact = G.dtype == torch.float64
    dmax = G.diagonal(dim1=-2, dim2=-1).amax(dim=-1)[..., None, None].to(torch.float64)
    scale = _pow2_floor(dmax.sqrt())  # ≈ √max G_ii = max row norm of X
    x_inv = scale.reciprocal()
    in_range = torch.ones((), dtype=torch.bool, device=G.device)
    Gs, G2, lam = _gram_square_and_bound(G * (x_inv * x_inv).to(G.dtype))
    g = _polar_bounds(Gs, G2, lam, scale, c, False, exact, x_inv, in_range)
    values = g.request.tolist()
    wants64 = source_dtype == torch.float64 or values[0] > POLAR_FP32_MAX_ALPHA
    if wants64 and not exact:
        return None
    return _mixed_factor(c, _polar_decide(None, g, values, tol, None))


def _mixed_factor(c: float, plan: _PolarPlan) -> Tensor:
    """``K`` (in the plan's dtype) with ``H_c(X) = K·plan.Xh`` for ``soft_clip_mixed``."""
    wd, coeffs = plan.dtype, plan.coeffs
    factor = _output_factor(c, plan).to(wd)
    batch, m = plan.G.shape[:-2], plan.G.shape[-1]
    if not coeffs:
        return factor * torch.eye(m, dtype=wd, device=factor.device).expand(*batch, m, m)
    wi = plan.w_id.to(wd).reshape(-1, 1, 1)
    wg = plan.w_g.to(wd).reshape(-1, 1, 1)
    G = plan.G.to(wd).reshape(-1, m, m)
    M_hat = _add_to_diagonal(wg * G, wi)  # M̂ = w_G·G + w_I·I
    exact = _mixed_exact_steps(coeffs, math.sqrt(1.0 / plan.alpha))
    Z, E = None, M_hat
    if exact:
        # the first step aI + bM̂ + cM̂², with M̂² = w_G²·G² + 2w_G·w_I·G + w_I²·I from the G²
        # that the α bound needed
        a, b, cc = coeffs[0]
        Z = torch.mul(plan.G2.to(wd).reshape(-1, m, m), cc * wg * wg)
        Z = _add_to_diagonal(Z.addcmul_(G, b * wg + 2.0 * cc * wg * wi), a + b * wi + cc * wi * wi)
        Z, E = _coupled_steps(M_hat, coeffs[:exact], Z)
    if exact < len(coeffs):
        E16 = E.to(torch.bfloat16)
        del E, M_hat  # the bf16 steps see E alone: two m × m temporaries less meanwhile
        W = _coupled_steps(E16, coeffs[exact:])[0].to(wd)  # ≈ E^{-1/2}
        Z = W if Z is None else torch.bmm(W, Z)
    return Z.mul_(factor.reshape(-1, 1, 1)).reshape(*batch, m, m)


def _add_to_diagonal(A: Tensor, d: Tensor | float) -> Tensor:
    """``A + d·I`` for a batch of square matrices and per-matrix ``d`` (shape ``(B, 1, 1)``)
    or a number, in place on A."""
    diagonal = A.diagonal(dim1=-2, dim2=-1)
    d = d.squeeze(-1) if isinstance(d, Tensor) else d
    if A.dtype == torch.bfloat16:  # sum in float32: a bf16 add would round d first
        diagonal.copy_(diagonal.float() + d)
    else:
        diagonal.add_(d)
    return A


def _fused_quintic(E: Tensor, a: float, b: float, c: float) -> Tensor:
    """``aI + bE + cE²`` for a ``(B, m, m)`` batch with one fused product (``baddbmm``), which
    sums in float32 and rounds once for bf16 E (emulated through float32 on devices without
    bf16 units, with the same rounding)."""
    if E.dtype == torch.bfloat16 and not has_bf16_units(E.device):
        E32 = E.float()
        return _add_to_diagonal(torch.baddbmm(E32, E32, E32, beta=b, alpha=c), a).bfloat16()
    return _add_to_diagonal(torch.baddbmm(E, E, E, beta=b, alpha=c), a)


def _coupled_steps(
    M_hat: Tensor, coeffs: tuple[tuple[float, float, float], ...], Z1: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """``Z = p_K(…)·…·p_1(M̂)`` and, when the first step's ``Z1 = p_1(M̂)`` is given, also
    ``E = Z M̂ Z``, after the ``K = len(coeffs) ≥ 1`` steps of the coupled iteration of
    :func:`spectra.ops.polar.coupled_inverse_sqrt`, in M̂'s precision (a ``(B, m, m)`` batch;
    bf16: bf16 products with float32 sums). Without ``Z1`` the first step is one fused
    product; each later step takes four products (``E = ZY``, ``Q = p(E)``, ``QZ``, ``YQ``),
    the last one three when E is not wanted."""
    mm = bf16_matmul if M_hat.dtype == torch.bfloat16 else torch.bmm
    want_e = Z1 is not None
    Z = _fused_quintic(M_hat, *coeffs[0]) if Z1 is None else Z1
    if len(coeffs) == 1 and not want_e:
        return Z, None
    Y = mm(M_hat, Z)
    for k, (a, b, cc) in enumerate(coeffs[1:], start=2):
        Q = _fused_quintic(mm(Z, Y), a, b, cc)
        Z = mm(Q, Z)
        if want_e or k < len(coeffs):
            Y = mm(Y, Q)
    return Z, (mm(Z, Y) if want_e else None)


def _mixed_exact_steps(coeffs: tuple[tuple[float, float, float], ...], ell: float) -> int:
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
