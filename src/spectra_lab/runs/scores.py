"""A run's downstream scores: ``RUN/eval/scores.csv``, written by ``spectra eval``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from spectra_lab.errors import CLIError

#: the folder of a run directory that ``spectra eval`` writes into
EVAL_DIR = "eval"
SCORES_CSV = "scores.csv"
SCORE_FIELDS = ("task", "metric", "filter", "n_shot", "value", "stderr")


def read_scores(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``RUN_DIR/eval/scores.csv`` (values as floats)."""
    path = Path(run_dir) / EVAL_DIR / SCORES_CSV
    if not path.is_file():
        raise CLIError(f"{run_dir}: no downstream scores ({path}); run `spectra eval {run_dir}`")
    with open(path, newline="", encoding="utf-8") as f:
        return [{**r, "value": float(r["value"])} for r in csv.DictReader(f)]
