"""Figures of the synthetic experiments (matplotlib, Agg backend); the CLI saves them
with ``spectra_lab.files.save_figure``."""

from __future__ import annotations

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from spectra_lab.synth.experiments import FWResults, SpikeResults

METHOD_LABELS = {
    "sgd": "SGD",
    "sgd_global_clip": "SGD + global clip",
    "sgd_spectral_clip": "SGD + spectral clip",
    "sgdm": "SGD-M",
    "sgdm_pre_clip": "SGD-M + spectral pre-clip",
}
#: line widths of the methods in order, widest first, so that coinciding curves stay visible
WIDTHS = (3.0, 1.8, 0.9)
#: markers of the methods in order (open, so that coinciding points stay visible)
MARKERS = ("o", "s", "^", "v", "D")
RESIDUAL_FLOOR = 1e-16  # residuals at or below float64 round-off are drawn here


def fw_figure(res: FWResults, mode: str, radius: float) -> plt.Figure:
    """Four panels (residual, test loss, ‖X_k‖₂, ‖X_k‖_F) vs k, one curve per b."""
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for b in res.config.regs:
        if (mode, radius, b) not in res.histories:
            continue
        hist = res.histories[mode, radius, b]
        k = range(hist.objective.shape[1])
        resid = res.residual(mode, radius, b).mean(0).clamp_min(RESIDUAL_FLOOR)
        label = f"b = {b:g}"
        axes[0].plot(k, resid, label=label)
        axes[1].plot(k, hist.test_loss.mean(0), label=label)
        axes[2].plot(k, hist.spectral_norm.mean(0), label=label)
        axes[3].plot(k, hist.frobenius_norm.mean(0), label=label)
    axes[0].set_yscale("log")
    axes[0].set_xscale("log")
    axes[2].axhline(radius, color="k", ls="--", lw=0.8, label=f"D₂ = {radius:g}")
    titles = ["F(X_k) − F*", "test loss", "‖X_k‖₂", "‖X_k‖_F"]
    for ax, title in zip(axes, titles, strict=True):
        _label(ax, title, "iteration k")
    axes[2].legend(fontsize=8)
    axes[0].legend(fontsize=8)
    if mode == "full":
        how = "full batch"
    else:
        runs = max(h.objective.shape[0] for (m, _, _), h in res.histories.items() if m == mode)
        how = f"batch {res.config.batch_size}, β_k = (k+1)^(-2/3), mean of {runs} runs"
    fig.suptitle(
        f"Post-spectral clipping with the Theorem's parameters on F(X) = f(X) + (b/2)‖X‖_F², "
        f"‖X‖₂ ≤ D₂ = {radius:g} ({how})"
    )
    fig.tight_layout()
    return fig


def spike_figure(res: SpikeResults, methods: tuple[str, ...]) -> plt.Figure:
    """One panel per ℓ: training loss vs k for each method at its best η₀."""
    scales = res.config.scales
    fig, axes = plt.subplots(1, len(scales), figsize=(5 * len(scales), 3.8), squeeze=False)
    for ax, scale in zip(axes[0], scales, strict=True):
        for i, method in enumerate(methods):
            runs = res.runs.get((scale, method))
            if runs is None:
                continue
            best = runs.best()
            if best is None:
                ax.plot([], [], label=f"{METHOD_LABELS[method]} (all η₀ diverged)")
                continue
            ax.plot(
                runs.losses[best],
                lw=WIDTHS[i % len(WIDTHS)],
                label=f"{METHOD_LABELS[method]}, η₀ = {float(runs.eta0[best]):.3g}",
            )
        ax.set_yscale("log")
        _label(ax, f"ℓ = {scale:g}", "iteration k", "training loss f(X_k)")
        ax.legend(fontsize=8)
    cfg = res.config
    fig.suptitle(
        f"Rank-{cfg.rank} spikes N = ℓUVᵀ, d = {cfg.d}, n = {cfg.n}, c = {cfg.clip_c:g}, "
        f"η_k = η₀/√(k+1), η₀ tuned per method"
    )
    fig.tight_layout()
    return fig


def tuning_figure(res: SpikeResults) -> plt.Figure:
    """One panel per ℓ: final training loss vs η₀ for every method (diverged runs omitted).

    Each method keeps its colour and marker in every panel, and one legend serves them all.
    """
    scales, methods = res.config.scales, res.config.methods
    fig, axes = plt.subplots(1, len(scales), figsize=(5 * len(scales), 4.2), squeeze=False)
    for ax, scale in zip(axes[0], scales, strict=True):
        for i, method in enumerate(methods):
            runs = res.runs.get((scale, method))
            if runs is None:
                continue
            final = runs.final_losses()
            ok = torch.isfinite(final)
            ax.plot(runs.eta0[ok], final[ok], marker=MARKERS[i % len(MARKERS)], ms=5,
                    color=f"C{i}", mfc="none", label=METHOD_LABELS[method])  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        _label(ax, f"ℓ = {scale:g}", "η₀", "final training loss")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle("Step-size sensitivity (missing points: diverged, i.e. final loss > f(X₀))")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def _label(ax: plt.Axes, title: str, xlabel: str, ylabel: str | None = None) -> None:
    """A panel's title, axis labels and light grid."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
