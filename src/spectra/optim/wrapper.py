r"""``Spectra``: SPECTRA around any torch optimizer with decoupled weight decay.

For each parameter in turn the wrapper recovers the base optimizer's direction without copying
the weights: it points the base's param groups at that one parameter, swaps ``p.data`` for a
zeroed buffer, calls ``base.step()`` — the buffer becomes ``−η·U`` — restores ``p.data`` and
applies ``X ← (1 − λη)X − αη·post(U)`` in place. At most one parameter-sized buffer (plus the
operator's temporaries for that one parameter) is alive at a time.

Assumption: the base's update of a parameter depends on the parameter's value only through
decoupled weight decay. That holds for AdamW, Adam/SGD/RMSprop without weight decay, Lion,
Adafactor-style methods without relative step sizes, and so on. Coupled (L2) weight decay,
parameter-norm-relative steps (LAMB, LARS, Adafactor's relative step) or any base that caches
parameter storage (``fused=True`` kernels keyed on pointers, CUDA graphs) are not supported:
the wrapper would silently change their update. The group's ``weight_decay`` is always applied
as SPECTRA's decoupled λ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from spectra.optim.base import (
    SPECTRA_DEFAULTS,
    check_nonfinite,
    clip_scale,
    handle_nonfinite,
    matrix_shape,
    post_active,
    post_threshold,
    pre_clip,
    pre_threshold,
    spectral_post,
    spectral_settings,
)


class Spectra(Optimizer):
    r"""Wrap ``base_optimizer`` so each step is ``X ← (1−λη)X − αη·H_{c_k}(U)``.

    ``U`` is the base's direction, ``η`` and ``λ`` the group's ``lr`` and ``weight_decay``.
    The wrapper shares the base's param groups (an LR scheduler attached to either moves both;
    per-group SPECTRA settings can be given as keys of the base's param groups), keeps its own
    per-parameter step counter for the clip schedules, and saves the base's state inside its
    own ``state_dict``. ``closure`` is evaluated once per step.

    Args:
        base_optimizer: a constructed ``torch.optim.Optimizer``; see the module docstring for
            the assumption it must satisfy.
        nonfinite: ``"raise"`` or ``"skip"`` (see :class:`~spectra.optim.base.SpectraOptimizer`).
        **spectra: SPECTRA settings (``clip_c``, ``clip_scale``, ``clip_method``,
            ``clip_schedule``, ``clip_params``, ``post``, ``pre_clip_c``, ``pre_clip_schedule``,
            ``warmup_steps``, ``peak_lr``) used where a group does not set its own.
    """

    def __init__(self, base_optimizer: Optimizer, *, nonfinite: str = "raise", **spectra: Any):
        if not isinstance(base_optimizer, Optimizer):
            raise ValueError(
                f"base_optimizer must be a torch.optim.Optimizer, got {type(base_optimizer)!r}"
            )
        if isinstance(base_optimizer, Spectra):
            raise ValueError("base_optimizer is already a Spectra optimizer")
        unknown = set(spectra) - set(SPECTRA_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown SPECTRA settings {sorted(unknown)}")
        settings = {**SPECTRA_DEFAULTS, **spectra}
        spectral_settings(settings)
        self.base = base_optimizer
        self._initialised = False
        defaults = {**base_optimizer.defaults, **settings, "nonfinite": check_nonfinite(nonfinite)}
        self.num_skipped_steps = 0
        super().__init__(base_optimizer.param_groups, defaults)
        # The same group dicts and the same list: schedulers and add_param_group see one truth.
        self.param_groups = base_optimizer.param_groups
        self._initialised = True

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if not self._initialised:
            super().add_param_group(param_group)  # registers the base's existing group
        else:
            self.base.add_param_group(param_group)
        group = self.param_groups[-1]
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        spectral_settings(group)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "base": self.base}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("num_skipped_steps", 0)
        self.__dict__.setdefault("_initialised", True)
        if "base" in state:
            self.param_groups = self.base.param_groups

    def __repr__(self) -> str:
        return f"Spectra({type(self.base).__name__}) " + super().__repr__().split(" ", 1)[1]

    def state_dict(self) -> dict[str, Any]:
        """Own state and param groups, plus the base's per-parameter state as ``base_state``."""
        sd = super().state_dict()
        sd["base_state"] = self.base.state_dict()["state"]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        base_state = state_dict.pop("base_state")
        super().load_state_dict(state_dict)
        self.base.load_state_dict({"state": base_state, "param_groups": state_dict["param_groups"]})
        self.param_groups = self.base.param_groups

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One SPECTRA step around the base optimizer; ``closure`` is called once."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = self.param_groups
        grads = [p.grad for g in groups for p in g["params"] if p.grad is not None]
        if not grads or not handle_nonfinite(self, grads, self.defaults["nonfinite"]):
            return loss
        saved = [g["params"] for g in groups]
        try:
            for g in groups:
                g["params"] = []
            for group, params in zip(groups, saved, strict=True):
                for p in params:
                    if p.grad is not None:
                        group["params"] = [p]
                        self._step_param(group, p)
                group["params"] = []
        finally:
            for g, params in zip(groups, saved, strict=True):
                g["params"] = params
        return loss

    def _step_param(self, group: dict[str, Any], p: Tensor) -> None:
        state = self.state[p]
        state["step"] = state.get("step", 0) + 1
        k = state["step"] - 1
        lr = float(group["lr"])
        shape = matrix_shape(p, group["clip_params"])

        grad = p.grad
        c_pre = pre_threshold(group, k) if shape is not None else None
        if c_pre is not None:
            p.grad = pre_clip(grad.reshape(1, *shape), group, c_pre).view(p.shape)

        weights = p.data
        buf = torch.zeros_like(weights)
        p.data = buf
        try:
            self.base.step()
        finally:
            p.data = weights
            p.grad = grad
        if lr == 0.0:
            return
        # buf = −η·U: the base's decoupled weight decay acted on zeros.
        U = buf.div_(-lr)
        alpha = 1.0
        if shape is not None and post_active(group):
            c = post_threshold(group, k)
            U = spectral_post(U.view(1, *shape), group, c).view(p.shape)
            alpha = clip_scale(group, shape)
        wd = float(group.get("weight_decay", 0.0))
        if wd != 0.0:
            p.mul_(1.0 - lr * wd)
        p.add_(U, alpha=-alpha * lr)
