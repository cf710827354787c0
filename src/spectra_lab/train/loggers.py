"""TensorBoard and Weights & Biases: the run's scalars, besides its own metrics files.

``TrainConfig.loggers`` names them (``--log tensorboard,wandb``); both come with the ``log``
extra (``pip install -e ".[log]"``), and :func:`check_loggers` reports a missing package in one
line before anything runs. Only rank 0 opens them (``metrics.RunLog`` does). Every record the
run directory gets, its loggers get too, as scalars at the record's step:

* ``train/<key>`` for the train records (``train/loss``, ``train/lr``, ``train/grad_norm``, the
  timings ``train/t_*``, ``train/tokens_per_s``, ...), ``eval/<key>`` for the evaluations;
* the spectral monitor's keys as they are (``spectral/<name>/grad_sigma_max``, ...).

TensorBoard writes its event files to ``<run dir>/tensorboard/``; a resumed run opens its
writer with ``purge_step`` = the checkpoint's step + 1, so that TensorBoard hides the events the
interrupted run logged after its checkpoint, as the metrics files are cut back.

W&B: ``wandb.init(dir=<run dir>, ...)`` (files under ``<run dir>/wandb/``), project
``$WANDB_PROJECT`` or ``spectra``, the run directory's name as the run's name and the resolved
config as its config. The mode is W&B's own when ``WANDB_MODE`` or ``WANDB_API_KEY`` is set,
and ``offline`` otherwise (a run never reaches for the network unless told to; upload later with
``wandb sync <run dir>/wandb/offline-run-*``). The run's id is kept in ``run.json``: a resumed
run logs to the same W&B run (``resume="allow"``). Console capture is off (the trainer's log
lines stay the terminal's).
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any

from spectra_lab.train.config import ConfigError, TrainConfig

#: logger -> the package it needs (all of them in the ``log`` extra)
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
EXTRA = "log"
TENSORBOARD_DIR = "tensorboard"
DEFAULT_PROJECT = "spectra"


def check_loggers(cfg: TrainConfig) -> None:
    """A one-line ``ConfigError`` when a package a logger of ``cfg.loggers`` needs is missing."""
    for name in cfg.loggers:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise ConfigError(
                f"config field 'loggers' = {cfg.loggers!r}: {name} needs the package "
                f"'{PACKAGES[name]}', from the '{EXTRA}' extra: pip install -e \".[{EXTRA}]\""
            )


def scalars(kind: str, record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers as ``{tag: value}``: ``kind/key``, monitor keys as they are."""
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # the step is the x axis; None (no clip_c) is not a number
        if not math.isfinite(value) or key.endswith("/step"):
            continue
        out[key if kind == "monitor" else f"{kind}/{key}"] = float(value)
    return out


class TensorBoardLogger:
    """``torch.utils.tensorboard.SummaryWriter`` on ``<run dir>/tensorboard``."""

    def __init__(self, run_dir: Path, start: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        purge = start + 1 if start else None  # hide what was logged after the checkpoint
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=purge)

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()


class WandbLogger:
    """One W&B run per run directory (offline unless ``WANDB_MODE``/``WANDB_API_KEY`` say)."""

    def __init__(self, run_dir: Path, cfg: TrainConfig, run_id: str) -> None:
        import wandb

        configured = "WANDB_MODE" in os.environ or "WANDB_API_KEY" in os.environ
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", DEFAULT_PROJECT),
            name=Path(run_dir).resolve().name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=cfg.to_dict(),
            mode=None if configured else "offline",
            settings=wandb.Settings(console="off"),
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def open_loggers(
    cfg: TrainConfig, run_dir: Path, start: int, wandb_id: str | None
) -> list[TensorBoardLogger | WandbLogger]:
    """The loggers of ``cfg.loggers``, in that order (rank 0 only)."""
    out: list[TensorBoardLogger | WandbLogger] = []
    for name in cfg.loggers:
        if name == "tensorboard":
            out.append(TensorBoardLogger(run_dir, start))
        else:
            assert wandb_id is not None
            out.append(WandbLogger(run_dir, cfg, wandb_id))
    return out
