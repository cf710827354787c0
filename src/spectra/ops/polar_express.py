r"""Method ``"polar_express"`` of ``orthogonalize``: the greedy minimax quintics of "The Polar
Express" (Amsel, Persson, Musco and Gower, 2025), ``ns_steps`` steps (5) in ``ns_dtype``
(float32). Its Gram-route factor carries the same iteration as a polynomial in G.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spectra.ops._common import orient, wide_view
from spectra.ops.base import ClipMethod, Operator, Options
from spectra.ops.muon import NS_STEPS, gram_precision
from spectra.ops.quintics import ORTH_COEFFS, polynomial_gram_factor


def polar_express(
    X: Tensor, ns_steps: int = 5, dtype: torch.dtype = torch.float32, safety: float = 1.01
) -> Tensor:
    r"""Orthogonalization by the greedy minimax quintics of "The Polar Express" (Amsel et al.).

    ``X₀ = X/(safety·‖X‖_F)``, then ``A = XXᵀ``, ``X ← aₖX + (bₖA + cₖA²)X`` with the
    hard-coded schedule designed for singular values in ``[10⁻³, 1]``. After ``K`` steps every
    singular value with ``σ/(safety·‖X‖_F) ≥ 10⁻³`` lies in the band
    :func:`spectra.ops.quintics.polar_express_band` ``(K)`` (exact arithmetic): [0.875, 1.125]
    for 5 steps, [0.9986, 1.0014] for 6. Smaller ones end in ``(0, 1.125]``.
    """
    _check(Options(ns_steps=ns_steps))
    coeffs = ORTH_COEFFS
    Xw, transposed = wide_view(X)
    X64 = Xw.to(torch.float64)  # the norm of any finite input, without under/overflow
    norm = torch.linalg.matrix_norm(X64, ord="fro")[..., None, None] * safety
    Y = (X64 / torch.where(norm > 0, norm, torch.ones_like(norm))).to(dtype)
    for a, b, cc in coeffs[:ns_steps]:
        A = Y @ Y.mT
        B = b * A + cc * (A @ A)
        Y = a * Y + B @ Y
    return orient(Y.to(X.dtype), transposed)


def _check(options: Options) -> None:
    steps = options.ns_steps
    if steps is not None and not 0 <= steps <= len(ORTH_COEFFS):
        raise ValueError(
            f"ns_steps must be in [0, {len(ORTH_COEFFS)}] for polar_express, got {steps}"
        )


def _steps(options: Options) -> int:
    return NS_STEPS if options.ns_steps is None else options.ns_steps


def _gram_factor(G: Tensor, c: None, options: Options, source_dtype: torch.dtype) -> Tensor:
    trace = torch.diagonal(G.to(torch.float64), dim1=-2, dim2=-1).sum(-1).clamp_min(0)
    coeffs = ORTH_COEFFS[: _steps(options)]
    return polynomial_gram_factor(G, coeffs, trace.sqrt() * 1.01, gram_precision(options))


def _apply(X: Tensor, c: None, options: Options) -> Tensor:
    return polar_express(X, ns_steps=_steps(options), dtype=options.ns_dtype or torch.float32)


#: A fixed number of steps and no check of its own: it reads nothing on the host.
METHOD = ClipMethod(
    "polar_express",
    orthogonalize=Operator(_apply, _gram_factor, check=_check, capturable=True),
)
