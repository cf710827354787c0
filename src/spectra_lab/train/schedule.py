"""The learning-rate schedule of a run: ``η_k = η · S_lr(k)`` and its checkpoint component.

:func:`build_lr_lambda` turns the config's schedule (WSD, cosine or constant, with linear
warmup; ``spectra.optim.schedules``) into ``S_lr``; :class:`LRSchedule` steps it and saves the
step it is at.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from spectra import cosine_schedule, wsd_schedule
from spectra_lab.train.config import ConfigError, TrainConfig


def build_lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """``S_lr(k)``: the multiplier of the peak learning rate at 0-based step ``k``."""
    try:
        if cfg.schedule == "cosine":
            return cosine_schedule(cfg.warmup, cfg.steps, final_ratio=cfg.final_lr_ratio)
        decay = cfg.decay_fraction if cfg.schedule == "wsd" else 0.0  # "constant": no decay
        return wsd_schedule(cfg.warmup, cfg.steps, decay_fraction=decay)
    except ValueError as exc:
        raise ConfigError(f"config field 'schedule' = {cfg.schedule!r}: {exc}") from None


class LRSchedule:
    """``LambdaLR`` as a component whose state is the step it is at.

    The schedule itself is the run's config, not the checkpoint's, so that ``--steps``
    may extend a finished WSD run. Loading rebuilds ``LambdaLR`` at the saved step with
    the public ``last_epoch`` argument; load the optimizer first, since the rebuilt
    scheduler takes its peak lr from the groups' ``initial_lr``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, lr_lambda: Callable[[int], float]):
        self.optimizer = optimizer
        self.lr_lambda = lr_lambda
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    def step(self) -> None:
        self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.scheduler.last_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # LambdaLR(last_epoch=k-1) steps once on construction: the lr becomes
        # initial_lr * lr_lambda(k), the lr of step k.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, self.lr_lambda, last_epoch=state["step"] - 1
        )
