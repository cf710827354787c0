"""Learning-rate schedules (``LambdaLR`` factors) and the clipping-threshold schedule.

The LR schedules return callable objects ``factor(step) -> float`` for
``torch.optim.lr_scheduler.LambdaLR``; being objects rather than lambdas, their settings are
saved in the scheduler's ``state_dict``.

``ClipSchedule`` is the clipping-threshold schedule 𝒮_c of "Enhancing LLM Training via Spectral
Clipping" (Algorithm SPECTRA): it maps the step k and the current and peak learning rates to
the multiplier ``c_k / c``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

ClipScheduleKind = Literal["standard", "constant", "linear", "cosine", "sqrt"]
CLIP_SCHEDULE_KINDS: tuple[str, ...] = ("standard", "constant", "linear", "cosine", "sqrt")


def _check_steps(warmup_steps: int, total_steps: int) -> None:
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be an int >= 1, got {total_steps!r}")
    if warmup_steps > total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} exceeds total_steps={total_steps}")


def _check_fraction(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


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
    decay_fraction = _check_fraction(decay_fraction, "decay_fraction")
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
    final_ratio = _check_fraction(final_ratio, "final_ratio")
    return CosineSchedule(warmup_steps, total_steps, final_ratio)


@dataclass(frozen=True)
class ClipSchedule:
    r"""Clipping-threshold schedule 𝒮_c: ``c_k = c · factor(k)``.

    kinds:

    - ``"standard"`` (the paper's default): ``c_k = c·η/η_k`` while ``k < warmup_steps`` (the
      param group's ``warmup_steps`` key), so that the update capacity ``c_k η_k`` stays at
      ``c η`` during LR warmup; ``c_k = c`` afterwards. ``η`` is the peak LR (see
      ``docs/optimizers.md`` for how it is found) and ``η_k`` the group's current ``lr``.
    - ``"constant"``: ``c_k = c``.
    - ``"linear"``, ``"cosine"``, ``"sqrt"``: ``c`` until the last ``decay_fraction`` of
      ``total_steps``, then a decay to ``final_ratio·c`` at ``total_steps`` (with
      ``t ∈ [0, 1]`` the progress through the decay: ``1 − (1−r)t``,
      ``r + (1−r)(1 + cos πt)/2``, ``1 − (1−r)√t``).

    A group stores its schedule as a plain dict (``as_dict``) so that optimizer checkpoints load
    with ``torch.load(weights_only=True)``.
    """

    kind: ClipScheduleKind = "standard"
    total_steps: int | None = None
    decay_fraction: float = 1.0
    final_ratio: float = 1e-3

    def __post_init__(self) -> None:
        if self.kind not in CLIP_SCHEDULE_KINDS:
            raise ValueError(
                f"unknown clip schedule kind {self.kind!r}; expected one of {CLIP_SCHEDULE_KINDS}"
            )
        _check_fraction(self.decay_fraction, "decay_fraction")
        fr = self.final_ratio
        if isinstance(fr, bool) or not isinstance(fr, (int, float)) or not 0.0 < fr <= 1.0:
            raise ValueError(f"final_ratio must be a number in (0, 1], got {fr!r}")
        if self.kind in ("linear", "cosine", "sqrt"):
            ts = self.total_steps
            if isinstance(ts, bool) or not isinstance(ts, int) or ts < 1:
                raise ValueError(
                    f"clip schedule {self.kind!r} needs total_steps (an int >= 1), got {ts!r}"
                )

    @classmethod
    def coerce(cls, value: Any) -> ClipSchedule:
        """Build a schedule from a kind name, a dict of fields, or a ``ClipSchedule``."""
        if isinstance(value, ClipSchedule):
            return value
        if isinstance(value, str):
            return cls(kind=value)  # type: ignore[arg-type]
        if isinstance(value, dict):
            unknown = set(value) - {"kind", "total_steps", "decay_fraction", "final_ratio"}
            if unknown:
                raise ValueError(f"unknown clip schedule fields {sorted(unknown)}")
            return cls(**value)
        raise ValueError(
            f"a clip schedule must be a kind name, a dict or a ClipSchedule, got {value!r}"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def factor(self, step: int, lr: float, peak_lr: float, warmup_steps: int) -> float:
        """Return ``c_k / c`` at 0-based ``step`` (``inf`` means no clipping this step)."""
        if self.kind == "standard":
            if step < warmup_steps:
                return peak_lr / lr if lr > 0 else math.inf
            return 1.0
        if self.kind == "constant":
            return 1.0
        total = self.total_steps
        assert total is not None
        decay_steps = self.decay_fraction * total
        start = total - decay_steps
        if step < start or decay_steps <= 0:
            return 1.0
        t = min(1.0, (step - start) / decay_steps)
        r = self.final_ratio
        if self.kind == "linear":
            return 1.0 - (1.0 - r) * t
        if self.kind == "cosine":
            return r + (1.0 - r) * 0.5 * (1.0 + math.cos(math.pi * t))
        return 1.0 - (1.0 - r) * math.sqrt(t)
