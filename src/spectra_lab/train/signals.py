"""Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (a scheduler's notice before it kills).

While :class:`StopSignals` is active, the first SIGINT or SIGTERM only records the request: the
loop finishes the step it is in, writes a checkpoint at that step boundary and ends with
:class:`Interrupted`, which the ``spectra`` command reports in one line (exit code 128 + the
signal's number). A second SIGINT stops at once (``KeyboardInterrupt``), without a checkpoint.

Under ``torchrun`` every rank receives the signal, not necessarily at the same step; the ranks
agree on rank 0's view at the steps where they report (every ``log_interval`` steps), so that
all of them write the same checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from spectra_lab.errors import UserError

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(UserError):
    """A run stopped by a signal after writing a checkpoint at a step boundary."""

    def __init__(self, signum: int, step: int, path: Path) -> None:
        self.signum, self.step, self.path = signum, step, path
        self.exit_code = 128 + signum  # the shell's status for a process the signal ended
        name = signal.Signals(signum).name
        super().__init__(
            f"{name}: stopped after step {step}, checkpoint {path}; continue with --resume"
        )


class StopSignals:
    """A context manager that turns SIGINT/SIGTERM into a stop request (:attr:`signum`).

    It does nothing outside the main thread (Python delivers signals there only) and
    restores the previous handlers on exit.
    """

    def __init__(self, what: str = "stopping after this step to write a checkpoint") -> None:
        self.what = what  # what the first signal does, as its message says
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: now
        if self.signum is None and os.environ.get("RANK", "0") == "0":
            name = signal.Signals(signum).name
            print(
                f"\n{name}: {self.what} (Ctrl-C again to stop at once, without a checkpoint)",
                file=sys.stderr,
                flush=True,
            )
        self.signum = signum

    def requested(self, broadcast: Any | None = None) -> int | None:
        """The signal to stop for, if any; with ``broadcast`` (several ranks), rank 0's."""
        return self.signum if broadcast is None else broadcast(self.signum)
