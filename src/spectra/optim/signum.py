"""Signum (Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex Problems") with
Nesterov momentum, inside the SPECTRA step."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from spectra.optim.base import SpectraOptimizer
from spectra.validate import check_number


def signum_direction(
    grads: list[Tensor], bufs: list[Tensor], momentum: float, nesterov: bool, out: list[Tensor]
) -> None:
    r"""``M ← βM + (1−β)g``; ``U = sign(βM + (1−β)g)`` (Nesterov) or ``U = sign(M)``.

    With buffers starting at zero this is the sign of torch's SGD-Nesterov direction
    ``g + β(βM' + g)``, ``M' = M/(1−β)``, so the two conventions give the same update.
    """
    torch._foreach_lerp_(bufs, grads, 1.0 - momentum)
    if nesterov:
        torch._foreach_copy_(out, grads)
        torch._foreach_lerp_(out, bufs, momentum)
    else:
        torch._foreach_copy_(out, bufs)
    torch._foreach_sign_(out)


class Signum(SpectraOptimizer):
    r"""Signum with SPECTRA post-clipping (Spectra-Signum).

    ``U = sign(βM + (1−β)g)`` with Nesterov momentum (buffers start at zero);
    ``X ← (1−λη)X − αη·H_{c_k}(U)``. The spectral norm of a sign matrix is at least
    √max(m, n), which is why Signum profits most from the clip. Defaults follow the paper's
    tables (lr 1e-3 for Spectra-Signum, β = 0.95, Nesterov, λ = 0.1, c = 10).

    Args:
        params: parameters or param groups.
        lr, momentum, nesterov, weight_decay: Signum hyperparameters (``momentum=0`` is signSGD).
        **options: SPECTRA settings and engine options; see :class:`~spectra.optim.AdamW`.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.1,
        **options: Any,
    ) -> None:
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
        super().__init__(params, defaults, **options)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_number("lr", group["lr"], low=0.0)
        check_number("weight_decay", group["weight_decay"], low=0.0)
        check_number("momentum", group["momentum"], low=0.0, high=1.0, high_open=True)
        if not isinstance(group["nesterov"], bool):
            raise ValueError(f"nesterov must be a bool, got {group['nesterov']!r}")

    def _init_state(self, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    _capturable_directions = True  # the step count plays no part

    def _direction(self, group, params, grads, states, out) -> None:
        bufs = [s["momentum_buffer"] for s in states]
        signum_direction(grads, bufs, group["momentum"], group["nesterov"], out)
