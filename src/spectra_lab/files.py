"""Atomic files: a reader sees the old file or the whole new one, never a part.

Every file the harness writes goes through :func:`atomic_path`: the content goes to a
temporary name in the target's folder, is flushed to disk, and is renamed over the target
with ``os.replace`` when the writer finishes without error; on error the temporary file is
removed. :func:`atomic_write` is the common case of a file written in one piece,
:func:`write_json_atomic` that of a JSON document, :func:`write_csv` that of a table and
:func:`save_figure` that of a matplotlib figure.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import secrets
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is imported by the code that draws, not by this module
    from matplotlib.figure import Figure


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A fresh temporary path next to ``path``, renamed to ``path`` when the block succeeds.

    The block creates and writes the temporary file (in one go or streamed); it is fsynced
    and moved into place on success, deleted if the block raises. The file gets the mode of
    a newly created one (``0o666`` less the umask, as ``open`` gives), whatever mode the
    writer gave the temporary file (``safetensors`` writes ``0o600``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            if hasattr(os, "fchmod"):  # POSIX
                os.fchmod(f.fileno(), new_file_mode())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def new_file_mode() -> int:
    """The mode ``open`` gives a new file: ``0o666`` less the process's umask."""
    try:  # Linux states the umask; reading it there leaves it untouched for other threads
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


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


def write_csv(
    path: str | os.PathLike,
    header: Sequence[str],
    rows: Iterable[Sequence[Any] | Mapping[str, Any]],
    *,
    float_format: str | None = None,
) -> Path:
    """Write a CSV table (a header line, then one line per row) to ``path`` atomically.

    A row is a sequence of values in the order of ``header``, or a mapping from column name to
    value: then the values are taken by the names in ``header`` (a missing one is empty, an
    extra key is left out). Floats are written with ``format(v, float_format)`` when it is
    given (e.g. ``".10g"``), otherwise as Python prints them (``repr``, which reads back
    exactly). Lines end in ``\n``. Returns the path.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(_csv_values(header, row, float_format) for row in rows)
    return atomic_write(path, buf.getvalue())


def append_csv_row(
    path: str | os.PathLike, header: Sequence[str], row: Sequence[Any] | Mapping[str, Any]
) -> None:
    """Append one row to the CSV table at ``path`` (as :func:`write_csv` writes its rows).

    For a table that grows while it is read, such as a training log: the file must already
    hold its header (from :func:`write_csv`). An append is not atomic; a crash may leave the
    last line cut, which :func:`write_csv` of the whole table repairs.
    """
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(_csv_values(header, row, None))
    with Path(path).open("a", newline="") as f:
        f.write(buf.getvalue())


def _csv_values(
    header: Sequence[str], row: Sequence[Any] | Mapping[str, Any], float_format: str | None
) -> list[Any]:
    """A row's values in the order of ``header`` (a mapping's missing keys empty)."""
    values = [row.get(k, "") for k in header] if isinstance(row, Mapping) else list(row)
    if float_format is not None:
        values = [format(v, float_format) if isinstance(v, float) else v for v in values]
    return values


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = 100) -> Path:
    """Save a matplotlib figure to ``path`` atomically and close it; returns the path.

    The format follows the suffix (``.png``, ``.pdf``, ``.svg``, ...; PNG when there is none).
    The figure is closed (its memory released by pyplot) whether or not saving succeeds.
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi)
    finally:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(fig)
    return path
