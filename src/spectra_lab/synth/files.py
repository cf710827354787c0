"""How the experiments write and run: the float format of their CSV files (written by
``spectra_lab.files.write_csv``) and the torch thread count of their small matrices."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

#: how the experiments' CSV files write floats (ten significant digits)
CSV_FLOATS = ".10g"


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
