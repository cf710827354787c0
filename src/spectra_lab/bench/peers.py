"""The optimizers a user would pick instead, as ``spectra bench optim`` runs them beside SPECTRA:
torch's Muon with torch's AdamW, and the check for torch's fused AdamW."""

from __future__ import annotations

import torch
from torch import Tensor


class MuonWithAdamW:
    """``torch.optim.Muon`` on the hidden matrices and ``torch.optim.AdamW`` on the rest, set up
    as torch's docs show (their example's learning rates, momentum and weight decay)."""

    def __init__(self, params: list[Tensor]):
        from spectra.optim.baselines.dmuon import MUON_MAX_DIM

        hidden = [p for p in params if p.dim() == 2 and max(p.shape) < MUON_MAX_DIM]
        rest = [p for p in params if not any(p is h for h in hidden)]
        self.optimizers: list[torch.optim.Optimizer] = [
            torch.optim.Muon(hidden, lr=0.02, momentum=0.95)
        ]
        if rest:
            self.optimizers.append(torch.optim.AdamW(rest, lr=3e-4, weight_decay=0.01))

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()


def fused_adamw_note(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why ``torch.optim.AdamW(fused=True)`` cannot run on ``device`` for ``dtype`` parameters
    (torch's own refusal), or None where it runs."""
    p = torch.zeros(2, device=device, dtype=dtype, requires_grad=True)
    p.grad = torch.zeros_like(p)
    try:
        torch.optim.AdamW([p], fused=True).step()
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        return f"torch-adamw-fused skipped: torch has no fused AdamW here ({exc})"
    return None
