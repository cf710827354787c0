"""MARS-AdamW (Yuan et al., "MARS: Unleashing the Power of Variance Reduction for Training Large
Models"), approximate form, inside the SPECTRA step."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from spectra.optim.adamw import adam_direction
from spectra.optim.base import SpectraOptimizer
from spectra.optim.distributed import frobenius_norms
from spectra.validate import check_number, check_pair


def _uses_mars(p: Tensor) -> bool:
    return p.dim() >= 2


class MARS(SpectraOptimizer):
    r"""MARS-AdamW (approximate) with SPECTRA post-clipping (Spectra-MARS).

    For parameters with two or more dimensions:
    ``c = g + γ·β₁/(1−β₁)·(g − g_prev)`` (``g_prev`` the previous gradient, zero at the first
    step), ``c ← c/max(1, ‖c‖_F)``, ``m ← β₁m + (1−β₁)c``, ``v ← β₂v + (1−β₂)c²``,
    ``U = m̂/(√v̂ + ε)``; ``X ← (1−λη)X − αη·H_{c_k}(U)``.

    Other parameters use AdamW with ``betas_1d``, learning rate ``lr_1d_factor·lr`` and weight
    decay ``weight_decay_1d`` (``None``: ``weight_decay``), as in the MARS reference code.
    Defaults follow the paper's tables: lr 3e-3 (MARS), 1e-3 for AdamW (``lr_1d_factor=1/3``),
    betas (0.95, 0.99), betas_1d (0.8, 0.999), γ = 0.025, λ = 0.1, c = 10. The gradient
    history ``last_grad`` is kept only for the MARS (≥ 2-D) parameters.

    ``**options`` are the SPECTRA settings and engine options; see :class:`~spectra.optim.AdamW`.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 3e-3,
        betas: tuple[float, float] = (0.95, 0.99),
        gamma: float = 0.025,
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        lr_1d_factor: float = 1.0 / 3.0,
        betas_1d: tuple[float, float] = (0.8, 0.999),
        weight_decay_1d: float | None = None,
        **options: Any,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": betas,
            "gamma": gamma,
            "eps": eps,
            "weight_decay": weight_decay,
            "lr_1d_factor": lr_1d_factor,
            "betas_1d": betas_1d,
            "weight_decay_1d": weight_decay_1d,
        }
        super().__init__(params, defaults, **options)

    def _check_group(self, group: dict[str, Any]) -> None:
        for key in ("lr", "eps", "weight_decay", "gamma", "lr_1d_factor"):
            check_number(key, group[key], low=0.0)
        if group["weight_decay_1d"] is not None:
            check_number("weight_decay_1d", group["weight_decay_1d"], low=0.0)
        for key in ("betas", "betas_1d"):
            if len(check_pair(key, group[key])) != 2:
                raise ValueError(f"{key} must be a pair, got {group[key]!r}")

    def _param_rules(self, group: dict[str, Any], p: Tensor) -> tuple[float, float]:
        if _uses_mars(p):
            return 1.0, float(group["weight_decay"])
        wd = group["weight_decay_1d"]
        return float(group["lr_1d_factor"]), float(group["weight_decay"] if wd is None else wd)

    def _init_state(self, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if _uses_mars(p):
            state["last_grad"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    _directions_keep_nonfinite = True
    _capturable_directions = True  # its norms and Adam's bias corrections stay on the device

    def _direction(self, group, params, grads, states, out) -> None:
        mars = [i for i, p in enumerate(params) if _uses_mars(p)]
        adam = [i for i, p in enumerate(params) if not _uses_mars(p)]
        if adam:
            a_grads, a_states = [grads[i] for i in adam], [states[i] for i in adam]
            _adam(a_grads, a_states, group["betas_1d"], group["eps"], [out[i] for i in adam])
        if not mars:
            return
        b1, _ = group["betas"]
        g = [grads[i] for i in mars]
        last = [states[i]["last_grad"] for i in mars]
        c = [out[i] for i in mars]
        # c = g + γβ₁/(1−β₁)·(g − g_prev), built in the output buffer.
        torch._foreach_copy_(c, g)
        torch._foreach_sub_(c, last)
        torch._foreach_mul_(c, group["gamma"] * b1 / (1.0 - b1))
        torch._foreach_add_(c, g)
        # c ← c / max(1, ‖c‖) without a host synchronisation.
        norms = frobenius_norms(c, [params[i] for i in mars])
        torch._foreach_clamp_min_(norms, 1.0)
        torch._foreach_div_(c, norms)
        torch._foreach_copy_(last, g)
        _adam(c, [states[i] for i in mars], group["betas"], group["eps"], c)


def _adam(
    grads: list[Tensor],
    states: list[dict[str, Any]],
    betas: tuple[float, float],
    eps: float,
    out: list[Tensor],
) -> None:
    """:func:`~spectra.optim.adamw.adam_direction` on the Adam state of ``states``."""
    exp_avgs = [s["exp_avg"] for s in states]
    exp_avg_sqs = [s["exp_avg_sq"] for s in states]
    steps = [s["step"] for s in states]
    adam_direction(grads, exp_avgs, exp_avg_sqs, steps, betas[0], betas[1], eps, out)
