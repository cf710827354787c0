"""SGD with Polyak momentum, the base optimizer of the paper's Frank–Wolfe analysis."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from spectra.optim.base import SpectraOptimizer
from spectra.validate import check_number


class SGDM(SpectraOptimizer):
    r"""SGD with Polyak momentum and SPECTRA post-clipping (eq. SGDM-spectral-clipping).

    ``M ← μM + (1−μ)g`` with ``M`` set to the first gradient at the first step (``M₀ = g(X₀)``),
    ``U = M``, ``X ← (1−λη)X − αη·clip_{c_k}(M)``. ``momentum=0`` is plain SGD. The paper writes
    the average with the weight of the new gradient, ``β = 1 − μ``.

    With ``post="hard_clip"``, ``momentum=0``, ``clip_c=b·D₂``, ``clip_scale=λ/b``, a constant
    clip schedule and ``λη_k = 2/(k+2)`` this is the composite Frank–Wolfe method of "Enhancing
    LLM Training via Spectral Clipping" (Theorem SGDM-spectral-clipping-Frank-Wolfe) for
    ``min_{‖X‖₂≤D₂} f(X) + (b/2)‖X‖_F²``.

    Args:
        params: parameters or param groups.
        lr, momentum, weight_decay: step size, momentum μ ∈ [0, 1), decoupled weight decay λ.
        **options: SPECTRA settings and engine options; see :class:`~spectra.optim.AdamW`.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0.9,
        weight_decay: float = 0.1,
        **options: Any,
    ) -> None:
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
        super().__init__(params, defaults, **options)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_number("lr", group["lr"], low=0.0)
        check_number("weight_decay", group["weight_decay"], low=0.0)
        check_number("momentum", group["momentum"], low=0.0, high=1.0, high_open=True)

    def _init_state(self, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    _directions_keep_nonfinite = True
    _capturable_directions = True

    def _direction(self, group, params, grads, states, out) -> None:
        # At a parameter's first step the new gradient's weight is 1, so M₀ = g(X₀).
        bufs = [s["momentum_buffer"] for s in states]
        mu = group["momentum"]
        if states and torch.is_tensor(states[0]["step"]):  # capturable: the count on the device
            for b, g, s in zip(bufs, grads, states, strict=True):
                b.lerp_(g, torch.where(s["step"] == 1, 1.0, 1.0 - mu).to(b.dtype))
        else:
            torch._foreach_lerp_(bufs, grads, [1.0 if s["step"] == 1 else 1.0 - mu for s in states])
        torch._foreach_copy_(out, bufs)
