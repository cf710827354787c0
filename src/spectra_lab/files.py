"""Atomic files: a reader sees the old file or the whole new one, never a part.

Every file the harness writes goes through :func:`atomic_path`: the content goes to a
temporary name in the target's folder, is flushed to disk, and is renamed over the target
with ``os.replace`` when the writer finishes without error; on error the temporary file is
removed. :func:`atomic_write` is the common case of a file written in one piece, and
:func:`write_json_atomic` that of a JSON document.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A fresh temporary path next to ``path``, renamed to ``path`` when the block succeeds.

    The block creates and writes the temporary file (in one go or streamed); it is fsynced
    and moved into place on success, deleted if the block raises.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(path)


def jsonable(value: Any) -> Any:
    """``value`` with what JSON cannot hold replaced: inf and nan become the strings "inf",
    "nan" (``float("inf")`` reads them back), arrays and tensors (anything with ``tolist``)
    lists."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (through :func:`jsonable`) to ``path`` atomically."""
    text = json.dumps(jsonable(obj), indent=2, sort_keys=False, allow_nan=False)
    return atomic_write(path, text + "\n")
