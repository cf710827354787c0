"""``spectra compare``: validation curves of several run directories in one figure."""

from __future__ import annotations

import argparse
import io
import math
from pathlib import Path

from spectra_lab.cli import CLIError
from spectra_lab.files import atomic_write
from spectra_lab.train.metrics import read_jsonl


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories (each holds metrics.jsonl)")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--labels", nargs="+", help="one label per run (default: the name)")


def load_evals(run: Path) -> list[dict]:
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "eval"]
    if not evals:
        raise CLIError(f"{run}: no evaluation records in metrics.jsonl")
    return evals


def plot_comparison(runs: list[Path], labels: list[str], out: Path) -> list[tuple[str, float]]:
    """Plot validation loss against step for each run; return (label, final val loss)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    finals = []
    for run, label in zip(runs, labels, strict=True):
        evals = load_evals(run)
        final = evals[-1]["val_loss"]
        finals.append((label, final))
        ax.plot(
            [r["step"] for r in evals],
            [r["val_loss"] for r in evals],
            "o-",
            label=f"{label}: {final:.4f} (ppl {math.exp(final):.1f})",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(out, buf.getvalue())
    return finals


def run(args: argparse.Namespace) -> int:
    runs = [Path(r) for r in args.runs]
    for r in runs:
        if not (r / "metrics.jsonl").is_file():
            raise CLIError(f"{r}: not a run directory (no metrics.jsonl)")
    labels = args.labels or [r.name for r in runs]
    if len(labels) != len(runs):
        raise CLIError(f"--labels: got {len(labels)} labels for {len(runs)} runs")
    for label, final in plot_comparison(runs, labels, Path(args.out)):
        print(f"{label}: final validation loss {final:.4f} | perplexity {math.exp(final):.2f}")
    print(f"wrote {args.out}")
    return 0
