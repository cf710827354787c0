r"""Spectral operators as functions of the Gram matrix: ``op(X) = K(G)·X`` with ``G = XXᵀ``.

Every operator of :mod:`spectra.ops` maps ``X = U diag(σ) Vᵀ`` to ``U diag(φ(σ)) Vᵀ``, which is
``K·X`` with ``K = U diag(φ(σ)/σ) Uᵀ``, a function of ``G = XXᵀ = U diag(σ²) Uᵀ`` alone (and
equally ``X·K`` with the same function of ``XᵀX``). So a matrix whose columns are spread over
several processes needs only the sum of their ``X_r X_rᵀ`` to be clipped: each process then
applies ``K`` to its own columns (:mod:`spectra.optim.distributed`, the Gram route).

:func:`gram_factor` returns ``K`` for a batch of Gram matrices:

* ``soft_clip`` by ``"mixed"`` (and by ``"auto"`` where it picks ``"mixed"``): the same
  iteration as the single-process call, which after forming G sees only G
  (:func:`spectra.ops.spectral.mixed_gram_factor`), so a sharded run equals the unsharded
  one up to the rounding of G's sum.
* ``soft_clip`` by any other method, ``hard_clip`` and ``orthogonalize`` by ``"svd"``/``"auto"``:
  the exact weights ``φ(σ)/σ`` from the float64 eigendecomposition of ``G``. For the
  soft clip's other matmul-only methods (``"polar"``, ``"paper"``) this is the exact clip, to
  which those methods are approximations (``"polar"`` within 1e-3).

Where a float32 ``G`` is too coarse for the clip (the single-process route would work in
float64), :func:`gram_factor` returns ``None`` and the caller passes the float64 ``G``.
  ``orthogonalize`` maps the directions with ``σ ≤ √ε₆₄·σ_max`` to zero (their σ² is below
  the rounding of the eigendecomposition); the SVD keeps those above ``max(m, n)·ε₆₄·σ_max``.
* ``orthogonalize`` by ``"muon"`` and ``"polar_express"``: the same quintic iteration, carried
  as a polynomial in ``G``. Writing the iterate as ``Y_k = P_k·X``, ``A_k = Y_kY_kᵀ =
  P_k G P_k`` and ``P_{k+1} = a_k P_k + (b_k A_k + c_k A_k²) P_k``, from ``P_0 = I/‖X‖_F``
  (``‖X‖²_F = tr G``): the same products on ``m × m`` matrices, equal to the iteration on X
  up to rounding. It runs in float32 (float64 for ``ns_dtype=torch.float64``), also where
  the method would run in bf16: ``G`` squares the condition number of X, so bf16 rounding
  would cost its small directions ``ε·κ²`` instead of the iteration's ``ε·κ`` (136% against
  10–20% for bf16 Newton–Schulz on X, measured on a 5 × 7 matrix with κ = 9.4). With bf16
  ``ns_dtype`` the result is therefore the float32 iteration's, not equal to the bf16 one.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from spectra.ops._common import single_thread_lapack
from spectra.ops.polar import ORTH_COEFFS
from spectra.ops.spectral import (
    EIGH_FP32_MAX_RATIO2,
    MUON_NS_COEFFS,
    _hard_weight,
    _soft_weight,
    mixed_gram_factor,
    soft_clip_method,
)

#: Directions with σ ≤ ORTH_GRAM_TOL·σ_max are dropped by the Gram route's orthogonalization:
#: the float64 eigendecomposition of G resolves σ² only to about ε₆₄·σ²_max.
ORTH_GRAM_TOL = math.sqrt(torch.finfo(torch.float64).eps)


def _weights(kind: str, sigma: Tensor, c: float | None) -> Tensor:
    """``φ(σ)/σ`` for the operator ``kind`` (float64): the weights of the single-process
    ``"eigh"`` route for the clips."""
    if kind == "soft_clip":
        return _soft_weight(c)(sigma)
    if kind == "hard_clip":
        return _hard_weight(c)(sigma)
    if kind == "orthogonalize":
        tol = sigma.amax(dim=-1, keepdim=True) * ORTH_GRAM_TOL
        keep = sigma > tol
        return torch.where(keep, sigma.clamp_min(torch.finfo(sigma.dtype).tiny).reciprocal(), 0)
    raise ValueError(f"unknown operator {kind!r}; expected soft_clip, hard_clip or orthogonalize")


def _polynomial_factor(
    G: Tensor, coeffs: list[tuple[float, float, float]], norm: Tensor, dtype: torch.dtype
) -> Tensor:
    """``P_K`` of the quintic iteration ``Y ← aY + (bA + cA²)Y`` from ``Y_0 = X/norm``."""
    eye = torch.eye(G.shape[-1], dtype=torch.float64, device=G.device)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))[..., None, None]
    P = (eye / safe).to(dtype).expand_as(G).clone()
    Gd = G.to(dtype)
    for a, b, cc in coeffs:
        A = P @ Gd @ P
        B = b * A + cc * (A @ A)
        P = a * P + B @ P
    return P


def gram_factor(
    G: Tensor,
    kind: str,
    c: float | None = None,
    *,
    method: str = "auto",
    ns_steps: int | None = None,
    ns_dtype: torch.dtype | None = None,
    source_dtype: torch.dtype | None = None,
) -> Tensor | None:
    r"""``K`` with ``op(X) = K·X`` for every X with ``XXᵀ = G`` (and ``op(X) = X·K`` for
    ``XᵀX = G``), batched over the leading dimensions of the symmetric ``G``; float64 for the
    exact weights, the working precision for the iterations.

    ``kind`` is ``"soft_clip"``, ``"hard_clip"`` or ``"orthogonalize"`` with its threshold
    ``c`` and the arguments of that operator (see the module docstring for which method gives
    what); ``source_dtype`` is the dtype of the matrices G comes from (default: G's), which
    ``"auto"`` resolves with. ``None`` when a float32 G is too coarse for the clip (the
    single-process route would work in float64: ``(σ_max/c)² > 1e4`` for the exact weights,
    ``α > 1e5`` for ``"mixed"``).
    """
    if kind == "soft_clip":
        resolved = soft_clip_method(method, G.device, source_dtype or G.dtype)
        if resolved == "mixed":
            return mixed_gram_factor(G, c, source_dtype=source_dtype)
    if kind == "orthogonalize" and method in ("muon", "polar_express"):
        trace = torch.diagonal(G.to(torch.float64), dim1=-2, dim2=-1).sum(-1).clamp_min(0)
        if method == "muon":
            steps = 5 if ns_steps is None else ns_steps
            coeffs = [MUON_NS_COEFFS] * steps
            # Muon's normalisation: X / max(‖X‖_F, 1e-7)
            norm = trace.sqrt().clamp_min(1e-7)
        else:
            coeffs = list(ORTH_COEFFS[: 5 if ns_steps is None else ns_steps])
            norm = trace.sqrt() * 1.01
        # at least float32: G squares X's condition number, so in bf16 its rounding would
        # cost the small directions ε·κ² instead of the iteration's own ε·κ
        dtype = torch.float64 if ns_dtype == torch.float64 else torch.float32
        return _polynomial_factor(G, coeffs, norm, dtype)
    G64 = G.to(torch.float64)
    with single_thread_lapack(G64.device):
        mu, Q = torch.linalg.eigh(G64)
    sigma = mu.clamp_min(0.0).sqrt()
    if G.dtype == torch.float32 and kind != "orthogonalize":
        # the bound of the single-process eigh route: float32 G resolves (σ_max/c)² ≤ 1e4
        if float(mu[..., -1].amax()) > EIGH_FP32_MAX_RATIO2 * c * c:
            return None
    return (Q * _weights(kind, sigma, c).unsqueeze(-2)) @ Q.mT
