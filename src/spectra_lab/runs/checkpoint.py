"""Checkpoints: atomic, self-verifying files of a run's state_dict-able components.

A checkpoint is ``{name: component.state_dict()}`` for the components the trainer hands
over (model, optimizer, LR schedule, data-sampler position, RNG states; the last two in
``train/schedule.py`` and ``train/rng.py``) plus a few
scalars (format, step, tokens, world size, config). Every component has ``state_dict()``
and ``load_state_dict()``; the ones whose state differs between ranks are wrapped in
:class:`PerRank`, which gathers every rank's state into one list.

Two layouts, one per kind of run:

* ``ckpt/step_NNNNNNN.pt``, one file (single process and DDP): rank 0 writes every component.
* ``ckpt/step_NNNNNNN/``, a directory (FSDP2): the sharded components (:class:`ShardedModel`,
  :class:`ShardedOptimizer`) go through ``torch.distributed.checkpoint`` (DCP), every rank
  writing its own shards, and the others, with the scalars, go to one small file,
  :data:`TRAINER_FILE`, in the same directory. Everything is written into
  ``step_NNNNNNN.tmp-<tag>/``; when every rank is done, rank 0 renames it (an atomic rename):
  a directory named ``step_NNNNNNN`` is always complete, and the listing ignores any other
  (leftovers of a killed save are deleted by the next one).

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
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from spectra_lab.errors import UserError
from spectra_lab.files import atomic_write

MAGIC = b"SPCKPT01"
#: layout of the checkpoint dict; 2: one entry per component
FORMAT = 2
_FOOTER = len(MAGIC) + 8 + 32
#: a file checkpoint ``step_NNNNNNN.pt`` or a directory checkpoint ``step_NNNNNNN``
_NAME = re.compile(r"^step_(\d+)(\.pt)?$")
#: a directory checkpoint being written (or left by a killed save, or being deleted)
_PARTIAL = re.compile(r"^step_\d+\.tmp-")
#: the trainer's file in a directory checkpoint: the scalars and the components DCP does not hold
TRAINER_FILE = "trainer.pt"
#: the hint of a damaged-checkpoint error when a run resumes (commands that only read a
#: checkpoint pass their own to :func:`read_checkpoint` and :func:`resolve_checkpoint`)
_EARLIER = "delete it to resume from an earlier one"
#: DCP's index of a checkpoint, written by its coordinator after every rank's shards
DCP_METADATA = ".metadata"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that is missing, truncated, corrupt or from another setup."""


class Ranks(Protocol):
    """What a sharded save needs of the training runtime (``train.runtime.Runtime``)."""

    is_main: bool

    def broadcast(self, obj: Any) -> Any: ...

    def barrier(self) -> None: ...


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


# ---------------------------------------------------------------------------------------
# component wrappers


class PerRank:
    """A component whose state may differ between ranks (data position, RNG).

    Its state is the list of every rank's state, gathered with ``gather`` (a collective:
    every rank calls ``state_dict``); each rank loads its own entry. A run resumed on another
    number of processes loads, for a ``shared`` component (one whose state every rank holds
    alike, such as the sampler's position in the global order), the common state, checked to
    be common; for any other, the entry of ``rank`` modulo the saved count.
    """

    def __init__(
        self,
        component: Stateful,
        rank: int,
        gather: Callable[[Any], list],
        *,
        shared: bool = False,
    ) -> None:
        self.component = component
        self.rank = rank
        self.gather = gather
        self.shared = shared

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": self.gather(self.component.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks = state["ranks"]
        if self.shared:
            if any(r != ranks[0] for r in ranks[1:]):
                raise CheckpointError(
                    f"the saved {type(self.component).__name__} states differ across ranks"
                )
            self.component.load_state_dict(ranks[0])
            return
        self.component.load_state_dict(ranks[self.rank % len(ranks)])


class ShardedModel:
    """The model of an FSDP2 run as a DCP component: each rank's shards, keyed by name.

    Its state is ``get_model_state_dict(model)`` (``DTensor`` values), which DCP saves and
    loads shard by shard; DCP also reshards it, and :func:`load_model_weights` reads it whole.
    """

    sharded = True

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state)


class ShardedOptimizer:
    """The optimizer of an FSDP2 run as a DCP component.

    Its state is ``get_optimizer_state_dict(model, optimizer)``: the optimizer's own
    ``state_dict()`` keyed by parameter name instead of index (spectra's optimizers save their
    clip schedules as text, and keep the built ones when loading). To load, DCP first asks
    for this state as a template: torch initialises the empty state of a fresh optimizer with
    one step of zero gradients at lr 0 (which leaves the weights as they are); then
    ``set_optimizer_state_dict`` loads the saved state over it.
    """

    sharded = True

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state)


def _sharded(components: dict[str, Stateful]) -> dict[str, Stateful]:
    """The components that DCP holds: those marked ``sharded``."""
    return {name: c for name, c in components.items() if getattr(c, "sharded", False)}


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
        write_checkpoint(path, {"format": FORMAT, **scalars, **state})


def save_sharded_components(
    path: str | Path, components: dict[str, Stateful], scalars: dict[str, Any], rt: Ranks
) -> None:
    """Save the directory checkpoint ``path`` (``.../step_NNNNNNN``); every rank calls it.

    The sharded components go through ``dcp.save`` (each rank writes its shards; DCP's
    coordinator writes :data:`DCP_METADATA` once all are written), the others and ``scalars``
    to :data:`TRAINER_FILE` (rank 0, with the footer), all into ``<path>.tmp-<tag>/``. After a
    barrier rank 0 renames that directory to ``path`` and deletes leftovers of earlier saves.
    """
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp-{rt.broadcast(secrets.token_hex(4))}")
    sharded = _sharded(components)
    state = {name: c.state_dict() for name, c in components.items() if name not in sharded}
    dcp.save(sharded, checkpoint_id=tmp)
    if rt.is_main:
        trainer = {"format": FORMAT, "sharded": list(sharded), **scalars, **state}
        write_checkpoint(tmp / TRAINER_FILE, trainer)
    rt.barrier()  # every rank's shards are on disk
    if rt.is_main:
        if path.exists():  # an earlier save of this step (of a run resumed from before it)
            delete_checkpoint(path)
        os.rename(tmp, path)
        _fsync_dir(path.parent)
        for p in path.parent.iterdir():  # killed saves and deletions
            if _PARTIAL.match(p.name):
                shutil.rmtree(p, ignore_errors=True)
    rt.barrier()


def load_components(
    path: str | Path,
    components: dict[str, Stateful],
    world_size: int,
    sequences_per_step: int,
    check: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Load every component from the checkpoint at ``path``, in order; return the checkpoint.

    ``check(checkpoint)``, given, sees the checkpoint before any component is loaded (a
    resumed run compares its config with the saved one there).

    A file checkpoint holds every component; a directory checkpoint holds the sharded ones
    (loaded first, through DCP: every rank calls this; DCP reshards them for this run's
    layout) and its :data:`TRAINER_FILE` the rest. A run may resume on another number of
    processes when it keeps the global batch (``sequences_per_step``, batch size × gradient
    accumulation × processes): the data order depends on the global step alone.
    """
    path = Path(path)
    sharded = _sharded(components)
    directory = path.is_dir()
    if directory and not sharded:
        raise CheckpointError(
            f"checkpoint {path} is a sharded (DCP) directory of a parallel=fsdp2, tp or 2d "
            "run; resume it with one of those"
        )
    if sharded and not directory:
        raise CheckpointError(
            f"checkpoint {path} is a single file of a run without sharding; "
            "resume it with parallel=ddp"
        )
    state = read_checkpoint(path, map_location="cpu")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: unknown format {state.get('format')!r}")
    if check is not None:
        check(state)
    saved = state["config"]
    saved_dp = state.get("dp_size", state["world_size"])
    saved_sequences = saved["batch_size"] * saved["grad_accum"] * saved_dp
    if state["world_size"] != world_size and saved_sequences != sequences_per_step:
        raise CheckpointError(
            f"checkpoint {path} was written by {state['world_size']} processes with a global "
            f"batch of {saved_sequences} sequences; on {world_size} this run's is "
            f"{sequences_per_step}: set global_batch_size = {saved_sequences} to resume on "
            "another number of processes"
        )
    if sharded:
        if sorted(state.get("sharded", ())) != sorted(sharded):
            raise CheckpointError(
                f"checkpoint {path} holds the sharded components {state.get('sharded')}, "
                f"not {list(sharded)}"
            )
        _dcp_load(path, sharded)
    for name, component in components.items():
        if name not in sharded:
            component.load_state_dict(state[name])
    return state


def load_model_weights(path: str | Path, model: nn.Module) -> None:
    """The weights of checkpoint ``path`` (a file or a DCP directory) into a plain ``model``.

    One process, no process group: the shards of a directory checkpoint are read whole.
    """
    path = Path(path)
    if not path.is_dir():
        model.load_state_dict(read_checkpoint(path, map_location="cpu")["model"])
        return
    weights = model.state_dict()
    with warnings.catch_warnings():  # DCP's note that it loads in a single process
        warnings.filterwarnings("ignore", message=".*single process", category=UserWarning)
        _dcp_load(path, {"model": weights}, no_dist=True)  # fills ``weights`` in place
    model.load_state_dict(weights)


def _dcp_load(path: Path, state: dict[str, Any], no_dist: bool = False) -> None:
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(state, checkpoint_id=path, no_dist=no_dist)
    except (dcp.CheckpointException, OSError, RuntimeError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint {path}: cannot read its sharded state: {first}") from exc


# ---------------------------------------------------------------------------------------
# files


def write_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Serialize ``state`` with a length-and-checksum footer, atomically."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    footer = MAGIC + len(payload).to_bytes(8, "little") + hashlib.sha256(payload).digest()
    atomic_write(path, payload + footer)


def read_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", *, hint: str = _EARLIER
) -> dict:
    """Read a checkpoint written by :func:`write_checkpoint`, verifying length and checksum.

    For a directory checkpoint: its :data:`TRAINER_FILE` (everything but the sharded
    components). A damaged one is a ``CheckpointError`` that ends with ``hint``.
    """
    path = Path(path)
    if path.is_dir():
        path = _complete(path, hint) / TRAINER_FILE
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    data = path.read_bytes()
    if len(data) < _FOOTER or data[-_FOOTER : -_FOOTER + len(MAGIC)] != MAGIC:
        raise CheckpointError(
            f"checkpoint {path} is truncated or not a spectra checkpoint "
            f"({len(data)} bytes, no valid footer); {hint}"
        )
    size = int.from_bytes(data[-_FOOTER + len(MAGIC) : -32], "little")
    payload = data[:-_FOOTER]
    if len(payload) != size:
        raise CheckpointError(
            f"checkpoint {path} is truncated: payload has {len(payload)} bytes, expected {size}; "
            f"{hint}"
        )
    if hashlib.sha256(payload).digest() != data[-32:]:
        raise CheckpointError(f"checkpoint {path} is corrupt: checksum mismatch; {hint}")
    return torch.load(io.BytesIO(payload), map_location=map_location, weights_only=False)


def checkpoint_path(run_dir: str | Path, step: int, sharded: bool = False) -> Path:
    """``ckpt/step_NNNNNNN.pt``, or the directory ``ckpt/step_NNNNNNN`` with ``sharded``."""
    name = f"step_{step:07d}"
    return Path(run_dir) / "ckpt" / (name if sharded else f"{name}.pt")


def is_complete(path: Path) -> bool:
    """Whether a directory checkpoint holds its trainer file and DCP's index."""
    return (path / TRAINER_FILE).is_file() and (path / DCP_METADATA).is_file()


def _complete(path: Path, hint: str = "resume from an earlier one") -> Path:
    if not is_complete(path):
        raise CheckpointError(
            f"checkpoint {path} is incomplete (no {TRAINER_FILE} or {DCP_METADATA}); {hint}"
        )
    return path


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every complete checkpoint in ``run_dir/ckpt``, oldest first.

    Files ``step_NNNNNNN.pt`` and complete directories ``step_NNNNNNN``; temporary
    directories of a save in progress (or killed) are not checkpoints.
    """
    folder = Path(run_dir) / "ckpt"
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _NAME.match(p.name)
        if m and (p.is_file() if m.group(2) else p.is_dir() and is_complete(p)):
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def resolve_checkpoint(path: str | Path, hint: str | None = None) -> Path:
    """A checkpoint (file or directory), or the latest checkpoint of a run directory; an
    incomplete directory checkpoint is a ``CheckpointError`` that ends with ``hint``."""
    path = Path(path)
    if path.is_dir() and _NAME.match(path.name):
        return _complete(path) if hint is None else _complete(path, hint)
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
        delete_checkpoint(p)


def delete_checkpoint(path: Path) -> None:
    """Delete a checkpoint file, or a directory: renamed out of the listing first, so that a
    deletion cut short never leaves a directory that looks complete."""
    if not path.is_dir():
        path.unlink(missing_ok=True)
        return
    doomed = path.with_name(f"{path.name}.tmp-deleting-{secrets.token_hex(4)}")
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
