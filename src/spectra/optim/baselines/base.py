"""``BaselineOptimizer``: the torch.optim frame the baselines share.

A baseline steps one parameter at a time on whole tensors (under FSDP2 the shards of a
``DTensor`` parameter are assembled first, see
:func:`~spectra.optim.distributed.whole_parameter`), so it needs none of the SPECTRA chain's
batching. What it shares with the chain are the links of the update itself (the Adam moments,
the decoupled weight decay and the learning-rate step; see :mod:`spectra.optim.chain`).

A subclass supplies:

* ``_check_group(group)``: validate a group's hyperparameters (raise ``ValueError``);
  called on the defaults before ``params`` is looked at, and on every group as it is added;
* optionally ``_check_params(group)``: validate a group's parameters against its settings;
* ``_update(group, p, w, g)``: one step of the weights ``w`` (``p`` itself, or its whole
  tensor under FSDP2) with gradient ``g`` and the state of ``p``; with ``_on_shards`` a
  ``DTensor`` parameter's step gets its local shards instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from spectra.optim.distributed import (
    check_layout,
    is_sharded,
    local,
    sparse_error,
    whole_parameter,
)
from spectra.optim.settings import LAYOUT_KEYS, SPECTRA_DEFAULTS
from spectra.validate import (
    add_checked_group,
    check_params_argument,
)


class BaselineOptimizer(Optimizer):
    """Base class of the baselines: checked hyperparameters and a per-parameter step."""

    def __init__(self, params: Any, defaults: dict[str, Any]) -> None:
        # Hyperparameters are checked before the parameters are looked at.
        self._check_group(defaults)
        check_params_argument(params, type(self).__name__)
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        """Validate the hyperparameters of a group (raise ``ValueError``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _check_group")

    #: Whether ``_update`` takes a ``DTensor`` parameter's local shards (``w`` and ``g`` its
    #: local parts, its state ``DTensor``s of its layout); otherwise it gets whole tensors.
    _on_shards = False

    def _check_params(self, group: dict[str, Any]) -> None:
        """Validate the parameters of a group against its settings (raise ``ValueError``)."""

    def _update(self, group: dict[str, Any], p: Tensor, w: Tensor, g: Tensor) -> None:
        """One step of the weights ``w`` with gradient ``g``, keeping the state of ``p``."""
        raise NotImplementedError(f"{type(self).__name__} must implement _update")

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``; a group that fails a check is not added."""

        def check(group: dict[str, Any]) -> None:
            for key in LAYOUT_KEYS:  # (it would step each tensor as one matrix, silently)
                if group.get(key, SPECTRA_DEFAULTS[key]) != SPECTRA_DEFAULTS[key]:
                    raise ValueError(
                        f"{type(self).__name__} takes no {key} (got {group[key]!r}), a setting "
                        "of spectra's clipping optimizers; give it groups without it"
                    )
            self._check_group(group)
            self._check_params(group)

        add_checked_group(
            self.param_groups, param_group, type(self).__name__, super().add_param_group, check
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Take one optimization step; ``closure`` re-evaluates the loss (with gradients)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(sparse_error(type(self).__name__, p))
                if self._on_shards and is_sharded(p):
                    check_layout(p, f"{type(self).__name__}: a parameter")
                    self._update(group, p, local(p), local(p.grad))
                    continue
                with whole_parameter(p) as (w, g):
                    self._update(group, p, w, g)
        return loss
