"""``spectra sweep GRID.yaml --out DIR``: every run of a grid, resumably, then the report.

Runs go to ``--workers`` processes at a time (a fresh process per run, with ``--threads``
torch threads). A run whose ``summary.json`` is there is skipped; one with a checkpoint resumes
from it; the rest start afresh. The sweep can therefore be stopped at any point and started
again with the same command. After each finished run the report (``results.json``,
``results.md``, ``curves.png``) is rewritten, so that it always shows what is done. A run that
fails is reported and the others go on; the exit code is then 1.

SIGINT (Ctrl-C) or SIGTERM, sent to the sweep alone or to its whole process group, stops it:
no further run starts, the sweep passes SIGTERM on to its running runs, which write a
checkpoint at their next step boundary (``spectra_lab.train.signals``), and it waits for them,
rewrites the report and ends in one line with exit code 128 + the signal's number. A second
Ctrl-C ends the running runs at once, without a checkpoint.

One sweep at a time trains into a directory: it holds ``DIR/.sweep.lock`` (an advisory
``flock``, which the system releases when the process ends, however it ends), and a second
sweep on the same directory stops at once with one line naming the first one's pid.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import multiprocessing as mp
import os
import shutil
import signal
import sys
from collections import deque
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, sweeps are not guarded
    fcntl = None  # type: ignore[assignment]

from spectra.validate import check_int
from spectra_lab.errors import CLIError, UserError
from spectra_lab.runs.layout import unwritable
from spectra_lab.sweep.grid import Run, SweepError, check_unchanged, read_grid, status
from spectra_lab.sweep.report import write_report
from spectra_lab.train.signals import StopSignals


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


class SweepStopped(UserError):
    """A sweep stopped by a signal, its running runs at a checkpoint."""

    def __init__(self, signum: int, stopped: int, waiting: int) -> None:
        self.exit_code = 128 + signum  # the shell's status for a process the signal ended
        super().__init__(
            f"{signal.Signals(signum).name}: the sweep stopped ({stopped} running run(s) "
            f"stopped where they resume, {waiting} not started); the same command goes on"
        )


def _train_one(
    result: Connection, cfg_dict: dict[str, Any], threads: int | None, name: str
) -> None:
    """Worker: train one run (resuming where it can) and send how it ended: ``("done",
    None)``, ``("stopped", message)`` (a signal, a checkpoint written) or ``("failed",
    message)``. Its output lines start with ``[name]``."""
    import torch

    from spectra_lab.train.config import TrainConfig
    from spectra_lab.train.signals import Interrupted
    from spectra_lab.train.trainer import train

    sys.stdout = Labelled(sys.__stdout__, f"[{name}] ")
    sys.stderr = Labelled(sys.__stderr__, f"[{name}] ")
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        train(TrainConfig(**cfg_dict))
        outcome: tuple[str, str | None] = ("done", None)
    except Interrupted as exc:
        outcome = ("stopped", str(exc))
    except Exception as exc:  # reported by the parent; the other runs go on
        outcome = ("failed", f"{type(exc).__name__}: {exc}")
    result.send(outcome)


def _prepared(run: Run) -> dict[str, Any]:
    """The run's config, set to resume from its checkpoint or to start afresh."""
    state = status(run)
    cfg = dataclasses.replace(
        run.config, resume=state == "partial", overwrite=state == "new", progress=False
    )
    return cfg.to_dict()


@dataclasses.dataclass
class _Worker:
    run: Run
    process: BaseProcess
    result: Connection


def _start(ctx: Any, run: Run, threads: int | None) -> _Worker:
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_train_one, args=(send, _prepared(run), threads, run.name))
    process.start()
    send.close()  # the child holds the only sending end: its exit reads as EOF here
    return _Worker(run, process, receive)


def _outcome(worker: _Worker) -> tuple[str, str | None]:
    """How the worker's run ended, once its process has."""
    try:
        outcome = worker.result.recv() if worker.result.poll() else None
    except EOFError:
        outcome = None
    worker.process.join()
    worker.result.close()
    if outcome is not None:
        return outcome
    code = worker.process.exitcode
    return "lost", f"its process ended (exit code {code}) before it could report"


def run_sweep(
    runs: list[Run],
    out: Path,
    workers: int = 1,
    threads: int | None = None,
    progress: bool = True,
    **report: Any,
) -> list[tuple[str, str]]:
    """Train every run not yet done; returns ``(name, error)`` for the runs that failed.
    ``progress``: a bar of the runs done (a failed run is reported either way). A signal
    stops it (the module docstring) with :class:`SweepStopped`."""
    from tqdm import tqdm

    todo = deque(r for r in runs if status(r) != "done")
    failed: list[tuple[str, str]] = []
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc="sweep", unit="run",
               disable=not progress)  # fmt: skip
    env_threads = str(threads) if threads is not None else None
    if env_threads is not None:  # the workers' BLAS pools start with this many threads
        os.environ.setdefault("OMP_NUM_THREADS", env_threads)
    ctx = mp.get_context("spawn")
    active: list[_Worker] = []
    forwarded, stopped = False, 0
    what = "no further run starts; the running runs stop at their next step boundary"
    with StopSignals(what) as stop:
        try:
            while active or (todo and stop.signum is None):
                while todo and len(active) < workers and stop.signum is None:
                    active.append(_start(ctx, todo.popleft(), threads))
                if stop.signum is not None and not forwarded:
                    for w in active:  # SIGTERM, not SIGINT: a second SIGINT means "at once"
                        os.kill(w.process.pid, signal.SIGTERM)  # type: ignore[arg-type]
                    forwarded = True
                ended = set(wait([w.process.sentinel for w in active], timeout=0.5))
                for w in [w for w in active if w.process.sentinel in ended]:
                    active.remove(w)
                    kind, message = _outcome(w)
                    if kind == "done":
                        bar.update()
                        bar.set_postfix_str(w.run.name)
                        write_report(runs, out, **report)
                    elif kind in ("stopped", "lost") and stop.signum is not None:
                        stopped += 1
                    else:
                        failed.append((w.run.name, message or kind))
                        bar.write(f"failed: {w.run.name}: {message}")
        finally:  # the second Ctrl-C, or an error here: no run outlives the sweep
            for w in active:
                w.process.kill()
                w.process.join()
    bar.close()
    if stop.signum is not None:
        write_report(runs, out, **report)
        for name, error in failed:
            print(f"failed: {name}: {error}", file=sys.stderr)
        raise SweepStopped(stop.signum, stopped, len(todo))
    return failed


@contextlib.contextmanager
def holding_lock(out: Path) -> Iterator[IO[str] | None]:
    """Hold ``out/.sweep.lock`` while the block runs, or stop with one line if another
    process holds it."""
    if fcntl is None:
        yield None
        return
    with open(out / ".sweep.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise CLIError(
                f"--out {out}: another sweep (pid {holder}) is training there; let it finish, "
                "or stop it (Ctrl-C or kill) and run the same command again"
            ) from None
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield handle  # the lock goes with the file's closing, or with the process


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
    failed: list[tuple[str, str]] = []
    if not args.report_only:
        with holding_lock(out):
            progress = not args.no_progress
            failed = run_sweep(runs, out, args.workers, args.threads, progress, **report)
    write_report(runs, out, **report)
    print((out / "results.md").read_text(), end="")
    for name, error in failed:
        print(f"failed: {name}: {error}", file=sys.stderr)
    return 1 if failed else 0
