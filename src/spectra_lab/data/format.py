"""On-disk format of a prepared dataset, and the code that writes it.

A prepared dataset is a directory holding

* ``train.bin`` and ``val.bin`` — flat arrays of token ids, ``uint16`` when every id fits
  (vocabulary ≤ 65,536) and ``uint32`` otherwise, in the machine's native byte order;
* ``meta.json`` — what is in them: ``name``, ``tokenizer``, ``vocab_size``, ``dtype``,
  ``train_tokens``, ``val_tokens``, the split (``val_works`` or ``split``), ``source``,
  and the ``request`` that produced them;
* ``tokenizer.json`` for a corpus-trained BPE tokenizer.

Each document is stored as its tokens followed by the end-of-text token, or, for a
tokenizer without one, followed by the encoding of a blank line ``"\\n\\n"``.

Every file is written through :func:`spectra_lab.files.atomic_path` (a temporary name
moved into place with ``os.replace``); ``meta.json`` is removed first and written last, so
a directory whose ``meta.json`` exists always holds a complete dataset.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from spectra_lab.data.errors import DataError
from spectra_lab.data.tokenizers import BPE_FILE, Tokenizer
from spectra_lab.files import atomic_path, atomic_write

__all__ = [
    "FORMAT_VERSION",
    "META_FILE",
    "SPLITS",
    "TokenFileWriter",
    "begin_dataset",
    "dataset_is_complete",
    "document_tokens",
    "read_meta",
    "token_dtype",
    "token_file",
    "write_dataset",
    "write_token_files",
]

FORMAT_VERSION = 1
META_FILE = "meta.json"
SPLITS = ("train", "val")


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` if all ids ``0..vocab_size-1`` fit in 16 bits, else ``uint32``."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def document_tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    """Tokens of one stored document: its encoding plus the document separator."""
    return tokenizer.encode(text) + _separator(tokenizer)


def _separator(tokenizer: Tokenizer) -> list[int]:
    if tokenizer.eot_id is not None:
        return [tokenizer.eot_id]
    return tokenizer.encode("\n\n")


def read_meta(dataset_dir: str | Path) -> dict[str, Any]:
    path = Path(dataset_dir) / META_FILE
    if not path.exists():
        raise DataError(f"{dataset_dir} is not a prepared dataset (no {META_FILE})")
    return json.loads(path.read_text(encoding="utf-8"))


def dataset_is_complete(dataset_dir: str | Path, request: dict[str, Any] | None = None) -> bool:
    """Whether ``dataset_dir`` holds a complete dataset (made by ``request``, if given)."""
    dataset_dir = Path(dataset_dir)
    try:
        meta = read_meta(dataset_dir)
    except (DataError, json.JSONDecodeError):
        return False
    if request is not None and meta.get("request") != request:
        return False
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in SPLITS:
        path = dataset_dir / f"{split}.bin"
        if not path.exists() or path.stat().st_size != meta[f"{split}_tokens"] * itemsize:
            return False
    tok_file = meta.get("tokenizer_file")
    return tok_file is None or (dataset_dir / tok_file).exists()


class TokenFileWriter:
    """Appends token ids of one dtype to an open binary file."""

    def __init__(self, file: BinaryIO, dtype: np.dtype) -> None:
        self.file = file
        self.dtype = np.dtype(dtype)
        self.tokens = 0

    def write(self, ids: Sequence[int] | np.ndarray) -> None:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(self.dtype).max):
            raise ValueError(f"token id out of range for {self.dtype.name}")
        self.file.write(arr.astype(self.dtype).tobytes())
        self.tokens += int(arr.size)


@contextlib.contextmanager
def token_file(path: Path, dtype: np.dtype) -> Iterator[TokenFileWriter]:
    """A writer of the token file ``path``, which appears when the block ends without error."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        yield TokenFileWriter(f, dtype)


def _batched(items: Iterable[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    batch: list[tuple[str, str]] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def write_token_files(
    out_dir: Path,
    labeled_docs: Iterable[tuple[str, str]],
    tokenizer: Tokenizer,
    *,
    token_budget: int | None = None,
    batch_docs: int = 256,
    progress: bool = False,
) -> dict[str, int]:
    """Tokenize ``(split, text)`` pairs into ``train.bin`` and ``val.bin`` under ``out_dir``.

    Documents are kept whole and in order; with a ``token_budget`` writing stops after the
    document that brings the total (train + val) to the budget. Returns the token and
    document counts per split. Does not touch ``meta.json``.
    """
    dtype = token_dtype(tokenizer.vocab_size)
    sep = _separator(tokenizer)
    counts = {"train_tokens": 0, "val_tokens": 0, "train_documents": 0, "val_documents": 0}
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=token_budget, unit="tok", unit_scale=True, desc="tokenizing")
    # The token files are moved into place once every document is written; an error
    # leaves the previous files (if any) as they were.
    with contextlib.ExitStack() as files:
        if bar is not None:
            files.callback(bar.close)
        writers = {s: files.enter_context(token_file(out_dir / f"{s}.bin", dtype)) for s in SPLITS}
        done = False
        for batch in _batched(labeled_docs, batch_docs):
            encoded = tokenizer.encode_batch([text for _, text in batch])
            for (split, _), ids in zip(batch, encoded, strict=True):
                if split not in writers:
                    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
                writers[split].write(ids + sep)
                n = len(ids) + len(sep)
                counts[f"{split}_tokens"] += n
                counts[f"{split}_documents"] += 1
                if bar is not None:
                    bar.update(n)
                if token_budget is not None and (
                    counts["train_tokens"] + counts["val_tokens"] >= token_budget
                ):
                    done = True
                    break
            if done:
                break
    return counts


def begin_dataset(out_dir: str | Path) -> Path:
    """Create ``out_dir`` and remove its ``meta.json``: the dataset is incomplete until
    :func:`write_dataset` finishes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / META_FILE).unlink(missing_ok=True)
    return out_dir


def write_dataset(
    out_dir: Path,
    labeled_docs: Iterable[tuple[str, str]],
    tokenizer: Tokenizer,
    *,
    meta: dict[str, Any],
    token_budget: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Write the token files, then ``meta.json`` (the given fields plus the counts, dtype
    and tokenizer). Call :func:`begin_dataset` before writing anything else (such as a
    tokenizer file) into ``out_dir``. Returns the written metadata."""
    counts = write_token_files(
        out_dir, labeled_docs, tokenizer, token_budget=token_budget, progress=progress
    )
    if counts["train_tokens"] == 0 or counts["val_tokens"] == 0:
        raise DataError(
            f"{meta.get('name', out_dir)}: {counts['train_documents']} training and "
            f"{counts['val_documents']} validation documents; both splits need at least one"
        )
    full = {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "eot_id": tokenizer.eot_id,
        "dtype": token_dtype(tokenizer.vocab_size).name,
        **counts,
        **meta,
    }
    if tokenizer.name == "bpe":
        full["tokenizer_file"] = BPE_FILE
    atomic_write(out_dir / META_FILE, json.dumps(full, indent=2, sort_keys=True) + "\n")
    return full
