"""``spectra compare``: validation curves of several run directories in one figure, with each
run's median step and optimizer-step time (and the ratio to the first run), and with
``--downstream`` their ``spectra eval`` scores side by side in a table."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from spectra_lab.errors import CLIError
from spectra_lab.files import atomic_write, save_figure, write_csv
from spectra_lab.runs.records import loss_scale, perplexity_text, read_jsonl
from spectra_lab.runs.scores import read_scores


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", help="run directories (each holds metrics.jsonl)")
    parser.add_argument("--out", help="PNG file of the validation curves to write")
    parser.add_argument("--labels", nargs="+", help="one label per run (default: the name)")
    parser.add_argument(
        "--downstream", action="store_true",
        help="print the runs' downstream scores (RUN/eval/scores.csv of `spectra eval`) as a table",
    )  # fmt: skip
    parser.add_argument(
        "--table", metavar="FILE", help="also write that table (.csv, otherwise Markdown)"
    )


def load_evals(run: Path) -> list[dict]:
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "eval"]
    if not evals:
        raise CLIError(f"{run}: no evaluation records in metrics.jsonl")
    return evals


def plot_comparison(runs: list[Path], labels: list[str], out: Path) -> list[tuple[str, float]]:
    """Plot validation loss against step for each run; return (label, final val loss).

    When the curves span more than ``records.LOG_SCALE_RATIO`` (a diverged run beside the
    others) the y axis is logarithmic, as in a run's ``loss.png``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_ylabel("validation loss (nats per token)")
    finals = []
    for run, label in zip(runs, labels, strict=True):
        evals = load_evals(run)
        losses = [float(r["val_loss"]) for r in evals]  # inf and nan are stored as strings
        final = losses[-1]
        finals.append((label, final))
        ppl = perplexity_text(final, 1)
        ax.plot([r["step"] for r in evals], losses, "o-", label=f"{label}: {final:.4f} (ppl {ppl})")
    loss_scale(ax, "validation loss")
    ax.set_title("validation loss of each run (legend: final loss and perplexity)")
    ax.set_xlabel("optimizer step")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
    return finals


def check_figure_out(path: Path) -> None:
    """A one-line ``CLIError`` unless ``--out`` can be a figure file: not a folder, and in a
    format matplotlib writes (from its suffix; PNG without one)."""
    if path.is_dir():
        raise CLIError(f"--out {path} is a folder; give the figure's file name (e.g. curves.png)")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = path.suffix.lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise CLIError(
            f"--out {path}: matplotlib writes no .{suffix} figure; use one of "
            f"{', '.join('.' + f for f in sorted(formats))}"
        )


def step_times(run: Path) -> tuple[float, float] | None:
    """Median ``t_step`` and ``t_optimizer`` (s) over the run's train records after the first."""
    records = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("kind") == "train"][1:]
    if not records:
        return None
    return (
        statistics.median(r["t_step"] for r in records),
        statistics.median(r["t_optimizer"] for r in records),
    )


def downstream_table(runs: list[Path], labels: list[str]) -> list[list[str]]:
    """Header and rows ``[task, metric, shots, score of each run]`` ("" where a run lacks it)."""
    scores: dict[tuple[str, str, str], dict[str, float]] = {}
    for run, label in zip(runs, labels, strict=True):
        for r in read_scores(run):
            key = (
                r["task"],
                r["metric"] if r["filter"] == "none" else f"{r['metric']} ({r['filter']})",
                r["n_shot"],
            )
            scores.setdefault(key, {})[label] = r["value"]
    rows = [["task", "metric", "shots", *labels]]
    for key in sorted(scores):
        rows.append(
            [*key, *(f"{scores[key][lb]:.4f}" if lb in scores[key] else "" for lb in labels)]
        )
    return rows


def markdown_text(rows: list[list[str]]) -> str:
    """``rows`` (the first the header) as a Markdown table: task, metric, shots, scores."""
    lines = ["| " + " | ".join(rows[0]) + " |", "|---|---|---:|" + "---:|" * (len(rows[0]) - 3)]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    runs = [Path(r) for r in args.runs]
    labels = args.labels or [r.name for r in runs]
    if len(labels) != len(runs):
        raise CLIError(f"--labels: got {len(labels)} labels for {len(runs)} runs")
    if args.out is None and not args.downstream:
        raise CLIError("nothing to do: give --out (validation curves) and/or --downstream")
    if args.table is not None and not args.downstream:
        raise CLIError("--table needs --downstream")
    if args.out is not None:
        check_figure_out(Path(args.out))
        for r in runs:
            if not (r / "metrics.jsonl").is_file():
                raise CLIError(f"{r}: not a run directory (no metrics.jsonl)")
        times = [step_times(r) for r in runs]
        finals = plot_comparison(runs, labels, Path(args.out))
        for (label, final), t in zip(finals, times, strict=True):
            line = (
                f"{label}: final validation loss {final:.4f} | perplexity {perplexity_text(final)}"
            )
            if t is not None and times[0] is not None:
                line += (
                    f" | median step {t[0]:.3f} s (x{t[0] / times[0][0]:.3f} of {labels[0]}),"
                    f" optimizer {t[1]:.3f} s"
                )
            print(line)
        print(f"wrote {args.out}")
    if args.downstream:
        rows = downstream_table(runs, labels)
        print(markdown_text(rows), end="")
        if args.table is not None:
            if args.table.endswith(".csv"):
                write_csv(args.table, rows[0], rows[1:])
            else:
                atomic_write(args.table, markdown_text(rows))
            print(f"wrote {args.table}")
    return 0
