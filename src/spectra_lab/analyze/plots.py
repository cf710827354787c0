"""Grid figures of ``spectra analyze`` in the layout of the paper's figures (matplotlib, Agg),
written atomically as PNG: one row per layer, one column per recorded step."""

from __future__ import annotations

import math
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

SIGNAL_COLOR, NOISE_COLOR = "tab:blue", "tab:red"
#: the height above the panels for a grid's title, and for its legend row
TITLE_INCHES, LEGEND_INCHES = 0.6, 0.3
#: the gid of a panel's statistics box
STATS = "stats"
#: singular values below this fraction of the largest are round-off zeros (not drawn, counted)
ZERO_RATIO = 1e-12


def _grid(
    layers: list[str], steps: list[int], xlabel: str, ylabel: str
) -> tuple[plt.Figure, np.ndarray]:
    """One panel per (layer, step): steps as column titles, the layer and ``ylabel`` on the
    left of each row, ``xlabel`` under the bottom row."""
    fig, axes = plt.subplots(
        len(layers),
        len(steps),
        figsize=(3.4 * len(steps), 2.3 * len(layers)),
        squeeze=False,
    )
    for j, step in enumerate(steps):
        axes[0, j].set_title(f"step {step}", fontsize=10, fontweight="bold")
    for i, name in enumerate(layers):
        axes[i, 0].set_ylabel(f"{short_name(name)}\n{ylabel}", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel(xlabel, fontsize=8)
    for ax in axes.flat:  # counts are whole numbers
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    return fig, axes


def _legend(fig: plt.Figure, ax: plt.Axes) -> None:
    """One legend for the whole grid (the series of ``ax``), in a row under the title."""
    handles, labels = ax.get_legend_handles_labels()
    top = 1 - TITLE_INCHES / fig.get_figheight()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, top), ncol=len(labels),
               fontsize=8, frameon=False)  # fmt: skip


def _stats_box(ax: plt.Axes, text: str) -> None:
    """``text`` in the panel's top-left corner on a white box; :func:`_finish` then raises the
    y-axis so that the box sits above every bar."""
    box = {"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1.5}
    ax.text(0.02, 0.96, text, va="top", fontsize=7, transform=ax.transAxes, bbox=box, gid=STATS)


def _finish(fig: plt.Figure) -> None:
    """Lay the panels out below the title (and the legend, if any), then give each panel with
    a statistics box the headroom that keeps the box above its tallest bar."""
    head = TITLE_INCHES + (LEGEND_INCHES if fig.legends else 0.0)
    fig.tight_layout(rect=(0, 0, 1, 1 - head / fig.get_figheight()))
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t for t in ax.texts if t.get_gid() == STATS]
        tallest = max((p.get_height() for p in ax.patches), default=0.0)
        if not boxes or tallest <= 0:
            continue
        panel = ax.get_window_extent(renderer)
        below = min(t.get_window_extent(renderer).y0 for t in boxes)
        free = (below - panel.y0) / panel.height  # the share of the panel under the text
        ax.set_ylim(0.0, tallest / max(0.2, free - 0.04))


def short_name(name: str) -> str:
    """``layers.0.attn.wq.weight`` → ``L0.attn.wq``."""
    return name.removesuffix(".weight").replace("layers.", "L")


def _nonzero(s: np.ndarray) -> np.ndarray:
    """The singular values above round-off: ``σ > ZERO_RATIO·σ_max``."""
    return s[s > ZERO_RATIO * s.max()] if s.size and s.max() > 0 else s[:0]


def _log_axis(ax: plt.Axes) -> None:
    ax.set_xscale("log")
    low, high = ax.get_xlim()
    if high >= 10 * low:  # a decade or more: label the decades only
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.tick_params(labelsize=7, which="both")


def _log_bins(values: list[np.ndarray], count: int = 30) -> np.ndarray:
    positive = np.concatenate([_nonzero(v) for v in values])
    if positive.size == 0:
        return np.logspace(-1, 1, count)
    low, high = positive.min(), positive.max()
    if high <= low:
        low, high = low / 2, high * 2
    return np.logspace(math.log10(low), math.log10(high), count)


def _fmt(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.3g}"


def spectra_figure(data: dict[str, Any], which: str) -> plt.Figure:
    """Histograms of the singular values of the gradient (``which="grad"``) or the update
    (``"update"``), log scale, with σ_max, σ_min and κ = σ_max/σ_min in each panel."""
    layers, steps = list(data["layers"]), data["steps"]
    fig, axes = _grid(layers, steps, "singular value σ (log scale)", "count")
    for i, name in enumerate(layers):
        by_step = {r["step"]: r for r in data["layers"][name]["records"]}
        for j, step in enumerate(steps):
            ax = axes[i, j]
            record = by_step.get(step)
            sigma = None if record is None else record[f"{which}_sigma"]
            if not sigma:
                ax.text(0.5, 0.5, "no update (lr = 0)", ha="center", transform=ax.transAxes)
                continue
            s = np.asarray(sigma)
            shown = _nonzero(s)
            ax.hist(shown, bins=_log_bins([s]), color=SIGNAL_COLOR, alpha=0.8)
            _log_axis(ax)
            c = record[which]
            text = f"σmax {_fmt(c['sigma_max'])}\nσmin {_fmt(c['sigma_min'])}\nκ {_fmt(c['cond'])}"
            text += f"\nσmax/median {_fmt(c['max_over_median'])}"
            if shown.size < s.size:
                text += f"\n{s.size - shown.size} ≈ 0"
            _stats_box(ax, text)
    label = (
        r"gradient $g_k$"
        if which == "grad"
        else r"update $U_k = -(X_{k+1} - (1-\eta\lambda)\,X_k)\,/\,\eta$"
    )
    fig.suptitle(f"{data['optimizer']}: singular values of the {label}", fontsize=11)
    _finish(fig)
    return fig


def noise_spectra_figure(data: dict[str, Any]) -> plt.Figure:
    """Per panel: the singular values of the signal G (blue), the top-r singular values of the
    noises N (red), and ‖G‖₂ (dashed)."""
    layers, steps = list(data["layers"]), data["steps"]
    fig, axes = _grid(layers, steps, "singular value σ (log scale)", "count")
    for i, name in enumerate(layers):
        by_step = {r["step"]: r for r in data["layers"][name]["records"]}
        for j, step in enumerate(steps):
            ax, r = axes[i, j], by_step[step]
            signal = np.asarray(r["signal_sigma"])
            noise = np.asarray(r["noise_sigma"]).ravel()
            bins = _log_bins([signal, noise])
            shown = _nonzero(signal)
            ax.hist(shown, bins=bins, color=SIGNAL_COLOR, alpha=0.6, label="σ(G)")
            ax.hist(_nonzero(noise), bins=bins, color=NOISE_COLOR, alpha=0.6, label="top-r σ(N)")
            ax.axvline(r["signal_norm"], color="k", ls="--", lw=0.8, label="‖G‖₂")
            _log_axis(ax)
            share = r["summary"]["fraction_noise_top_above_signal"]
            _stats_box(ax, f"σ₁(N) > ‖G‖₂: {share:.0%}")
    _legend(fig, axes[0, 0])
    fig.suptitle(
        f"{data['optimizer']}: singular values of the large-batch gradient G "
        f"({data['signal_batch']} sequences, blue)\nand top-{data['rank']} of the "
        f"single-sequence noises N = g − G ({data['samples']} samples, red)",
        fontsize=10,
    )
    _finish(fig)
    return fig


def noise_distance_figure(data: dict[str, Any]) -> plt.Figure:
    """Per panel: histograms of the spectral and chordal distances d_r(N, G) over the samples."""
    layers, steps = list(data["layers"]), data["steps"]
    fig, axes = _grid(layers, steps, "distance d_r(N, G)", "samples")
    bins = np.linspace(0.0, 1.0, 41)
    for i, name in enumerate(layers):
        by_step = {r["step"]: r for r in data["layers"][name]["records"]}
        for j, step in enumerate(steps):
            ax, r = axes[i, j], by_step[step]
            ax.hist(r["spectral"], bins=bins, color="tab:purple", alpha=0.6, label="spectral")
            ax.hist(r["chordal"], bins=bins, color="tab:orange", alpha=0.6, label="chordal")
            chance = data["layers"][name]["chordal_chance"]
            ax.axvline(chance, color="k", ls=":", lw=0.8, label="chordal, random subspaces")
            ax.set_xlim(0, 1.02)
            ax.tick_params(labelsize=7)
    _legend(fig, axes[0, 0])
    fig.suptitle(
        f"{data['optimizer']}: distances d_r between the top-{data['rank']} singular "
        "subspaces\nof the noise N and of the signal G (0: the same, 1: orthogonal)",
        fontsize=10,
    )
    _finish(fig)
    return fig


def norms_figure(runs: list[dict[str, Any]]) -> plt.Figure:
    """Σ‖X‖_∞ and Σ‖X‖_F over the weight matrices against step, one curve per run, a point
    per monitored step (whole steps on the x axis)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        axes[0].plot(run["steps"], run["sum_weight_linf"], "o-", ms=3, label=run["label"])
        axes[1].plot(run["steps"], run["sum_weight_fro"], "o-", ms=3, label=run["label"])
    panels = (
        (r"$\Sigma_X\, \|X\|_\infty$", "max |entry| of each weight matrix X, summed"),
        (r"$\Sigma_X\, \|X\|_F$", "Frobenius norm of each weight matrix X, summed"),
    )
    for ax, (ylabel, title) in zip(axes, panels, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_xlabel("step (the monitored ones: 1, N + 1, 2N + 1, … for --monitor-every N)")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig
