"""``spectra sweep GRID.yaml --out DIR``: every run of a grid, resumably, then the report.

Runs go to a pool of ``--workers`` processes (each a fresh process per run, with
``--threads`` torch threads). A run whose ``summary.json`` is there is skipped; one with a
checkpoint resumes from it; the rest start afresh. The sweep can therefore be stopped at any
point (Ctrl-C, or the machine going away) and started again with the same command. After
each finished run the report (``results.json``, ``results.md``, ``curves.png``) is rewritten,
so that it always shows what is done. A run that fails is reported and the others go on;
the exit code is then 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import multiprocessing as mp
import os
import shutil
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from spectra.validate import check_int
from spectra_lab.errors import CLIError
from spectra_lab.runs.layout import unwritable
from spectra_lab.sweep.grid import Run, SweepError, check_unchanged, read_grid, status
from spectra_lab.sweep.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("grid", help="grid file (YAML): base, cases, grid, seeds")
    parser.add_argument("--out", required=True, help="sweep directory (runs/ and the report)")
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel (1)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run")
    parser.add_argument("--tune", default="lr", help="field whose best value is reported (lr)")
    parser.add_argument(
        "--lines", default=None, metavar="FIELD",
        help="tuning.png: a line per value of this grid field (e.g. d_model), a panel per rest",
    )  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their status")
    parser.add_argument("--report-only", action="store_true", help="only rewrite the report")
    parser.add_argument("--no-plot", action="store_true", help="no curves.png")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (a failed run still says so)"
    )


class Labelled(io.TextIOBase):
    """A text stream that starts every line it passes on with ``label`` (a worker's run name),
    so that the lines of runs trained side by side can be told apart."""

    def __init__(self, stream: Any, label: str) -> None:
        self.stream, self.label, self.partial = stream, label, ""

    def write(self, text: str) -> int:
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            self.stream.write(f"{self.label}{line}\n")
        self.stream.flush()
        return len(text)

    def flush(self) -> None:
        if self.partial:
            self.stream.write(f"{self.label}{self.partial}")
            self.partial = ""
        self.stream.flush()


def _train_one(cfg_dict: dict[str, Any], threads: int | None, name: str) -> tuple[str, str | None]:
    """Worker: train one run (resuming where it can); ``(out_dir, error or None)``. Its
    output lines start with ``[name]``."""
    import torch

    from spectra_lab.train.config import TrainConfig
    from spectra_lab.train.trainer import train

    sys.stdout = Labelled(sys.__stdout__, f"[{name}] ")
    sys.stderr = Labelled(sys.__stderr__, f"[{name}] ")
    if threads is not None:
        torch.set_num_threads(threads)
    cfg = TrainConfig(**cfg_dict)
    try:
        train(cfg)
    except Exception as exc:  # reported by the parent; the other runs go on
        return cfg.out_dir, f"{type(exc).__name__}: {exc}"
    return cfg.out_dir, None


def _prepared(run: Run) -> dict[str, Any]:
    """The run's config, set to resume from its checkpoint or to start afresh."""
    state = status(run)
    cfg = dataclasses.replace(
        run.config, resume=state == "partial", overwrite=state == "new", progress=False
    )
    return cfg.to_dict()


def run_sweep(
    runs: list[Run],
    out: Path,
    workers: int = 1,
    threads: int | None = None,
    progress: bool = True,
    **report: Any,
) -> list[tuple[str, str]]:
    """Train every run not yet done; returns ``(name, error)`` for the runs that failed.
    ``progress``: a bar of the runs done (a failed run is reported either way)."""
    from tqdm import tqdm

    todo = [r for r in runs if status(r) != "done"]
    by_dir = {r.config.out_dir: r for r in todo}
    failed: list[tuple[str, str]] = []
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc="sweep", unit="run",
               disable=not progress)  # fmt: skip
    env_threads = str(threads) if threads is not None else None
    if env_threads is not None:  # the workers' BLAS pools start with this many threads
        os.environ.setdefault("OMP_NUM_THREADS", env_threads)
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, max_tasks_per_child=1) as pool:
        pending = {pool.submit(_train_one, _prepared(r), threads, r.name) for r in todo}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                out_dir, error = fut.result()
                run = by_dir[out_dir]
                if error is not None:
                    failed.append((run.name, error))
                    bar.write(f"failed: {run.name}: {error}")
                bar.update()
                bar.set_postfix_str(run.name)
                write_report(runs, out, **report)
    bar.close()
    return failed


def run(args: argparse.Namespace) -> int:
    try:
        check_int("--workers", args.workers, low=1)
        check_int("--threads", args.threads, low=1, none_ok=True)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    out = Path(args.out)
    why = unwritable(out)
    if why is not None:
        raise CLIError(f"--out {args.out}: {why}; give another --out")
    try:
        runs = read_grid(args.grid, out)
        for r in runs:
            check_unchanged(r)
    except SweepError as exc:
        raise CLIError(str(exc)) from None
    report = {"tune": args.tune, "plot": not args.no_plot, "lines": args.lines}
    if args.dry_run:
        for r in runs:
            print(f"{status(r):>7}  {r.name}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    copy = out / "grid.yaml"
    if not copy.exists():  # the grid the results came from
        shutil.copyfile(args.grid, copy)
    failed = (
        []
        if args.report_only
        else run_sweep(runs, out, args.workers, args.threads, not args.no_progress, **report)
    )
    write_report(runs, out, **report)
    print((out / "results.md").read_text(), end="")
    for name, error in failed:
        print(f"failed: {name}: {error}", file=sys.stderr)
    return 1 if failed else 0
