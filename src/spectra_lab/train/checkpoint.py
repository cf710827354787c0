"""Checkpoints: atomic, self-verifying files of a run's state_dict-able components.

A checkpoint is ``{name: component.state_dict()}`` for the components the trainer hands
over (model, optimizer, LR schedule, data-sampler position, RNG states) plus a few
scalars (format, step, tokens, world size, config). Every component has ``state_dict()``
and ``load_state_dict()``; the ones whose state differs between ranks are wrapped in
:class:`PerRank`, which gathers every rank's state into one list.

On disk, a checkpoint file is the ``torch.save`` payload followed by a 48-byte footer::

    payload | MAGIC (8 bytes) | payload length (8 bytes, little endian) | sha256(payload)

Files are written through :func:`spectra_lab.files.atomic_path` (a temporary name,
fsync, ``os.replace``), so a reader never sees a half-written file under the final name.
A file cut short anyway (a full disk, a copy interrupted) fails the footer check with a
message saying so, instead of an unpickling error.

Checkpoints are trusted files written by this trainer (they hold optimizer and sampler
state of arbitrary Python types, so they are loaded with ``weights_only=False``); the
checksum guards against truncation and corruption, not against tampering.
"""

from __future__ import annotations

import hashlib
import io
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from spectra_lab.errors import UserError
from spectra_lab.files import atomic_write

MAGIC = b"SPCKPT01"
#: layout of the checkpoint dict; 2: one entry per component
FORMAT = 2
_FOOTER = len(MAGIC) + 8 + 32
_NAME = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that is missing, truncated, corrupt or from another setup."""


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


# ---------------------------------------------------------------------------------------
# components that torch does not provide


class LRSchedule:
    """``LambdaLR`` as a component whose state is the step it is at.

    The schedule itself is the run's config, not the checkpoint's, so that ``--steps``
    may extend a finished WSD run. Loading rebuilds ``LambdaLR`` at the saved step with
    the public ``last_epoch`` argument; load the optimizer first, since the rebuilt
    scheduler takes its peak lr from the groups' ``initial_lr``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, lr_lambda: Callable[[int], float]):
        self.optimizer = optimizer
        self.lr_lambda = lr_lambda
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    def step(self) -> None:
        self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.scheduler.last_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # LambdaLR(last_epoch=k-1) steps once on construction: the lr becomes
        # initial_lr * lr_lambda(k), the lr of step k.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, self.lr_lambda, last_epoch=state["step"] - 1
        )


class RNGState:
    """This process's Python, NumPy, torch and (on CUDA) device random states."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        state = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),  # noqa: NPY002 (global state used by any legacy caller)
            "torch": torch.get_rng_state(),
        }
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])  # noqa: NPY002
        torch.set_rng_state(state["torch"])
        if "cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)


class PerRank:
    """A component whose state differs between ranks (data position, RNG).

    Its state is the list of every rank's state, gathered with ``gather`` (a collective:
    every rank calls ``state_dict``); each rank loads its own entry.
    """

    def __init__(self, component: Stateful, rank: int, gather: Callable[[Any], list]) -> None:
        self.component = component
        self.rank = rank
        self.gather = gather

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": self.gather(self.component.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.component.load_state_dict(state["ranks"][self.rank])


# ---------------------------------------------------------------------------------------
# components <-> checkpoint files


def save_components(
    path: str | Path, components: dict[str, Stateful], scalars: dict[str, Any], write: bool
) -> None:
    """Save ``{name: c.state_dict()}`` and ``scalars`` to ``path``.

    Every rank calls it (per-rank components gather their states); ranks with ``write``
    false only take part in the gathering.
    """
    state = {name: c.state_dict() for name, c in components.items()}
    if write:
        save_checkpoint(path, {"format": FORMAT, **scalars, **state})


def load_components(
    path: str | Path, components: dict[str, Stateful], world_size: int
) -> dict[str, Any]:
    """Load every component from the checkpoint at ``path``, in order; return the checkpoint."""
    state = load_checkpoint(path, map_location="cpu")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: unknown format {state.get('format')!r}")
    if state["world_size"] != world_size:
        raise CheckpointError(
            f"checkpoint {path} was written by {state['world_size']} processes; "
            f"resume with the same number (got {world_size})"
        )
    for name, component in components.items():
        component.load_state_dict(state[name])
    return state


# ---------------------------------------------------------------------------------------
# files


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Serialize ``state`` with a length-and-checksum footer, atomically."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    footer = MAGIC + len(payload).to_bytes(8, "little") + hashlib.sha256(payload).digest()
    atomic_write(path, payload + footer)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by :func:`save_checkpoint`, verifying length and checksum."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    data = path.read_bytes()
    if len(data) < _FOOTER or data[-_FOOTER : -_FOOTER + len(MAGIC)] != MAGIC:
        raise CheckpointError(
            f"checkpoint {path} is truncated or not a spectra checkpoint "
            f"({len(data)} bytes, no valid footer); delete it to resume from an earlier one"
        )
    size = int.from_bytes(data[-_FOOTER + len(MAGIC) : -32], "little")
    payload = data[:-_FOOTER]
    if len(payload) != size:
        raise CheckpointError(
            f"checkpoint {path} is truncated: payload has {len(payload)} bytes, expected {size}"
        )
    if hashlib.sha256(payload).digest() != data[-32:]:
        raise CheckpointError(f"checkpoint {path} is corrupt: checksum mismatch")
    return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=False)


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "ckpt" / f"step_{step:07d}.pt"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every checkpoint in ``run_dir/ckpt``, oldest first."""
    folder = Path(run_dir) / "ckpt"
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or the latest checkpoint of a run directory."""
    path = Path(path)
    if path.is_dir():
        latest = latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(f"no checkpoint in {path / 'ckpt'}")
        return latest
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    return path


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (``keep=0`` keeps all)."""
    if keep <= 0:
        return
    for _, p in list_checkpoints(run_dir)[:-keep]:
        p.unlink(missing_ok=True)
