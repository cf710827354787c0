r"""Method ``"svd"``: the reference, ``X ↦ U diag(φ(σ)) Vᵀ`` through a float64 SVD.

Exact for every operator; ``orthogonalize`` keeps the directions with
``σ > σ_max·max(m, n)·ε₆₄`` and maps the rest to zero. Its Gram-route factor is the exact one
of :mod:`spectra.ops.eigh`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from spectra.ops.base import ClipMethod, Operator, Options
from spectra.ops.eigh import exact_gram_factor, hard_weight, orth_weight, soft_weight


def spectral_map(X: Tensor, phi: Callable[[Tensor], Tensor]) -> Tensor:
    """``X ↦ U diag(φ(σ)) Vᵀ`` through a float64 SVD."""
    U, S, Vh = torch.linalg.svd(X.to(torch.float64), full_matrices=False)
    return ((U * phi(S).unsqueeze(-2)) @ Vh).to(X.dtype)


def _soft(X: Tensor, c: float, options: Options) -> Tensor:
    return spectral_map(X, lambda s: s * soft_weight(c)(s))


def _orth(X: Tensor, c: None, options: Options) -> Tensor:
    def phi(S: Tensor) -> Tensor:
        tol = S.amax(dim=-1, keepdim=True) * max(X.shape[-2:]) * torch.finfo(S.dtype).eps
        return (S > tol).to(S.dtype)

    return spectral_map(X, phi)


METHOD = ClipMethod(
    "svd",
    soft_clip=Operator(_soft, exact_gram_factor(soft_weight)),
    hard_clip=Operator(
        lambda X, c, o: spectral_map(X, lambda s: s.clamp(max=c)), exact_gram_factor(hard_weight)
    ),
    orthogonalize=Operator(_orth, exact_gram_factor(lambda c: orth_weight)),
)
