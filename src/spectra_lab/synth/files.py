"""Result files of the experiments (CSV; JSON is ``spectra_lab.files.write_json_atomic``),
written atomically by ``spectra_lab.files``."""

from __future__ import annotations

import contextlib
import csv
import io
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from spectra_lab.files import atomic_write


def write_csv_atomic(
    path: str | os.PathLike, header: Sequence[str], rows: Iterator[Sequence[Any]] | list
) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([f"{v:.10g}" if isinstance(v, float) else v for v in row])
    return atomic_write(path, buf.getvalue())


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads (the experiments' matrices are tiny, so extra
    threads only add synchronisation cost), restoring the previous setting afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
