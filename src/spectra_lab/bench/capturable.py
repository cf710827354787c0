"""The capturable step of ``spectra.AdamW`` (it reads nothing back to the host) compiled whole
and captured in a CUDA graph, as rows of ``spectra bench optim``.

* ``spectra-adamw-capturable``: ``spectra.AdamW(capturable=True)``, eager, its lr a tensor on
  the parameters' device;
* ``spectra-adamw-compiled``: that step under ``torch.compile(fullgraph=True)``;
* ``spectra-adamw-graph``: that step captured once in a ``torch.cuda.CUDAGraph`` (after a
  warm-up step on a side stream, which creates the state) and replayed: CUDA only;
* ``spectra-adamw-capturable-bf16``, ``spectra-adamw-graph-bf16``: the first and the third
  with ``clip_method="mixed"`` (the CUDA default) and ``clip_ns_dtype=torch.bfloat16``: every
  product of the clip on bf16 units, the float32 ones as split products of three parts
  (``spectra.ops.polar.CAPTURABLE_SPLIT_PARTS``: six bf16 products each, float32's accuracy,
  whatever α);
* ``spectra-adamw-capturable-bf16-r100``, ``spectra-adamw-graph-bf16-r100``: those two with
  ``clip_ratio_bound=100`` too (σ_max/c ≤ 100 vouched for: five steps where seven cover every
  α float32 resolves, and split products of two parts).

Each row's object has a ``step()`` and, for the memory accounting, its optimizer as ``base``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import spectra.optim as so

CAPTURABLE_METHODS = (
    "spectra-adamw-capturable",
    "spectra-adamw-compiled",
    "spectra-adamw-graph",
    "spectra-adamw-capturable-bf16",
    "spectra-adamw-graph-bf16",
    "spectra-adamw-capturable-bf16-r100",
    "spectra-adamw-graph-bf16-r100",
)
#: The ``clip_ratio_bound`` of the ``-r100`` rows
RATIO_BOUND = 100.0


def capturable_adamw(params: list[Tensor], lr: float, clip_c: float, **kw: Any) -> so.AdamW:
    """``spectra.AdamW(capturable=True)`` with its lr a 0-d tensor on the parameters' device."""
    lr_tensor = torch.tensor(lr, dtype=torch.float32, device=params[0].device)
    return so.AdamW(params, lr=lr_tensor, clip_c=clip_c, capturable=True, **kw)


class CompiledStep:
    """A capturable optimizer's step compiled whole (:func:`spectra.optim.compile_step`). The
    first ``step()`` runs an eager step (which creates the state) and then the compiled one
    (which traces and compiles it), so that a benchmark's warm-up holds the compilation."""

    def __init__(self, base: torch.optim.Optimizer) -> None:
        self.base = base
        self._step = so.compile_step(base)
        self._warm = False

    def step(self) -> None:
        if not self._warm:
            self.base.step()
            self._warm = True
        self._step()


class GraphStep:
    """A capturable optimizer's step captured in a CUDA graph at the first ``step()`` (after
    one eager warm-up step on a side stream) and replayed at every call. The gradients must
    stay in the same tensors (``p.grad.copy_``), as in torch's own recipe."""

    def __init__(self, base: torch.optim.Optimizer) -> None:
        self.base = base
        self.graph: torch.cuda.CUDAGraph | None = None

    def step(self) -> None:
        if self.graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.base.step()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.base.step()
        self.graph.replay()


def make_capturable(method: str, params: list[Tensor], lr: float, clip_c: float, **kw: Any):
    """The optimizer (or step wrapper) of one of :data:`CAPTURABLE_METHODS`."""
    if method not in CAPTURABLE_METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {CAPTURABLE_METHODS}")
    base = method.removesuffix("-r100")
    if base != method:
        kw = {**kw, "clip_ratio_bound": RATIO_BOUND}
    split = base.removesuffix("-bf16")
    if split != base:
        kw = {**kw, "clip_method": "mixed", "clip_ns_dtype": torch.bfloat16}
    base = split
    opt = capturable_adamw(params, lr, clip_c, **kw)
    if base == "spectra-adamw-compiled":
        return CompiledStep(opt)
    if base == "spectra-adamw-graph":
        return GraphStep(opt)
    return opt


#: The rows captured in a CUDA graph
GRAPH_METHODS = ("spectra-adamw-graph", "spectra-adamw-graph-bf16", "spectra-adamw-graph-bf16-r100")


def graph_note(device: torch.device, method: str = "spectra-adamw-graph") -> str | None:
    """Why ``method`` (one of :data:`GRAPH_METHODS`) cannot run on ``device`` (``None`` where
    it can)."""
    if device.type != "cuda":
        return f"{method} skipped: CUDA graphs need a CUDA device, not {device.type}"
    return None
