r"""Method ``"muon"`` of ``orthogonalize``: Muon's quintic Newton–Schulz iteration.

``X₀ = X/max(‖X‖_F, ε)``, then ``A = XXᵀ``, ``X ← aX + (bA + cA²)X`` with the classic
coefficients (K. Jordan, "Muon", 2024), ``ns_steps`` steps (5) in ``ns_dtype`` (bf16). Its
Gram-route factor carries the same iteration as a polynomial in G
(:func:`spectra.ops.quintics.polynomial_gram_factor`), in float32 at least.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spectra.ops._common import orient, wide_view
from spectra.ops.base import ClipMethod, Operator, Options
from spectra.ops.quintics import polynomial_gram_factor

#: Muon's steps
NS_STEPS = 5

# Coefficients of the classic quintic Newton–Schulz iteration used by Muon
# (K. Jordan et al., 2024): p(x) = a x + b x³ + c x⁵, 5 steps.
MUON_NS_COEFFS = (3.4445, -4.7750, 2.0315)


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
    return orient(Y.reshape(shape).to(X.dtype), transposed)


def gram_precision(options: Options) -> torch.dtype:
    """The Gram-route iterations' precision: float32 at least, since G squares X's condition
    number (in bf16 its rounding would cost the small directions ε·κ² instead of the
    iteration's own ε·κ); float64 when asked."""
    return torch.float64 if options.ns_dtype == torch.float64 else torch.float32


def _gram_factor(G: Tensor, c: None, options: Options, source_dtype: torch.dtype) -> Tensor:
    steps = NS_STEPS if options.ns_steps is None else options.ns_steps
    trace = torch.diagonal(G.to(torch.float64), dim1=-2, dim2=-1).sum(-1).clamp_min(0)
    norm = trace.sqrt().clamp_min(1e-7)  # Muon's X / max(‖X‖_F, 1e-7), ‖X‖²_F = tr G
    return polynomial_gram_factor(G, [MUON_NS_COEFFS] * steps, norm, gram_precision(options))


def _apply(X: Tensor, c: None, options: Options) -> Tensor:
    steps = NS_STEPS if options.ns_steps is None else options.ns_steps
    return newton_schulz_quintic(X, ns_steps=steps, dtype=options.ns_dtype or torch.bfloat16)


#: A fixed number of steps and no check of its own: it reads nothing on the host.
METHOD = ClipMethod("muon", orthogonalize=Operator(_apply, _gram_factor, capturable=True))
