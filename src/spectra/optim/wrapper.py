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
Adafactor-style methods without relative step sizes, and so on. Coupled (L2) weight decay,
parameter-norm-relative steps (LAMB, LARS, Adafactor's relative step) or any base that caches
parameter storage (``fused=True`` kernels keyed on pointers, CUDA graphs) are not supported:
the wrapper would silently change their update. The group's ``weight_decay`` is always applied
as SPECTRA's decoupled λ.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from spectra.optim.base import TORCH_BOOKKEEPING, SpectraOptimizer, Work
from spectra.optim.distributed import is_sharded, local, shaped_like
from spectra.optim.settings import check_spectra_settings, keep_schedules, schedules_of
from spectra.validate import check_real_params

#: The wrapper runs the chain over chunks of ``max(largest parameter, total / CHUNKS)`` elements.
CHUNKS = 8


def eighth_chunks(sizes: list[int]) -> int:
    """``max(largest, ⌈total / CHUNKS⌉)``: a chunk budget of about an eighth of ``sizes``."""
    return max(max(sizes), -(-sum(sizes) // CHUNKS))


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
        nonfinite, batch_elements, chunk_elements, split_work: see
            :class:`~spectra.optim.base.SpectraOptimizer`; the wrapper always runs in chunks
            (``chunk_elements=None``: ``max(largest parameter, total / 8)`` elements).
        **spectra: SPECTRA settings (see :mod:`spectra.optim.settings`) used where a group does
            not set its own.
    """

    def __init__(
        self,
        base_optimizer: Optimizer,
        *,
        nonfinite: str = "raise",
        batch_elements: int | None = None,
        chunk_elements: int | None = None,
        split_work: bool = True,
        **spectra: Any,
    ) -> None:
        if not isinstance(base_optimizer, Optimizer):
            raise ValueError(
                f"base_optimizer must be a torch.optim.Optimizer, got {type(base_optimizer)!r}"
            )
        if isinstance(base_optimizer, Spectra):
            raise ValueError("base_optimizer is already a Spectra optimizer")
        self.base = base_optimizer
        self._initialised = False
        super().__init__(
            base_optimizer.param_groups,
            dict(base_optimizer.defaults),
            spectra,
            nonfinite=nonfinite,
            batch_elements=batch_elements,
            chunk_elements=chunk_elements,
            split_work=split_work,
        )
        # The same group dicts and the same list: schedulers and add_param_group see one truth.
        self.param_groups = base_optimizer.param_groups
        self._initialised = True

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
                raise ValueError(
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
        if not self._initialised:
            Optimizer.add_param_group(self, param_group)  # registers the base's existing group
        else:
            self.base.add_param_group(param_group)
        group = self.param_groups[-1]
        for key, value in self.defaults.items():
            if key not in TORCH_BOOKKEEPING:
                group.setdefault(key, value)
        check_real_params(group["params"], "Spectra")
        check_spectra_settings(group)

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
        sd = super().state_dict()
        sd["base_state"] = self.base.state_dict()["state"]
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        base_state = state_dict.pop("base_state")
        built = schedules_of(self.param_groups)
        super().load_state_dict(state_dict)
        self.base.load_state_dict({"state": base_state, "param_groups": state_dict["param_groups"]})
        self.param_groups = self.base.param_groups
        keep_schedules(self.param_groups, built)
