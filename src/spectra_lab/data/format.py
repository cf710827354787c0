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

Reading one back goes through :func:`check_dataset` (the files are there, whole, and the
tokenizer file reads back) and :func:`load_tokenizer`: a missing or damaged file is a
one-line ``DataError`` naming it and the ``spectra prepare-data`` command that writes the
dataset again (:func:`remake_hint`).

Every file is written through :func:`spectra_lab.files.atomic_path` (a temporary name
moved into place with ``os.replace``); ``meta.json`` is removed first and written last, so
a directory whose ``meta.json`` exists always holds a complete dataset.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from spectra_lab.data.errors import DataError
from spectra_lab.data.tokenizers import BPE_FILE, TOKENIZERS, BPETokenizer, Tokenizer, get_tokenizer
from spectra_lab.files import atomic_path, atomic_write

__all__ = [
    "FORMAT_VERSION",
    "META_FILE",
    "SPLITS",
    "TokenFileWriter",
    "begin_dataset",
    "check_dataset",
    "dataset_is_complete",
    "document_tokens",
    "load_tokenizer",
    "read_meta",
    "remake_hint",
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
    """The ``meta.json`` of a prepared dataset; a one-line ``DataError`` naming what is wrong
    (no such folder, no ``meta.json``, or one that is not a JSON object) otherwise."""
    dataset_dir = Path(dataset_dir)
    path = dataset_dir / META_FILE
    if not dataset_dir.is_dir():
        raise DataError(f"dataset {dataset_dir} does not exist; {remake_hint(dataset_dir)}")
    if not path.exists():
        raise DataError(
            f"{dataset_dir} is not a prepared dataset (no {META_FILE}); {remake_hint(dataset_dir)}"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} is damaged ({exc}); {remake_hint(dataset_dir)}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{path} is damaged (not a JSON object); {remake_hint(dataset_dir)}")
    return meta


def remake_hint(dataset_dir: str | Path, meta: dict[str, Any] | None = None) -> str:
    """What to run to write the dataset in ``dataset_dir`` again: the ``spectra prepare-data``
    command of the request recorded in ``meta`` (as far as its options go)."""
    request = (meta or {}).get("request")
    words = ["spectra prepare-data"]
    if isinstance(request, dict) and request.get("name"):
        words.append(f"--dataset {request['name']}")
        if request.get("tokenizer"):
            words.append(f"--tokenizer {request['tokenizer']}")
        if request.get("tokenizer") == "bpe" and request.get("vocab_size"):
            words.append(f"--vocab-size {request['vocab_size']}")
        files = (request.get("source") or {}).get("files") or []
        if files:
            paths = [shlex.quote(str(f.get("path"))) for f in files]
            words.append("--input " + (" ".join(paths) if len(paths) <= 3 else "FILE ..."))
        if request.get("tokens") is not None:
            words.append(f"--tokens {request['tokens']}")
    words += [f"--out {shlex.quote(str(dataset_dir))}", "--force"]
    return f"prepare it again: {' '.join(words)}"


def load_tokenizer(dataset_dir: str | Path) -> Tokenizer:
    """The tokenizer a prepared dataset was written with (from its ``meta.json``); a missing,
    damaged or foreign ``tokenizer.json`` is a one-line ``DataError`` naming the file."""
    dataset_dir = Path(dataset_dir)
    meta = read_meta(dataset_dir)
    name = meta.get("tokenizer")
    if name == "bpe":
        path = dataset_dir / meta.get("tokenizer_file", BPE_FILE)
        if not path.is_file():
            raise DataError(f"{path} is missing; {remake_hint(dataset_dir, meta)}")
        try:
            tokenizer = BPETokenizer.load(path)
        except Exception as exc:  # the tokenizers library raises a bare Exception
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DataError(
                f"{path} is damaged ({reason}); {remake_hint(dataset_dir, meta)}"
            ) from None
        if tokenizer.vocab_size != meta.get("vocab_size"):
            raise DataError(
                f"{path} has {tokenizer.vocab_size} tokens but {dataset_dir / META_FILE} says "
                f"{meta.get('vocab_size')}: it is another dataset's tokenizer; "
                f"{remake_hint(dataset_dir, meta)}"
            )
        return tokenizer
    if name in TOKENIZERS:
        return get_tokenizer(name)
    raise DataError(
        f"{dataset_dir / META_FILE} names an unknown tokenizer {name!r}; "
        f"{remake_hint(dataset_dir, meta)}"
    )


def check_dataset(dataset_dir: str | Path) -> dict[str, Any]:
    """The ``meta.json`` of the prepared dataset in ``dataset_dir`` once its files are checked:
    the token files are there, whole tokens long, with the counts it records (where it
    records them), and a ``bpe`` tokenizer file reads back. Anything missing or damaged is a
    one-line ``DataError`` naming the file and the command that writes it again. The fixed
    tokenizers (``gpt2``, ``bytes``) are not loaded: training does not need them (and
    ``gpt2``'s may be a download)."""
    dataset_dir = Path(dataset_dir)
    meta = read_meta(dataset_dir)
    again = remake_hint(dataset_dir, meta)
    try:
        if not isinstance(meta.get("vocab_size"), int):
            raise TypeError("vocab_size")
        dtype = np.dtype(meta.get("dtype", "uint16"))
        if any(not isinstance(meta.get(f"{s}_tokens", 0), int) for s in SPLITS):
            raise TypeError("token counts")
    except TypeError as exc:
        raise DataError(f"{dataset_dir / META_FILE} is damaged (its {exc}); {again}") from None
    for split in SPLITS:
        path = dataset_dir / f"{split}.bin"
        if not path.is_file():
            raise DataError(f"{path} is missing; {again}")
        size, tokens = path.stat().st_size, meta.get(f"{split}_tokens")
        if size % dtype.itemsize or (tokens is not None and size != tokens * dtype.itemsize):
            counted = f"{tokens:,} {dtype.name} tokens" if tokens is not None else "tokens"
            raise DataError(
                f"{path} is damaged: {size:,} bytes where {META_FILE} counts {counted} "
                f"({dtype.itemsize} bytes each); {again}"
            )
    if meta.get("tokenizer") == "bpe":
        load_tokenizer(dataset_dir)
    return meta


def dataset_is_complete(dataset_dir: str | Path, request: dict[str, Any] | None = None) -> bool:
    """Whether ``dataset_dir`` holds a complete, undamaged dataset (made by ``request``, if
    given)."""
    dataset_dir = Path(dataset_dir)
    try:
        meta = read_meta(dataset_dir)
        if request is not None and meta.get("request") != request:
            return False
        check_dataset(dataset_dir)
    except DataError:
        return False
    return True


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
        more = "more documents (a plain text file is one document, a .jsonl file one a line)"
        if (
            token_budget is not None
            and counts["train_tokens"] + counts["val_tokens"] >= token_budget
        ):
            more = f"a larger token budget than {token_budget:,} (--tokens)"
        raise DataError(
            f"{meta.get('name', out_dir)}: {counts['train_documents']} training and "
            f"{counts['val_documents']} validation documents; both splits need at least one: "
            f"give {more}"
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
