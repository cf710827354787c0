"""The coordinate check of μP: activation size per layer against width, after a few steps.

μP ("Tensor Programs V", Yang et al., 2022) promises that every layer's activations keep
their coordinate size as the width grows, at initialisation and after training steps with
the same learning rate. The check trains the same small model at several widths for a few
steps and records the RMS of each layer's output at every step: the input of the first
block (the scaled embedding), the output of every block, and the logits. Under μP each
curve is flat in the width; under the standard parametrization the later steps' curves grow
with it (the updates' effect on the activations grows with the width at a fixed lr).

The runs go through the trainer (:func:`spectra_lab.train.trainer.train`), so the model, the
per-layer learning rates and the optimizer are exactly the ones ``spectra train`` builds.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from spectra_lab.train.config import TrainConfig

PARAMETRIZATIONS = ("standard", "mup")


class ActivationRecorder:
    """Forward hooks that keep the RMS of each layer's output in the first forward of a step.

    An observer for :func:`~spectra_lab.train.trainer.train`'s ``watch``: ``after_step``
    closes the step's record. ``records[layer]`` lists one RMS per step.
    """

    def __init__(self, model: nn.Module) -> None:
        self.records: dict[str, list[float]] = {}
        self._seen: set[str] = set()
        self._handles = []
        layers = model.layers
        self._hook(layers[0], "embedding", pre=True)
        for i, block in enumerate(layers):
            self._hook(block, f"block {i + 1}")
        self._hook(model, "logits")

    def _hook(self, module: nn.Module, name: str, pre: bool = False) -> None:
        self.records[name] = []

        def keep(x: Tensor) -> None:
            if module.training and name not in self._seen:  # the step's first micro-batch
                self._seen.add(name)
                self.records[name].append(float(x.detach().float().pow(2).mean().sqrt()))

        if pre:
            handle = module.register_forward_pre_hook(lambda m, args: keep(args[0]))
        else:
            handle = module.register_forward_hook(
                lambda m, args, out: keep(out[0] if isinstance(out, tuple) else out)
            )
        self._handles.append(handle)

    def before_step(self) -> None:
        """Nothing to do before the step: the hooks record during the forward pass."""

    def after_step(self) -> dict[str, float]:
        self._seen.clear()
        return {}

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _attach(into: list[ActivationRecorder], ctx: Any) -> ActivationRecorder:
    """``watch`` for the trainer: a recorder on the run's model, kept in ``into``."""
    into.append(ActivationRecorder(ctx.model))
    return into[-1]


def coord_check(
    base: TrainConfig, widths: list[int], out: Path, progress: bool = True
) -> dict[str, Any]:
    """Train ``base`` at every width in both parametrizations; the RMS records per run.

    Each run trains ``base.steps`` steps into ``out/runs/<parametrization>-d<width>``, without
    a progress bar of its own; ``progress``: one bar over the runs.
    """
    from tqdm import tqdm

    from spectra_lab.train.trainer import train

    results: dict[str, Any] = {
        "optimizer": base.optimizer,
        "lr": base.lr,
        "steps": base.steps,
        "widths": widths,
        "mup_base_width": base.mup_base_width,
        "runs": {p: {} for p in PARAMETRIZATIONS},
    }
    todo = [(p, w) for p in PARAMETRIZATIONS for w in widths]
    for param, width in tqdm(todo, desc="coord-check", disable=not progress):
        cfg = dataclasses.replace(
            base,
            parametrization=param,
            d_model=width,
            out_dir=str(out / "runs" / f"{param}-d{width}"),
            overwrite=True,
            resume=False,
            progress=False,
        )
        recorders: list[ActivationRecorder] = []
        torch.manual_seed(cfg.seed)
        train(cfg, watch=partial(_attach, recorders))
        recorders[0].remove()
        results["runs"][param][str(width)] = recorders[0].records
    return results


def coord_figure(results: dict[str, Any], steps: list[int] | None = None):
    """Rows: the two parametrizations; columns: steps; RMS against width, a line per layer.

    Every panel shares one log y-scale (a flat line is the same slope everywhere) and the
    layers' legend is one, under the panels.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = results["widths"]
    first = results["runs"]["standard"][str(widths[0])]
    layers = list(first)
    n_steps = len(first[layers[0]])
    steps = steps or sorted({0, min(1, n_steps - 1), n_steps // 2, n_steps - 1})
    fig, axes = plt.subplots(2, len(steps), figsize=(3.2 * len(steps), 6.4), sharex=True,
                             sharey=True, squeeze=False)  # fmt: skip
    cmap = plt.get_cmap("viridis")
    for row, param in enumerate(PARAMETRIZATIONS):
        runs = results["runs"][param]
        for col, t in enumerate(steps):
            ax = axes[row, col]
            for k, layer in enumerate(layers):
                ys = [runs[str(w)][layer][t] for w in widths]
                ax.plot(widths, ys, marker="o", ms=3, color=cmap(k / max(1, len(layers) - 1)),
                        label=layer)  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(widths, [str(w) for w in widths], fontsize=7)
            ax.minorticks_off()
            ax.grid(alpha=0.3, which="major")
            ax.set_title(f"{'μP' if param == 'mup' else 'standard'}, step {t}", fontsize=9)
            ax.tick_params(labelsize=7)
            if col == 0:
                ax.set_ylabel("activation RMS (log scale)", fontsize=8)
            if row == 1:
                ax.set_xlabel("width d_model", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(layers), 6), fontsize=7,
               frameon=False)  # fmt: skip
    fig.suptitle(
        f"Coordinate check: {results['optimizer']}, lr {results['lr']:g}, "
        f"μP base width {results['mup_base_width']} (flat lines: RMS independent of width)",
        fontsize=10,
    )
    rows_of_legend = -(-len(layers) // 6)
    fig.tight_layout(rect=(0, (0.25 + 0.18 * rows_of_legend) / fig.get_figheight(), 1, 1))
    return fig


def growth(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per parametrization and layer: RMS at the widest over RMS at the narrowest width, at
    the last step (1 is flat)."""
    widths = results["widths"]
    out: dict[str, dict[str, float]] = {}
    for param in PARAMETRIZATIONS:
        runs = results["runs"][param]
        lo, hi = runs[str(widths[0])], runs[str(widths[-1])]
        out[param] = {layer: hi[layer][-1] / lo[layer][-1] for layer in lo}
    return out
