"""The files of a run directory, and clearing them for a run that starts over."""

from __future__ import annotations

import shutil
from pathlib import Path

#: what a training run writes in its directory (``train/metrics.py``, ``train/loggers.py``),
#: and the folders of checkpoints, loggers and ``spectra eval``
RUN_FILES = (
    "summary.json",  # first: a run directory without it is not a finished run
    "config.yaml",
    "run.json",
    "metrics.jsonl",
    "train.csv",
    "eval.csv",
    "loss.png",
)
RUN_FOLDERS = ("ckpt", "tensorboard", "wandb", "eval")


def holds_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds any file or folder of a run."""
    run_dir = Path(run_dir)
    return any((run_dir / name).exists() for name in RUN_FILES + RUN_FOLDERS)


def clear_run(run_dir: str | Path) -> list[str]:
    """Delete every file and folder of a run in ``run_dir``, ``summary.json`` first (a
    deletion cut short never leaves a directory that looks finished); other files are left
    alone. Returns the names deleted."""
    run_dir = Path(run_dir)
    deleted = []
    for name in RUN_FILES + RUN_FOLDERS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        deleted.append(name)
    return deleted
