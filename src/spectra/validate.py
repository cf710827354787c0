"""The argument checks of the whole project: one wording for each kind of error.

Every check raises ``ValueError`` whose message starts with the argument's name and ends with
the offending value (``"lr must be a finite number >= 0, got -1.0"``), and returns the value
in its canonical type. The optimizers, the operators, the schedules and the harness's config
all call these.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import sys
import warnings
from collections.abc import Callable, Collection, Iterator
from numbers import Integral, Real
from typing import Any

import torch

__all__ = [
    "add_checked_group",
    "check_choice",
    "check_int",
    "check_number",
    "check_pair",
    "check_param_group",
    "check_params_argument",
    "check_real_params",
    "duplicates_refused",
    "warn_misspelt_keys",
]


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
    """Refuse what a param group (``params``: its list of tensors) cannot train: a complex, an
    integer or a bool parameter, a flattened FSDP1 shard, or one parameter listed twice (its
    step would be taken twice; torch only warns).

    Spectral clipping is defined for complex matrices through their singular values, but the
    operators here work on real Gram matrices and the base directions on real moments.
    """
    seen: dict[int, int] = {}
    for i, p in enumerate(params):
        if not isinstance(p, torch.Tensor):
            continue
        where = f"parameter {i} of its group is {p.dtype} with shape {tuple(p.shape)}"
        if p.is_complex():
            raise ValueError(
                f"{owner} takes real parameters; {where} (view a complex parameter as real with "
                "torch.view_as_real to train it)"
            )
        if not p.is_floating_point():
            raise ValueError(
                f"{owner} takes floating-point parameters; {where}, which cannot have a gradient"
            )
        if getattr(p, "_fsdp_flattened", False):
            # FSDP1 (FullyShardedDataParallel) flattens every parameter it wraps into 1-D
            # shards of a FlatParameter (use_orig_params=True hands out 1-D views of them) and
            # marks each so; no shard knows its matrix, so a clip would see the wrong thing
            raise ValueError(
                f"{owner}: parameter {i} of its group (shape {tuple(p.shape)}) is a flattened "
                "FSDP1 (FullyShardedDataParallel) shard, whose matrices spectral clipping "
                "cannot see; shard the model with FSDP2's torch.distributed.fsdp.fully_shard "
                "instead"
            )
        if id(p) in seen:
            raise ValueError(
                f"{owner}: parameter {i} of its group (shape {tuple(p.shape)}) is parameter "
                f"{seen[id(p)]} again; list each parameter once"
            )
        seen[id(p)] = i


def check_params_argument(params: Any, owner: str) -> None:
    """Refuse a ``params`` argument that torch.optim would misread, with ``TypeError`` as torch
    refuses a tensor there: a module, or a dict (whose iteration gives its keys)."""
    expected = "params must be an iterable of tensors or of param-group dicts"
    if isinstance(params, torch.nn.Module):
        raise TypeError(
            f"{owner}: {expected}, got the module {type(params).__name__}; pass its .parameters()"
        )
    if isinstance(params, dict):
        keys = ", ".join(repr(k) for k in list(params)[:3]) + (", ..." if len(params) > 3 else "")
        raise TypeError(
            f"{owner}: {expected}, got a dict with keys {keys}; pass [that dict] for one param "
            "group, or .values() of a dict of tensors"
        )


def check_param_group(group: Any, index: int, owner: str) -> None:
    """A param group: a dict with ``"params"``."""
    if not isinstance(group, dict) or "params" not in group:
        got = f"keys {sorted(map(str, group))}" if isinstance(group, dict) else repr(group)
        raise ValueError(
            f"{owner}: param group {index} must be a dict with 'params' (the group's tensors) "
            f"and optional settings, got {got}"
        )


def warn_misspelt_keys(group: dict[str, Any], known: Collection[str], owner: str) -> None:
    """Warn of a param-group key that no setting has but that is close to one (``clip_cc``,
    ``Clip_C``): torch.optim keeps a group's other keys as they are (for schedulers, names,
    ...), so a misspelt setting would silently stay at its default."""
    names = {k.lower(): k for k in known if isinstance(k, str)}
    for key in group:
        if key in known or key in ("params", "param_names") or not isinstance(key, str):
            continue
        close = difflib.get_close_matches(key.lower(), list(names), n=1, cutoff=0.85)
        if close:
            name = names[close[0]]
            warnings.warn(
                f"{owner}: param group key {key!r} is not a setting (did you mean {name!r}? "
                f"it stays {group.get(name)!r}); a group's other keys are kept unread",
                UserWarning,
                stacklevel=_caller_level(),
            )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside spectra and torch.optim: the user's call,
    however deep the library called this from."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith(
        ("spectra.", "torch.optim")
    ):
        frame, level = frame.f_back, level + 1
    return level


def add_checked_group(
    groups: list[dict[str, Any]],
    param_group: Any,
    owner: str,
    add: Callable[[dict[str, Any]], None],
    check: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """``add(param_group)`` (torch's ``add_param_group``, or a wrapped optimizer's) with the
    checks every optimizer here makes: the group's shape first, then, on the group as added
    to ``groups``, its parameters (real, each listed once) and ``check(group)``. A group that
    fails is taken out of ``groups`` again before the error propagates."""
    check_param_group(param_group, len(groups), owner)
    with duplicates_refused():
        add(param_group)
    group = groups[-1]
    try:
        check_real_params(group["params"], owner)
        check(group)
    except ValueError:
        groups.pop()
        raise
    return group


@contextlib.contextmanager
def duplicates_refused() -> Iterator[None]:
    """Around torch's ``add_param_group``: its warning about a parameter listed twice is left
    out, as :func:`check_real_params` refuses that parameter by its index."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="optimizer contains a parameter group with duplicate parameters",
            category=UserWarning,
        )
        yield
