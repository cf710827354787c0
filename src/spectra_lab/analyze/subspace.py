r"""Distances between subspaces, for the noise-structure analysis of "Enhancing LLM Training via
Spectral Clipping" (Appendix D.2, "Noise Structure Analysis").

For orthonormal bases ``U1, U2`` of two r-dimensional subspaces with principal angles
``θ_1 … θ_r``, the paper's two distances are

* spectral (worst case): ``d_spec = ‖U1U1ᵀ − U2U2ᵀ‖₂ = max_i sin θ_i = √(1 − σ_min(U1ᵀU2)²)``;
* chordal (average case): ``d_chord = ‖U1U1ᵀ − U2U2ᵀ‖_F / √(2r) = √(Σ_i sin²θ_i / r)``.

Both run from 0 (the same subspace) to 1 (orthogonal subspaces). The paper writes the chordal
distance with ``1/√r`` in front of ``‖U1U1ᵀ − U2U2ᵀ‖_F``; that Frobenius norm is
``√(2 Σ sin²θ_i)``, so its own right-hand side ``√(Σ sin²θ_i / r)`` — the one used here, which
makes orthogonal subspaces 1 — is the left-hand side over ``√(2r)``.

The sines are computed as the singular values of ``(I − U1U1ᵀ)U2 = U2 − U1(U1ᵀU2)``, which
keeps small angles accurate (``√(1 − cos²)`` loses half the digits near 0). For a noise
matrix ``N`` and the signal ``G``, ``d_r(N, G)`` is the larger of the distances between their
top-r left and top-r right singular subspaces.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def matrix_view(A: Tensor) -> Tensor:
    """``A``'s ``(d0, d1·d2·…)`` view in float64 on the CPU (how the spectral links see it)."""
    A = A.detach()
    return A.reshape(A.shape[0], -1).to(device="cpu", dtype=torch.float64)


def top_singular(A: Tensor, r: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(U_r, σ, V_r)``: the top-r left/right singular vectors and every singular value
    (descending) of ``A``'s matrix view, by a float64 SVD; ``r`` is capped at ``min(m, n)``."""
    U, S, Vh = torch.linalg.svd(matrix_view(A), full_matrices=False)
    r = min(r, S.numel())
    return U[:, :r], S, Vh[:r].mT


def principal_sines(U1: Tensor, U2: Tensor) -> Tensor:
    """``sin θ_i`` of the principal angles between the column spaces of orthonormal ``U1, U2``
    (same shape), largest first."""
    if U1.shape != U2.shape:
        raise ValueError(
            f"bases must have the same shape, got {tuple(U1.shape)}, {tuple(U2.shape)}"
        )
    U1, U2 = U1.double(), U2.double()
    residual = U2 - U1 @ (U1.mT @ U2)
    return torch.linalg.svdvals(residual).clamp(0.0, 1.0)


def subspace_distances(U1: Tensor, U2: Tensor) -> tuple[float, float]:
    """``(d_spec, d_chord)`` between the column spaces of orthonormal ``U1, U2`` (m × r each)."""
    sines = principal_sines(U1, U2)
    r = U1.shape[-1]
    return float(sines.max()), math.sqrt(float((sines**2).sum()) / r)


def noise_signal_distances(
    noise: tuple[Tensor, Tensor], signal: tuple[Tensor, Tensor]
) -> dict[str, float]:
    """``d_r(N, G)``, both kinds: ``noise`` and ``signal`` are ``(U_r, V_r)`` pairs.

    Returns ``spectral`` and ``chordal`` (the larger of the left and right sides, the paper's
    ``d_r``) and each side's value (``spectral_left``, ``spectral_right``, ...).
    """
    spec_l, chord_l = subspace_distances(noise[0], signal[0])
    spec_r, chord_r = subspace_distances(noise[1], signal[1])
    return {
        "spectral": max(spec_l, spec_r),
        "chordal": max(chord_l, chord_r),
        "spectral_left": spec_l,
        "spectral_right": spec_r,
        "chordal_left": chord_l,
        "chordal_right": chord_r,
    }
