"""Atomic, self-verifying checkpoint files.

A checkpoint file is the ``torch.save`` payload followed by a 48-byte footer::

    payload | MAGIC (8 bytes) | payload length (8 bytes, little endian) | sha256(payload)

Files are written to a temporary name in the same directory, flushed, fsynced and
moved into place with ``os.replace``, so a reader never sees a half-written file under
the final name. A file cut short anyway (a full disk, a copy interrupted) fails the
footer check with a message saying so, instead of an unpickling error.

Checkpoints are trusted files written by this trainer (they hold optimizer and sampler
state of arbitrary Python types, so they are loaded with ``weights_only=False``); the
checksum guards against truncation and corruption, not against tampering.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

MAGIC = b"SPCKPT01"
_FOOTER = len(MAGIC) + 8 + 32
_NAME = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, truncated or corrupt."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Serialize ``state`` with a length-and-checksum footer, atomically."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    footer = MAGIC + len(payload).to_bytes(8, "little") + hashlib.sha256(payload).digest()
    atomic_write_bytes(path, payload + footer)


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
