"""A capturable optimizer's step compiled whole, with the inductor settings this torch needs.

torch 2.11's inductor asserts that every node of a fused kernel is a plain scheduler node when
it reorders loops after fusion (``FusedSchedulerNode.reorder_loops_by_dep_pair``); a step's
``_foreach`` kernels fused with their neighbours are not, and code generation fails with
``InductorError: AssertionError``. torch 2.12 returns "no reordering" there instead
(pytorch/pytorch PR 176849). Before 2.12, :func:`compile_step` turns that pass off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.torch_version import TorchVersion

#: The first torch whose inductor skips loop reordering for fused nodes it cannot reorder.
LOOP_ORDERING_FIXED_IN = (2, 12)


def inductor_options(version: str | None = None) -> dict[str, Any]:
    """The inductor settings under which a step compiles on torch ``version`` (default: the
    running one): ``{"loop_ordering_after_fusion": False}`` before 2.12, none from then on."""
    if TorchVersion(version or torch.__version__) < LOOP_ORDERING_FIXED_IN:
        return {"loop_ordering_after_fusion": False}
    return {}


def compile_step(optimizer: torch.optim.Optimizer, **compile_kwargs: Any) -> Callable[[], Any]:
    """``optimizer.step`` compiled whole: ``torch.compile(..., fullgraph=True)`` with
    :func:`inductor_options` (``compile_kwargs`` go to ``torch.compile`` and override them).

    For a step that reads nothing on the host (``capturable=True``): it traces with no graph
    break, and a tensor ``lr`` keeps one graph for every lr. The class's ``step`` is compiled,
    bound to ``optimizer``, rather than the instance's: an ``LRScheduler`` wraps the instance's
    to note that it was called (in a module ``torch.compile`` skips); the returned function
    notes it in its place, so the scheduler does not warn that it stepped first.
    """
    kwargs: dict[str, Any] = {"fullgraph": True}
    options = inductor_options()
    if options and compile_kwargs.get("backend", "inductor") == "inductor":
        kwargs["options"] = options
    kwargs.update(compile_kwargs)
    step = torch.compile(type(optimizer).step.__get__(optimizer), **kwargs)

    def compiled() -> Any:
        optimizer._opt_called = True  # type: ignore[attr-defined]
        return step()

    return compiled
