"""Learning-rate schedules (``LambdaLR`` factors) and the clipping-threshold schedule.

The LR schedules return callable objects ``factor(step) -> float`` for
``torch.optim.lr_scheduler.LambdaLR``; being objects rather than lambdas, their settings are
saved in the scheduler's ``state_dict``.

A clipping-threshold schedule 𝒮_c of "Enhancing LLM Training via Spectral Clipping" (Algorithm
SPECTRA) is likewise a callable ``factor(step) -> float`` giving ``c_k / c``: ``ClipSchedule``
for fixed shapes, :func:`standard_clip_schedule` for the paper's rule tied to the LR schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from spectra.validate import check_choice, check_int, check_number

ClipScheduleKind = Literal["constant", "linear", "cosine", "sqrt"]
CLIP_SCHEDULE_KINDS: tuple[str, ...] = ("constant", "linear", "cosine", "sqrt")


def _check_steps(warmup_steps: int, total_steps: int) -> None:
    check_int("warmup_steps", warmup_steps, low=0)
    check_int("total_steps", total_steps, low=1)
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} exceeds total_steps={total_steps}")


def _warmup_factor(step: int, warmup_steps: int) -> float:
    # (k+1)/K_w so that the first step already moves and the peak is reached at k = K_w - 1.
    return (step + 1) / warmup_steps


@dataclass
class WSDSchedule:
    """Warmup–stable–decay LR factor; build it with :func:`wsd_schedule`."""

    warmup_steps: int
    total_steps: int
    decay_fraction: float = 0.2

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return _warmup_factor(step, self.warmup_steps)
        decay_steps = round(self.decay_fraction * self.total_steps)
        decay_start = self.total_steps - decay_steps
        if step < decay_start or decay_steps == 0:
            return 1.0 if step < self.total_steps else 0.0
        t = min(1.0, (step - decay_start) / decay_steps)
        return 1.0 - math.sqrt(t)


@dataclass
class CosineSchedule:
    """Linear warmup then cosine decay; build it with :func:`cosine_schedule`."""

    warmup_steps: int
    total_steps: int
    final_ratio: float = 0.0

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return _warmup_factor(step, self.warmup_steps)
        span = max(1, self.total_steps - self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / span)
        return self.final_ratio + (1.0 - self.final_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def wsd_schedule(warmup_steps: int, total_steps: int, decay_fraction: float = 0.2) -> WSDSchedule:
    r"""Warmup–stable–decay LR factor for ``LambdaLR``.

    ``f(k) = (k+1)/K_w`` for ``k < K_w``; 1 until the last ``decay_fraction·K`` steps; then the
    square-root cooldown ``f(k) = 1 − √((k − K_d)/(K − K_d))`` reaching 0 at ``k = K``, with
    ``K_d = K − round(decay_fraction·K)`` (the paper's WSD: sqrt decay to zero over the last 20%).
    """
    _check_steps(warmup_steps, total_steps)
    decay_fraction = check_number("decay_fraction", decay_fraction, low=0.0, high=1.0)
    if warmup_steps > total_steps - round(decay_fraction * total_steps):
        raise ValueError(
            f"warmup_steps={warmup_steps} overlaps the decay phase "
            f"(decay_fraction={decay_fraction}, total_steps={total_steps})"
        )
    return WSDSchedule(warmup_steps, total_steps, decay_fraction)


def cosine_schedule(
    warmup_steps: int, total_steps: int, final_ratio: float = 0.0
) -> CosineSchedule:
    r"""Linear warmup then cosine decay, as a ``LambdaLR`` factor.

    ``f(k) = (k+1)/K_w`` for ``k < K_w``, then ``f = r + (1−r)·(1 + cos(π t))/2`` with
    ``t = (k − K_w)/(K − K_w)`` clamped to [0, 1] and ``r = final_ratio``.
    """
    _check_steps(warmup_steps, total_steps)
    final_ratio = check_number("final_ratio", final_ratio, low=0.0, high=1.0)
    return CosineSchedule(warmup_steps, total_steps, final_ratio)


@dataclass(frozen=True)
class ClipSchedule:
    r"""A clipping-threshold schedule 𝒮_c as a ``step → factor`` callable: ``c_k = c·factor(k)``.

    kinds:

    - ``"constant"``: ``factor = 1``.
    - ``"linear"``, ``"cosine"``, ``"sqrt"``: 1 until the last ``decay_fraction`` of
      ``total_steps``, then a decay to ``final_ratio`` at ``total_steps`` (with ``t ∈ [0, 1]``
      the progress through the decay: ``1 − (1−r)t``, ``r + (1−r)(1 + cos πt)/2``,
      ``1 − (1−r)√t``).

    The paper's "standard" rule depends on the learning-rate schedule; it is
    :func:`standard_clip_schedule`. Any other callable ``step → factor`` works as well.
    """

    kind: ClipScheduleKind = "constant"
    total_steps: int | None = None
    decay_fraction: float = 1.0
    final_ratio: float = 1e-3

    def __post_init__(self) -> None:
        check_choice("clip schedule kind", self.kind, CLIP_SCHEDULE_KINDS)
        check_number("decay_fraction", self.decay_fraction, low=0.0, high=1.0)
        check_number("final_ratio", self.final_ratio, low=0.0, high=1.0, low_open=True)
        if self.kind != "constant":
            check_int(f"total_steps of the {self.kind!r} clip schedule", self.total_steps, low=1)

    def __call__(self, step: int) -> float:
        """``c_k / c`` at 0-based ``step``."""
        if self.kind == "constant":
            return 1.0
        assert self.total_steps is not None
        decay_steps = self.decay_fraction * self.total_steps
        start = self.total_steps - decay_steps
        if step < start or decay_steps <= 0:
            return 1.0
        t = min(1.0, (step - start) / decay_steps)
        r = self.final_ratio
        if self.kind == "linear":
            return 1.0 - (1.0 - r) * t
        if self.kind == "cosine":
            return r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * t))
        return 1.0 - (1.0 - r) * math.sqrt(t)


@dataclass(frozen=True)
class StandardClipSchedule:
    """The paper's "standard" clip schedule; build it with :func:`standard_clip_schedule`."""

    lr_lambda: Callable[[int], float]
    warmup_steps: int

    def __call__(self, step: int) -> float:
        if step >= self.warmup_steps:
            return 1.0
        factor = self.lr_lambda(step)
        return 1.0 / factor if factor > 0 else math.inf


def standard_clip_schedule(
    lr_lambda: Callable[[int], float], warmup_steps: int
) -> StandardClipSchedule:
    r"""The "standard" clipping schedule of Algorithm SPECTRA: ``c_k = c·η/η_k`` during warmup.

    With the learning rate ``η_k = η·S(k)`` given by the ``LambdaLR`` factor ``S = lr_lambda``
    (peak 1), ``c_k = c/S(k)`` for ``k < warmup_steps``, so that the update capacity
    ``c_k·η_k`` stays at ``c·η`` while the learning rate warms up, and ``c_k = c`` afterwards.
    ``S(k) = 0`` gives ``c_k = ∞``: no clipping at that step. Pass the same ``lr_lambda`` object
    that drives the ``LambdaLR`` scheduler.
    """
    if not callable(lr_lambda):
        raise ValueError(f"lr_lambda must be callable, got {lr_lambda!r}")
    return StandardClipSchedule(lr_lambda, check_int("warmup_steps", warmup_steps, low=0))
