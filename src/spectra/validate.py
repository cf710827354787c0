"""The argument checks of the whole project: one wording for each kind of error.

Every check raises ``ValueError`` whose message starts with the argument's name and ends with
the offending value (``"lr must be a finite number >= 0, got -1.0"``), and returns the value
in its canonical type. The optimizers, the operators, the schedules and the harness's config
all call these.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from numbers import Integral, Real
from typing import Any

import torch

__all__ = ["check_choice", "check_int", "check_number", "check_pair", "check_real_params"]


def _scalar(value: Any) -> Any:
    # A one-element tensor (a tensor lr, as torch's optimizers accept) counts as its number.
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return value.item()
    return value


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    none_ok: bool = False,
) -> float | None:
    """A finite real number in the interval given by ``low``/``high``; ``None`` if allowed.

    ``low_open``/``high_open`` exclude the end point. Booleans are not numbers.
    """
    if value is None and none_ok:
        return None
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        # torch's optimizers' wording for a tensor lr
        raise ValueError(
            f"Tensor {name} must be 1-element, got a tensor of shape {tuple(value.shape)}"
        )
    x = _scalar(value)
    ok = isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)
    if ok and low is not None:
        ok = x > low if low_open else x >= low
    if ok and high is not None:
        ok = x < high if high_open else x <= high
    if not ok:
        raise ValueError(
            f"{name} must be {_describe(low, high, low_open, high_open, none_ok)}, got {value!r}"
        )
    return float(x)


def _describe(low, high, low_open, high_open, none_ok) -> str:
    if low is not None and high is not None:
        what = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        what = f"a finite number {'>' if low_open else '>='} {low:g}"
    elif high is not None:
        what = f"a finite number {'<' if high_open else '<='} {high:g}"
    else:
        what = "a finite number"
    return f"None or {what}" if none_ok else what


def check_int(
    name: str, value: Any, *, low: int | None = None, none_ok: bool = False
) -> int | None:
    """An integer (not a bool) ``>= low``; ``None`` if allowed."""
    if value is None and none_ok:
        return None
    ok = isinstance(value, Integral) and not isinstance(value, bool)
    if ok and low is not None:
        ok = value >= low
    if not ok:
        bound = f" >= {low}" if low is not None else ""
        prefix = "None or " if none_ok else ""
        raise ValueError(f"{name} must be {prefix}an int{bound}, got {value!r}")
    return int(value)


def check_choice(name: str, value: Any, choices: Collection[Any]) -> Any:
    """One of ``choices``."""
    try:
        ok = value in choices
    except TypeError:  # unhashable value against a set
        ok = False
    if not ok:
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value


def check_pair(name: str, value: Any, *, low: float = 0.0, high: float = 1.0) -> tuple[float, ...]:
    """A tuple or list of numbers in ``[low, high)``, such as Adam's betas."""
    if not isinstance(value, (tuple, list)) or not value:
        raise ValueError(f"{name} must be a tuple of numbers, got {value!r}")
    return tuple(
        check_number(f"{name}[{i}]", b, low=low, high=high, high_open=True)
        for i, b in enumerate(value)
    )


def check_real_params(params: Any, owner: str) -> None:
    """Refuse complex parameters (``params``: a param group's list of tensors).

    Spectral clipping is defined for complex matrices through their singular values, but the
    operators here work on real Gram matrices and the base directions on real moments.
    """
    for i, p in enumerate(params):
        if isinstance(p, torch.Tensor) and p.is_complex():
            raise ValueError(
                f"{owner} takes real parameters; parameter {i} of its group is {p.dtype} with "
                f"shape {tuple(p.shape)} (view a complex parameter as real with "
                "torch.view_as_real to train it)"
            )
