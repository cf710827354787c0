"""``loss.png`` and the metrics CSV files of a run directory."""

from __future__ import annotations

import csv
import math

import pytest

from spectra_lab.train.metrics import EVAL_COLUMNS, TRAIN_COLUMNS, MetricsWriter, plot_curves


def _train(n: int, loss: float = 4.0) -> list[dict]:
    return [{"step": k, "loss": loss - 0.01 * k, "lr": 1e-3} for k in range(1, n + 1)]


@pytest.mark.parametrize("last", [39036.0, math.inf, math.nan])
def test_loss_png_draws_a_huge_or_not_finite_validation_loss(tmp_path, last):
    evals = [{"step": 10, "val_loss": 5.0}, {"step": 20, "val_loss": last}]
    path = tmp_path / "loss.png"
    plot_curves(path, _train(20), evals)
    assert path.read_bytes().startswith(b"\x89PNG") and path.stat().st_size > 1000


def test_loss_png_draws_without_evaluations_or_steps(tmp_path):
    plot_curves(tmp_path / "a.png", _train(3), [])
    plot_curves(tmp_path / "b.png", [], [{"step": 5, "val_loss": float("inf")}])
    assert (tmp_path / "a.png").is_file() and (tmp_path / "b.png").is_file()


def test_metrics_csv_files_hold_the_records(tmp_path):
    writer = MetricsWriter(tmp_path)
    writer.log("train", {"step": 1, "tokens": 64, "loss": 3.5, "lr": 0.001, "extra": 1})
    writer.log("eval", {"step": 1, "tokens": 64, "val_loss": 3.25, "val_ppl": math.exp(3.25)})
    resumed = MetricsWriter(tmp_path, resume_step=1)  # rewritten from metrics.jsonl
    for path, columns in ((resumed.train_csv, TRAIN_COLUMNS), (resumed.eval_csv, EVAL_COLUMNS)):
        with path.open() as f:
            rows = list(csv.DictReader(f))
        assert tuple(rows[0]) == columns and len(rows) == 1
    with resumed.train_csv.open() as f:
        row = next(csv.DictReader(f))
    assert row["loss"] == "3.5" and row["lr"] == "0.001" and row["clip_c"] == ""
