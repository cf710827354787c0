"""AdEMAMix (Pagliardini, Ablin & Grangier, "The AdEMAMix Optimizer: Better, Faster, Older")
inside the SPECTRA step."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from spectra.optim.adamw import device_bias_corrections
from spectra.optim.base import SpectraOptimizer
from spectra.validate import check_int, check_number, check_pair


def alpha_schedule(step: int | Tensor, alpha: float, warmup: int | None) -> float | Tensor:
    r"""Linear warmup of the slow-EMA weight: ``α_t = min(t·α/T_α, α)`` (``α`` if no warmup);
    for a step count on the device (a capturable step), a 0-d tensor there."""
    if not warmup:
        return alpha
    if torch.is_tensor(step):
        return torch.clamp(step * (alpha / warmup), max=alpha)
    return min(step * alpha / warmup, alpha)


def beta3_schedule(
    step: int | Tensor, beta1: float, beta3: float, warmup: int | None
) -> float | Tensor:
    r"""The AdEMAMix β₃ warmup, linear in the half-life (log-space) from β₁ to β₃:

    ``β₃(t) = min(exp(ln β₁ ln β₃ / ((1 − t/T) ln β₃ + (t/T) ln β₁)), β₃)``; for a step count
    on the device, a 0-d tensor there.
    """
    if not warmup or beta3 == 0.0 or beta1 == 0.0:
        return beta3
    lb1, lb3 = math.log(beta1), math.log(beta3)
    if torch.is_tensor(step):
        a = torch.clamp(step / warmup, max=1.0)
        return torch.clamp(torch.exp(lb1 * lb3 / ((1.0 - a) * lb3 + a * lb1)), max=beta3)
    a = min(step / warmup, 1.0)
    return min(math.exp(lb1 * lb3 / ((1.0 - a) * lb3 + a * lb1)), beta3)


class AdEMAMix(SpectraOptimizer):
    r"""AdEMAMix with SPECTRA post-clipping (Spectra-AdEMAMix).

    ``m₁ ← β₁m₁ + (1−β₁)g``, ``m₂ ← β₃(t)m₂ + (1−β₃(t))g``, ``v ← β₂v + (1−β₂)g²``,
    ``U = (m₁/(1−β₁ᵗ) + α(t)m₂) / (√(v/(1−β₂ᵗ)) + ε)``; ``X ← (1−λη)X − αη·H_{c_k}(U)``
    (the clip scale α of SPECTRA is unrelated to AdEMAMix's α). ``alpha_warmup`` and
    ``beta3_warmup`` (steps; the AdEMAMix paper sets both to the run length) enable the
    schedules :func:`alpha_schedule` and :func:`beta3_schedule`. Defaults follow the paper's
    tables (lr 1e-3, betas (0.9, 0.999, 0.999), α = 8, λ = 0.1, c = 10).

    ``**options`` are the SPECTRA settings and engine options; see :class:`~spectra.optim.AdamW`.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float, float] = (0.9, 0.999, 0.999),
        alpha: float = 8.0,
        alpha_warmup: int | None = None,
        beta3_warmup: int | None = None,
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        **options: Any,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": betas,
            "alpha": alpha,
            "alpha_warmup": alpha_warmup,
            "beta3_warmup": beta3_warmup,
            "eps": eps,
            "weight_decay": weight_decay,
        }
        super().__init__(params, defaults, **options)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_number("lr", group["lr"], low=0.0)
        check_number("eps", group["eps"], low=0.0)
        check_number("weight_decay", group["weight_decay"], low=0.0)
        check_number("alpha", group["alpha"], low=0.0)
        if len(check_pair("betas", group["betas"])) != 3:
            raise ValueError(
                f"betas must be a triple (beta1, beta2, beta3), got {group['betas']!r}"
            )
        for key in ("alpha_warmup", "beta3_warmup"):
            check_int(key, group[key], low=1, none_ok=True)

    def _init_state(self, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
        for key in ("exp_avg_fast", "exp_avg_slow", "exp_avg_sq"):
            state[key] = torch.zeros_like(p, memory_format=torch.preserve_format)

    _directions_keep_nonfinite = True
    _capturable_directions = True

    def _direction(self, group, params, grads, states, out) -> None:
        beta1, beta2, beta3 = group["betas"]
        steps = [s["step"] for s in states]
        alphas = [alpha_schedule(t, group["alpha"], group["alpha_warmup"]) for t in steps]
        beta3s = [beta3_schedule(t, beta1, beta3, group["beta3_warmup"]) for t in steps]
        fast = [s["exp_avg_fast"] for s in states]
        slow = [s["exp_avg_slow"] for s in states]
        sq = [s["exp_avg_sq"] for s in states]
        on_device = len(steps) > 0 and torch.is_tensor(steps[0])  # capturable: counts there
        torch._foreach_lerp_(fast, grads, 1.0 - beta1)
        if on_device:
            for m, g, b in zip(slow, grads, beta3s, strict=True):
                m.lerp_(g, 1.0 - b)
        else:
            torch._foreach_lerp_(slow, grads, [1.0 - b for b in beta3s])
        torch._foreach_mul_(sq, beta2)
        torch._foreach_addcmul_(sq, grads, grads, 1.0 - beta2)
        if on_device:
            bc2_sqrt, bc1 = device_bias_corrections(steps, beta1, beta2)
        else:
            bc2_sqrt = [math.sqrt(1.0 - beta2**t) for t in steps]
            bc1 = [1.0 - beta1**t for t in steps]
        denom = torch._foreach_sqrt(sq)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, group["eps"])
        torch._foreach_copy_(out, fast)
        torch._foreach_div_(out, bc1)
        if on_device:
            torch._foreach_add_(out, torch._foreach_mul(slow, list(alphas)))
        else:
            for a in sorted(set(alphas)):
                idx = [i for i, x in enumerate(alphas) if x == a]
                torch._foreach_add_([out[i] for i in idx], [slow[i] for i in idx], alpha=a)
        torch._foreach_div_(out, denom)
