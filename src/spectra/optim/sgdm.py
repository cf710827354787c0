"""SGD with Polyak momentum, the base optimizer of the paper's Frank–Wolfe analysis."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from spectra.optim.base import DEFAULT_CHUNK_SIZE, SpectraOptimizer, check_beta, check_nonnegative


class SGDM(SpectraOptimizer):
    r"""SGD with Polyak momentum and SPECTRA post-clipping (eq. SGDM-spectral-clipping).

    ``M ← (1−β)M + βg`` with ``M`` set to the first gradient at the first step (``M₀ = g(X₀)``),
    ``U = M``, ``X ← (1−λη)X − αη·clip_{c_k}(M)``. ``beta=1`` is plain SGD.

    With ``post="hard_clip"``, ``beta=1``, ``clip_c=b·D₂``, ``clip_scale=λ/b``, a constant clip
    schedule and ``λη_k = 2/(k+2)`` this is the composite Frank–Wolfe method of "Enhancing LLM
    Training via Spectral Clipping" (Theorem SGDM-spectral-clipping-Frank-Wolfe) for
    ``min_{‖X‖₂≤D₂} f(X) + (b/2)‖X‖_F²``.

    Args:
        params: parameters or param groups.
        lr, beta, weight_decay: step size, momentum weight of the new gradient (β ∈ (0, 1]),
            decoupled weight decay λ.
        **spectra: SPECTRA settings; see :class:`~spectra.optim.AdamW`.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        beta: float = 0.1,
        weight_decay: float = 0.1,
        *,
        nonfinite: str = "raise",
        chunk_size: int | None = DEFAULT_CHUNK_SIZE,
        **spectra: Any,
    ) -> None:
        defaults = {"lr": lr, "beta": beta, "weight_decay": weight_decay}
        super().__init__(params, defaults, spectra, nonfinite=nonfinite, chunk_size=chunk_size)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_nonnegative(group["lr"], "lr")
        check_nonnegative(group["weight_decay"], "weight_decay")
        beta = check_beta(group["beta"], "beta", closed=True)
        if beta == 0.0:
            raise ValueError(f"beta must be in (0, 1], got {group['beta']!r}")

    def _init_state(self, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def _direction(self, group, params, grads, states, out) -> None:
        # At a parameter's first step the weight is 1, so M₀ = g(X₀).
        weights = [1.0 if s["step"] == 1 else group["beta"] for s in states]
        bufs = [s["momentum_buffer"] for s in states]
        torch._foreach_lerp_(bufs, grads, weights)
        torch._foreach_copy_(out, bufs)
