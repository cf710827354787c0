r"""``Spectra``: SPECTRA around any torch optimizer with decoupled weight decay.

The wrapper is :class:`~spectra.optim.base.SpectraOptimizer` with the wrapped optimizer as its
direction link. It recovers the base's directions without copying the weights: for a chunk of
about an eighth of the parameters at a time, it points the base's param groups at that chunk,
swaps each ``p.data`` for a zeroed buffer, calls ``base.step()`` — each buffer becomes
``−η·U`` — restores the weights and groups, and hands ``U`` to the SPECTRA chain, which
applies ``X ← (1 − λη)X − αη·post(U)`` in place. Only one chunk's buffers (and the base's
temporaries for that chunk) are alive at a time; a non-finite direction stops the step before
its chunk's update, after earlier chunks were applied.

Assumption: the base's update of a parameter depends on the parameter's value only through
decoupled weight decay. That holds for AdamW, Adam/SGD/RMSprop without weight decay, Lion,
Adafactor-style methods without relative step sizes, and so on. The group's ``weight_decay``
is always applied as SPECTRA's decoupled λ, so a base's coupled (L2) weight decay becomes
decoupled decay; the wrapper says so with a ``UserWarning`` at construction
(:func:`coupled_decay_warning`). Parameter-norm-relative steps (LAMB, LARS, Adafactor's relative
step) or any base that caches parameter storage (``fused=True`` kernels keyed on pointers, CUDA
graphs) are not supported: the wrapper would silently change their update.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from spectra.optim.base import TORCH_BOOKKEEPING, SpectraOptimizer, Work
from spectra.optim.distributed import is_sharded, local, shaped_like
from spectra.optim.settings import check_spectra_settings, keep_schedules, schedules_of
from spectra.validate import (
    add_checked_group,
    check_number,
    warn_misspelt_keys,
)

#: The wrapper runs the chain over chunks of ``max(largest parameter, total / CHUNKS)`` elements.
CHUNKS = 8


def eighth_chunks(sizes: list[int]) -> int:
    """``max(largest, ⌈total / CHUNKS⌉)``: a chunk budget of about an eighth of ``sizes``."""
    return max(max(sizes), -(-sum(sizes) // CHUNKS))


#: torch optimizers whose ``weight_decay`` is coupled (L2: ``λX`` is added to the gradient)
#: unless a group sets ``decoupled_weight_decay``.
COUPLED_DECAY: tuple[type[Optimizer], ...] = (
    torch.optim.SGD,
    torch.optim.Adam,  # torch.optim.AdamW is one, with decoupled_weight_decay=True
    torch.optim.Adagrad,
    torch.optim.Adamax,
    torch.optim.ASGD,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.RMSprop,
)


def coupled_decay_warning(base: Optimizer) -> str | None:
    """What the wrapper does to ``base``'s coupled weight decay, or ``None`` when it has none.

    The base sees zeros in place of the weights, so its L2 term ``λX`` vanishes, and the chain
    applies the group's ``weight_decay`` as decoupled decay, ``X ← (1 − ηλ) X``, outside the
    base's direction and the clip. For plain SGD without momentum the two agree; with momentum,
    or an adaptive base, they differ.
    """
    if not isinstance(base, COUPLED_DECAY):
        return None
    decayed = [
        (i, group["weight_decay"])
        for i, group in enumerate(base.param_groups)
        if group.get("weight_decay", 0.0) != 0.0 and not group.get("decoupled_weight_decay")
    ]
    if not decayed:
        return None
    name = type(base).__name__
    where = " and ".join(f"weight_decay={wd!r} in param group {i}" for i, wd in decayed)
    return (
        f"Spectra({name}): {where} {'is' if len(decayed) == 1 else 'are'} coupled L2 decay "
        f"for {name} (added to the gradient); Spectra applies it as decoupled decay instead, "
        f"X <- (1 - lr * weight_decay) * X at each step, outside {name}'s direction and the "
        f"clip. To keep this decoupled decay, nothing needs to change (filter this warning); "
        f"to avoid it, build {name} with weight_decay=0 (and put an L2 term in the loss for "
        f"L2 regularisation)."
    )


class Spectra(SpectraOptimizer):
    r"""Wrap ``base_optimizer`` so each step is ``X ← (1−λη)X − αη·H_{c_k}(U)``.

    ``U`` is the base's direction, ``η`` and ``λ`` the group's ``lr`` and ``weight_decay``.
    The wrapper shares the base's param groups (an LR scheduler attached to either moves both;
    per-group SPECTRA settings can be given as keys of the base's param groups), keeps its own
    per-parameter step counter for the clip schedules, and saves the base's state inside its
    own ``state_dict``. ``closure`` is evaluated once per step.

    Args:
        base_optimizer: a constructed ``torch.optim.Optimizer``; see the module docstring for
            the assumption it must satisfy.
        **options: SPECTRA settings (see :mod:`spectra.optim.settings`) used where a group does
            not set its own, and the engine options ``nonfinite``, ``batch_elements``,
            ``chunk_elements``, ``split_work`` (see :class:`~spectra.optim.base.SpectraOptimizer`);
            the wrapper always runs in chunks (``chunk_elements=None``:
            ``max(largest parameter, total / 8)`` elements).

    A base whose groups have a non-zero coupled (L2) ``weight_decay`` (torch's SGD, Adam,
    RMSprop, … without ``decoupled_weight_decay``) gets a ``UserWarning`` at construction: the
    wrapper applies that value as decoupled decay (see :func:`coupled_decay_warning`).
    """

    def __init__(self, base_optimizer: Optimizer, **options: Any) -> None:
        if not isinstance(base_optimizer, Optimizer):
            raise ValueError(
                f"base_optimizer must be a torch.optim.Optimizer, got {type(base_optimizer)!r}"
            )
        if isinstance(base_optimizer, Spectra):
            raise ValueError("base_optimizer is already a Spectra optimizer")
        closure = inspect.signature(base_optimizer.step).parameters.get("closure")
        if closure is not None and closure.default is inspect.Parameter.empty:
            name = type(base_optimizer).__name__
            raise ValueError(
                f"base_optimizer {name} needs a closure in step() (it re-evaluates the loss at "
                f"other weights, as a line search does), which Spectra cannot give it: Spectra "
                "takes a base whose step() runs on the gradients alone"
            )
        self.base = base_optimizer
        self._initialised = False
        super().__init__(base_optimizer.param_groups, dict(base_optimizer.defaults), **options)
        # The same group dicts and the same list: schedulers and add_param_group see one truth.
        self.param_groups = base_optimizer.param_groups
        self._initialised = True
        message = coupled_decay_warning(base_optimizer)
        if message is not None:
            warnings.warn(message, UserWarning, stacklevel=2)

    def _work(self) -> Work:
        self._relink()
        return super()._work()

    def _relink(self) -> None:
        """Share the base's ``param_groups`` again where it replaced them (its own
        ``load_state_dict`` does): each new group keeps the settings of the group it replaced
        that it does not set itself (its SPECTRA settings, for one). Otherwise the chunks would
        narrow the old groups while the base stepped every parameter in the new ones."""
        if self.param_groups is self.base.param_groups:
            return
        old = self.param_groups
        self.param_groups = self.base.param_groups
        for i, group in enumerate(self.param_groups):
            for key, value in (old[i] if i < len(old) else self.defaults).items():
                if key not in TORCH_BOOKKEEPING:
                    group.setdefault(key, value)
            check_spectra_settings(group)

    def _chunk_elements(self, params: list[Tensor]) -> int | None:
        # The base's own step keeps full-size temporaries of whatever it is given (torch's
        # foreach AdamW: one), so the wrapper hands it an eighth of the parameters at a time,
        # unless chunk_elements says otherwise.
        if self.defaults["chunk_elements"] is not None:
            return self.defaults["chunk_elements"]
        return eighth_chunks([p.numel() for p in params])

    def _directions(self, work: Work, idx: list[int], grads: list[Tensor]) -> list[Tensor]:
        """``base.step()`` on zeroed stand-ins for the weights ``idx``: each becomes ``−η·U``.

        A plain parameter's ``.data`` is swapped for a zeroed buffer. A ``DTensor`` parameter
        ignores ``.data`` assignment, so its local shard is saved, zeroed, read back after the
        step and restored.
        """
        where = [(group, p) for group, params in work for p in params]
        params = [where[i][1] for i in idx]
        chosen = set(map(id, params))
        groups = self.param_groups
        saved_groups = [g["params"] for g in groups]
        saved_grads = [p.grad for p in params]
        saved = [local(p).clone() if is_sharded(p) else p.data for p in params]
        try:
            for g in groups:
                g["params"] = [p for p in g["params"] if id(p) in chosen]
            for p, grad in zip(params, grads, strict=True):
                if is_sharded(p):
                    local(p).zero_()
                else:
                    p.data = torch.zeros_like(p, memory_format=torch.contiguous_format)
                p.grad = shaped_like(p, grad)
            # The base's unhooked step: torch's step hooks fire once, for this optimizer, which
            # they see whole, not once per chunk for a narrowed base.
            base_step = type(self.base).step
            try:
                getattr(base_step, "__wrapped__", base_step)(self.base)
            except RuntimeError as err:
                if "sparse" not in str(err):
                    raise
                raise RuntimeError(
                    f"{type(self.base).__name__} does not support sparse gradients, which "
                    f"Spectra passed it as they are: {err}"
                ) from None
            bufs = [local(p).clone() if is_sharded(p) else p.data for p in params]
        finally:
            for p, data, grad in zip(params, saved, saved_grads, strict=True):
                if is_sharded(p):
                    local(p).copy_(data)
                else:
                    p.data = data
                p.grad = grad
            for g, ps in zip(groups, saved_groups, strict=True):
                g["params"] = ps
        # The base's decoupled weight decay acted on zeros. With η = 0 the step cannot move
        # the weights, and U stays 0.
        lrs = [float(where[i][0]["lr"]) for i in idx]
        torch._foreach_div_(bufs, [-lr if lr != 0.0 else 1.0 for lr in lrs])
        return bufs

    #: Sparse gradients go to the base as they are (torch's SGD, for one, takes them).
    _sparse_directions = True

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """The base's ``add_param_group``; a group that fails a check is not added."""
        # before initialisation this registers the base's own groups
        add = self.base.add_param_group if self._initialised else self._add_own_group

        def check(group: dict[str, Any]) -> None:
            for key, value in self.defaults.items():
                if key not in TORCH_BOOKKEEPING:
                    group.setdefault(key, value)
            # the chain reads U off the base's step as its update over -lr
            check_number("lr", group.get("lr"), low=0.0)
            check_spectra_settings(group)

        group = add_checked_group(self.param_groups, param_group, "Spectra", add, check)
        warn_misspelt_keys(group, self.defaults, "Spectra")

    def _add_own_group(self, param_group: dict[str, Any]) -> None:
        Optimizer.add_param_group(self, param_group)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "base": self.base}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_initialised", True)
        if "base" in state:
            self.param_groups = self.base.param_groups

    def __repr__(self) -> str:
        return f"Spectra({type(self.base).__name__}) " + super().__repr__().split(" ", 1)[1]

    def state_dict(self) -> dict[str, Any]:
        """Own state and param groups, plus the base's per-parameter state as ``base_state``."""
        self._relink()
        sd = super().state_dict()
        sd["base_state"] = self.base.state_dict()["state"]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if isinstance(state_dict, dict) and "base_state" not in state_dict:
            raise ValueError(
                "Spectra.load_state_dict: the state_dict has no 'base_state' (the wrapped "
                "optimizer's state), so Spectra did not save it; load a state_dict of the base "
                "optimizer with spectra_optimizer.base.load_state_dict(...) (Spectra's step "
                "counts, which its clip schedules read, then start at 0)"
            )
        state_dict = dict(state_dict)
        base_state = state_dict.pop("base_state")
        built = schedules_of(self.param_groups)
        super().load_state_dict(state_dict)
        self.base.load_state_dict({"state": base_state, "param_groups": state_dict["param_groups"]})
        self.param_groups = self.base.param_groups
        keep_schedules(self.param_groups, built)
