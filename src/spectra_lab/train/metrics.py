"""What a run reports: its directory's files, the progress bar and the log lines.

:class:`RunLog` is the one writer of the run directory (besides the checkpoints): rank 0
writes ``config.yaml`` and ``run.json`` when the run starts, the metrics files as it goes,
``loss.png`` and ``summary.json`` when it ends.

The metrics files are ``metrics.jsonl``, ``train.csv`` and ``eval.csv``. Every record is
one JSON line with ``kind`` ("train", "eval" or "monitor") and ``step``; the CSV files hold
the train and eval numbers with fixed columns, for spreadsheets and pandas (the spectral
monitor's records, whose keys depend on the model, are in ``metrics.jsonl`` only). Lines are
appended as training goes; on resume the files are cut back to the checkpoint's step so that
a resumed run's files read exactly like an uninterrupted run's. The same records go to the
loggers of ``cfg.loggers`` (TensorBoard, W&B; see ``loggers.py``).
"""

from __future__ import annotations

import json
import math
import secrets
import sys
from pathlib import Path
from typing import Any

import yaml

from spectra_lab.files import (
    append_csv_row,
    atomic_write,
    save_figure,
    write_csv,
    write_json_atomic,
)
from spectra_lab.runs.records import loss_scale, perplexity, read_jsonl
from spectra_lab.train.config import TrainConfig
from spectra_lab.train.loggers import open_loggers, scalars
from spectra_lab.train.runtime import Runtime

TRAIN_COLUMNS = (
    "step",
    "tokens",
    "loss",
    "lr",
    "clip_c",
    "grad_norm",
    "t_data",
    "t_forward",
    "t_backward",
    "t_grad_clip",
    "t_optimizer",
    "t_monitor",
    "t_step",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "mfu",
    "peak_mem_gb",
)
EVAL_COLUMNS = ("step", "tokens", "val_loss", "val_ppl", "t_eval")


class MetricsWriter:
    """Appends records to the run directory's metrics files (rank 0 only)."""

    def __init__(self, run_dir: str | Path, resume_step: int | None = None) -> None:
        self.dir = Path(run_dir)
        self.jsonl = self.dir / "metrics.jsonl"
        self.train_csv = self.dir / "train.csv"
        self.eval_csv = self.dir / "eval.csv"
        kept = []
        if resume_step is not None:
            kept = [r for r in read_jsonl(self.jsonl) if r["step"] <= resume_step]
        self.train_records = [r for r in kept if r["kind"] == "train"]
        self.eval_records = [r for r in kept if r["kind"] == "eval"]
        # Start from a consistent state: rewrite (atomically) whatever is kept.
        atomic_write(self.jsonl, "".join(json.dumps(r) + "\n" for r in kept))
        write_csv(self.train_csv, TRAIN_COLUMNS, self.train_records)
        write_csv(self.eval_csv, EVAL_COLUMNS, self.eval_records)

    def log(self, kind: str, record: dict[str, Any]) -> None:
        record = {"kind": kind, **record}
        with self.jsonl.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if kind not in ("train", "eval"):
            return
        columns, path = (
            (TRAIN_COLUMNS, self.train_csv) if kind == "train" else (EVAL_COLUMNS, self.eval_csv)
        )
        (self.train_records if kind == "train" else self.eval_records).append(record)
        append_csv_row(path, columns, record)

    def plot(self) -> None:
        plot_curves(self.dir / "loss.png", self.train_records, self.eval_records)


def _smoothed(values: list[float], window: int) -> list[float]:
    """The trailing moving average of ``values`` over ``window`` points."""
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
        for i in range(len(values))
    ]


def _draw_validation(ax: Any, evals: list[dict[str, Any]]) -> None:
    """The validation losses as points; those that are not finite as crosses on the top edge."""
    steps = [r["step"] for r in evals]
    losses = [float(r["val_loss"]) for r in evals]
    ax.plot(steps, losses, "o-", color="tab:red", label="validation")
    bad = [s for s, v in zip(steps, losses, strict=True) if not math.isfinite(v)]
    if bad:
        top = ax.get_xaxis_transform()  # x in data, y in axes fraction
        ax.plot(bad, [0.97] * len(bad), "x", ms=9, mew=2, color="tab:red", transform=top,
                clip_on=False, gid="not finite", label="validation: inf or nan")  # fmt: skip
    last = losses[-1]
    ppl = perplexity(last) if not math.isnan(last) else math.nan
    ax.set_title(f"final validation loss {last:.4g}, perplexity {ppl:.4g}", fontsize=10)


def plot_curves(path: str | Path, train: list[dict[str, Any]], evals: list[dict[str, Any]]) -> None:
    """Training/validation loss and learning rate against step, written atomically.

    Losses of any size are drawn: a curve spanning more than ``records.LOG_SCALE_RATIO`` goes on
    a log scale, an inf or nan validation loss is a cross on the top edge, and the title's
    perplexity is ``inf`` past a float's range.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_lr) = plt.subplots(
        2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    ax_loss.set_ylabel("loss (nats per token)")
    if train:
        steps = [r["step"] for r in train]
        losses = [float(r["loss"]) for r in train]
        ax_loss.plot(steps, losses, lw=0.8, alpha=0.5, label="train (per step)")
        window = max(1, len(losses) // 50)
        if window > 1:
            smooth = _smoothed(losses, window)
            ax_loss.plot(steps, smooth, lw=1.5, label=f"train (mean of last {window})")
        ax_lr.plot(steps, [r["lr"] for r in train], lw=1.2, color="tab:green")
    if evals:
        _draw_validation(ax_loss, evals)
    loss_scale(ax_loss, skip={"not finite"})
    if ax_loss.lines:
        ax_loss.legend(loc="best", fontsize=8)
    ax_loss.grid(alpha=0.3)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


class RunLog:
    """Everything rank 0 reports; on the other ranks every method does nothing.

    It writes ``config.yaml`` and ``run.json`` when it opens, keeps the metrics files
    (``metrics.jsonl``, ``train.csv``, ``eval.csv``) and the loggers, shows the progress bar
    or the log lines, and writes ``loss.png`` (once) and ``summary.json`` when the run
    finishes. Used as a context manager, it closes the bar and the loggers on the way out.
    """

    def __init__(
        self, run_dir: Path, cfg: TrainConfig, rt: Runtime, start: int, about: dict[str, Any]
    ) -> None:
        self.run_dir, self.cfg, self.active = run_dir, cfg, rt.is_main
        self.bar = None
        self.loggers: list[Any] = []
        if not self.active:
            return
        if "wandb" in cfg.loggers:  # a resumed run logs to the same W&B run
            previous = run_dir / "run.json"
            old = json.loads(previous.read_text()) if start and previous.is_file() else {}
            about = {**about, "wandb_id": old.get("wandb_id") or secrets.token_hex(4)}
        atomic_write(run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        atomic_write(run_dir / "run.json", json.dumps(about, indent=2))
        self.metrics = MetricsWriter(run_dir, resume_step=start or None)
        self.loggers = open_loggers(cfg, run_dir, start, about.get("wandb_id"))
        if cfg.progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=cfg.steps, initial=start, desc="train", dynamic_ncols=True, file=sys.stderr
            )
        self.line(
            f"{cfg.optimizer} | preset {cfg.preset} | {about['parameters'] / 1e6:.2f}M params | "
            f"{about['tokens_per_step']} tokens/step | {rt.device} x{rt.world_size}"
            f"{'' if cfg.parallel == 'ddp' else ' ' + cfg.parallel} | "
            f"steps {start}->{cfg.steps}"
        )

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
        for logger in self.loggers:
            logger.close(failed=exc_type is not None)

    def _record(self, kind: str, record: dict[str, Any]) -> None:
        self.metrics.log(kind, record)
        if self.loggers:
            values = scalars(kind, record)
            for logger in self.loggers:
                logger.log(record["step"], values)

    def line(self, text: str) -> None:
        if not self.active:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def train(self, r: dict[str, Any]) -> None:
        if not self.active:
            return
        self._record("train", r)
        mfu = {} if r.get("mfu") is None else {"mfu": f"{100 * r['mfu']:.1f}%"}
        if self.bar is not None:
            self.bar.set_postfix(
                loss=f"{r['loss']:.4f}",
                lr=f"{r['lr']:.2e}",
                tok_s=f"{r['tokens_per_s']:.0f}",
                **mfu,
            )
        elif r["step"] % self.cfg.log_interval == 0:
            extra = "".join(f" | mfu {v}" for v in mfu.values())
            if r.get("peak_mem_gb") is not None:
                extra += f" | mem {r['peak_mem_gb']:.2f} GB"
            self.line(
                f"step {r['step']:>6} | loss {r['loss']:.4f} | lr {r['lr']:.2e} | "
                f"{r['tokens_per_s']:.0f} tok/s{extra}"
            )

    def advance(self, steps: int) -> None:
        """Move the progress bar by the ``steps`` just reported, in one update: its rate (and
        so its time left) is then that of whole reports, not of the last record alone."""
        if self.bar is not None and steps:
            self.bar.update(steps)

    def eval(self, step: int, tokens: int, val_loss: float, seconds: float) -> None:
        if not self.active:
            return
        ppl = perplexity(val_loss)
        record = {"step": step, "tokens": tokens, "val_loss": val_loss, "val_ppl": ppl}
        self._record("eval", {**record, "t_eval": seconds})
        self.line(f"step {step:>6} | val loss {val_loss:.4f} | val ppl {ppl:.2f}")

    def monitor(self, step: int, values: dict[str, float]) -> None:
        """The spectral monitor's scalars of step ``step`` (a record of kind "monitor")."""
        if self.active and values:
            self._record("monitor", {"step": step, **values})

    def finish(self, tokens: int, val_loss: float | None, parameters: int) -> None:
        """Draw ``loss.png`` (the one time it is drawn) and write ``summary.json``."""
        if not self.active:
            return
        if self.cfg.plot:
            self.metrics.plot()
        summary = {
            "step": self.cfg.steps,
            "tokens": tokens,
            "val_loss": val_loss,
            "val_ppl": perplexity(val_loss) if val_loss is not None else None,
            "optimizer": self.cfg.optimizer,
            "preset": self.cfg.preset,
            "parameters": parameters,
        }
        write_json_atomic(self.run_dir / "summary.json", summary)  # an inf ppl as "inf"
