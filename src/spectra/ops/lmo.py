"""Closed-form solutions of the spectral Frank–Wolfe subproblem.

For a rotationally invariant regularizer ψ(X) = Σᵢ ψ₁(σᵢ(X)), the subproblem

    X* = argmin_{‖X‖₂ ≤ D₂} ⟨G, X⟩ + ψ(X)

is solved by ``X* = −U_G diag(σ*) V_Gᵀ``, where each σ*ᵢ solves the 1-D problem
``min_{x ∈ [0, D₂]} −σᵢ(G)·x + ψ₁(x)`` ("Enhancing LLM Training via Spectral
Clipping", Sec. 3.1 and Appendix "Solution of the Subproblem with Other Regularizers").
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from spectra.ops._common import check_matrix_input, check_threshold
from spectra.validate import check_number

Regularizer = Literal["frobenius", "nuclear", "schatten", "entropy"]


def lmo_singular_values(
    sigma: Tensor, radius: float, regularizer: Regularizer, b: float, p: float = 2.0
) -> Tensor:
    r"""σ* for each singular value σ of G: the minimiser of −σx + ψ₁(x) over [0, radius].

    * ``frobenius``: ψ₁(x) = (b/2)x², σ* = min(σ/b, D₂) (b = 0 gives D₂, the pure LMO).
    * ``nuclear``:   ψ₁(x) = b·x,     σ* = D₂ if σ > b else 0.
    * ``schatten``:  ψ₁(x) = (b/p)xᵖ (p > 1), σ* = min((σ/b)^{1/(p−1)}, D₂).
    * ``entropy``:   ψ₁(x) = b(x log x − x), σ* = min(exp(σ/b), D₂).
    """
    D = radius
    if regularizer == "frobenius":
        if b == 0:
            return torch.full_like(sigma, D)
        return (sigma / b).clamp(max=D)
    if regularizer == "nuclear":
        return torch.where(sigma > b, torch.full_like(sigma, D), torch.zeros_like(sigma))
    if regularizer == "schatten":
        return (sigma / b).pow(1.0 / (p - 1.0)).clamp(max=D)
    if regularizer == "entropy":
        # exp(σ/b) ≥ D₂ ⇔ σ/b ≥ log D₂; clamp the exponent to avoid overflow.
        return torch.exp((sigma / b).clamp(max=math.log(D))).clamp(max=D)
    raise ValueError(
        f"unknown regularizer {regularizer!r}; expected frobenius, nuclear, schatten or entropy"
    )


def spectral_lmo(
    G: Tensor,
    radius: float,
    regularizer: Regularizer = "frobenius",
    b: float = 0.0,
    *,
    p: float = 2.0,
) -> Tensor:
    r"""Solve ``argmin_{‖X‖₂ ≤ radius} ⟨G, X⟩ + ψ(X)`` in closed form.

    Returns ``−U_G diag(σ*) V_Gᵀ`` with σ* from :func:`lmo_singular_values`. For the
    squared Frobenius regularizer this is ``−clip^sp_{b·D₂}(G)/b``, the step that
    post-clipping takes (Proposition "Frank–Wolfe reformulation" of the paper).
    Computed with a float64 SVD; batched over leading dimensions.
    """
    check_matrix_input(G, "G")
    if G.dim() < 2:
        raise ValueError(f"G must be a matrix (>= 2 dims), got shape {tuple(G.shape)}")
    radius = check_threshold(radius, "radius")
    b = check_number("b", b, low=0.0)
    if regularizer in ("schatten", "entropy") and b <= 0:
        raise ValueError(f"b must be > 0 for the {regularizer} regularizer, got {b!r}")
    if regularizer == "schatten" and not (p > 1):
        raise ValueError(f"p must be > 1 for the Schatten regularizer, got {p!r}")
    G64 = G.to(torch.float64)
    U, S, Vh = torch.linalg.svd(G64, full_matrices=False)
    s_star = lmo_singular_values(S, radius, regularizer, b, p)
    return (-(U * s_star.unsqueeze(-2)) @ Vh).to(G.dtype)
