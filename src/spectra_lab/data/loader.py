"""Batches of token windows from a memory-mapped ``.bin`` file.

A :class:`TokenDataset` of ``N`` tokens and length ``T`` has ``(N-1) // T`` non-overlapping
windows; window ``i`` is ``x = tokens[iT : iT+T]`` with targets ``y = tokens[iT+1 : iT+T+1]``.

:class:`BatchSampler` visits the windows epoch by epoch, each epoch in the order of a
permutation seeded by ``(seed, epoch)``; a batch that reaches the end of an epoch continues
with the next one, so each window is used exactly once per epoch. Its state is two integers
(epoch, position in the epoch), so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from spectra_lab.data.errors import DataError
from spectra_lab.data.format import META_FILE, read_meta, remake_hint

__all__ = ["BatchSampler", "TokenDataset", "iter_eval_batches"]


class TokenDataset:
    """Non-overlapping length-``seq_len`` windows over a flat token file.

    The token dtype is read from the ``meta.json`` next to the file (``uint16`` if there is
    none) unless ``dtype`` is given.
    """

    def __init__(self, path: str | Path, seq_len: int, dtype: str | np.dtype | None = None):
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
        self.path = Path(path)
        meta = None
        if dtype is None:
            dtype = "uint16"
            if (self.path.parent / META_FILE).exists():
                meta = read_meta(self.path.parent)
                dtype = meta.get("dtype", dtype)
        if not self.path.is_file():
            raise DataError(
                f"token file {self.path} is missing; {remake_hint(self.path.parent, meta)}"
            )
        self.dtype = np.dtype(dtype)
        size = self.path.stat().st_size
        if size % self.dtype.itemsize:
            raise DataError(
                f"token file {self.path} is damaged: {size:,} bytes is not a whole number of "
                f"{self.dtype.name} tokens; {remake_hint(self.path.parent, meta)}"
            )
        if size:
            self.tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        else:  # numpy cannot map an empty file
            self.tokens = np.zeros(0, dtype=self.dtype)
        self.seq_len = seq_len
        self.num_windows = max(0, (len(self.tokens) - 1) // seq_len)

    def __len__(self) -> int:
        return self.num_windows

    def windows(self, indices: np.ndarray | list[int]) -> tuple[Tensor, Tensor]:
        """``(x, y)`` LongTensors ``[len(indices), seq_len]`` for the given window indices."""
        T = self.seq_len
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_windows):
            raise IndexError(f"window index out of range [0, {self.num_windows})")
        rows = np.stack([np.asarray(self.tokens[i * T : i * T + T + 1]) for i in idx])
        rows = torch.from_numpy(rows.astype(np.int64))
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        x, y = self.windows([i])
        return x[0], y[0]


class BatchSampler:
    """Seeded, exactly resumable batches of training windows.

    Each call of :meth:`next_batch` returns ``batch_size`` windows. With ``world_size > 1``
    the ranks split one global batch of ``batch_size · world_size`` windows, rank ``r``
    taking its ``r``-th slice; all ranks must use the same seed.
    """

    def __init__(
        self,
        dataset: TokenDataset,
        batch_size: int,
        seed: int,
        *,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world={world_size}")
        if len(dataset) == 0:
            raise ValueError(
                f"{dataset.path} has {len(dataset.tokens)} tokens: not one window of "
                f"seq_len={dataset.seq_len} (+1 target)"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = int(seed)
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.position = 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            n = len(self.dataset)
            if self.shuffle:
                self._order = np.random.default_rng([self.seed, epoch]).permutation(n)
            else:
                self._order = np.arange(n)
            self._order_epoch = epoch
        assert self._order is not None
        return self._order

    def _take(self, count: int) -> np.ndarray:
        """The next ``count`` window indices in the global order; advances the state."""
        n = len(self.dataset)
        out = []
        while count > 0:
            order = self._epoch_order(self.epoch)
            k = min(count, n - self.position)
            out.append(order[self.position : self.position + k])
            self.position += k
            count -= k
            if self.position == n:
                self.epoch += 1
                self.position = 0
        return np.concatenate(out)

    def next_batch(self) -> tuple[Tensor, Tensor]:
        """``(x, y)`` LongTensors of shape ``[batch_size, seq_len]``."""
        global_idx = self._take(self.batch_size * self.world_size)
        mine = global_idx[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        return self.dataset.windows(mine)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_windows": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the dataset, seed and shuffle must match."""
        for key, mine in (
            ("seed", self.seed),
            ("shuffle", self.shuffle),
            ("num_windows", len(self.dataset)),
        ):
            if state[key] != mine:
                raise ValueError(
                    f"sampler state has {key}={state[key]!r} but this sampler has {mine!r}"
                )
        position = int(state["position"])
        if not 0 <= position < len(self.dataset):
            raise ValueError(f"sampler state position {position} out of range")
        self.epoch = int(state["epoch"])
        self.position = position


def iter_eval_batches(
    dataset: TokenDataset, batch_size: int, max_batches: int | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """A fixed, deterministic set of windows in batches of ``batch_size``.

    Without ``max_batches``: every window, in order. With it: ``m = max_batches ·
    batch_size`` windows (if fewer than all) spread evenly over the file, window
    ``⌊j·n/m⌋`` for ``j < m``, so a small evaluation still samples every part of it. The
    last batch may be smaller; weight batch losses by their size to average per token.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if max_batches is not None and max_batches < 1:
        raise ValueError(f"max_batches must be positive or None, got {max_batches}")
    n = len(dataset)
    total = n if max_batches is None else min(n, max_batches * batch_size)
    indices = (np.arange(total, dtype=np.int64) * n) // max(total, 1)
    for start in range(0, total, batch_size):
        yield dataset.windows(indices[start : start + batch_size])
