"""The files of a run directory, and clearing them for a run that starts over."""

from __future__ import annotations

import os
import shutil
import tempfile
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


def holds_started_run(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a run that got going: its ``run.json`` or its ``ckpt/``."""
    run_dir = Path(run_dir)
    return (run_dir / "run.json").is_file() or (run_dir / "ckpt").is_dir()


def foreign_run_names(run_dir: str | Path) -> list[str]:
    """The names of a run's files and folders that ``run_dir`` holds without holding a run
    (:func:`holds_started_run`): what a new run there would delete or overwrite although no
    run wrote them (an ``eval/`` package, a ``train.csv`` of one's own). ``config.yaml`` is
    left out: a run replaces one given beside it with its resolved config."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or holds_started_run(run_dir):
        return []
    names = [n for n in RUN_FILES if n != "config.yaml" and (run_dir / n).exists()]
    return names + [f"{n}/" for n in RUN_FOLDERS if (run_dir / n).exists()]


def unwritable(run_dir: str | Path) -> str | None:
    """Why no run directory can be made or written at ``run_dir`` (a file there or above it,
    a folder that refuses writes), or ``None`` when one can. Probes by making and removing
    one empty folder in the nearest folder that exists; leaves nothing behind."""
    path = nearest = Path(run_dir)
    try:
        if path.exists() and not path.is_dir():
            return f"{path} is a file, not a directory"
        while not nearest.exists() and nearest.parent != nearest:
            nearest = nearest.parent
        if not nearest.is_dir():
            return f"{nearest} is a file, so no directory can be made under it"
        os.rmdir(tempfile.mkdtemp(prefix=".spectra-probe-", dir=nearest))
    except OSError as exc:
        return f"{nearest} is not writable ({exc.strerror or exc})"
    return None
