"""Corpora made of many documents: Hugging Face hub datasets and local text/JSONL files.

"Enhancing LLM Training via Spectral Clipping" pretrains on FineWeb-Edu and SlimPajama
with the GPT-2 tokenizer. :func:`prepare_documents` turns any iterable of documents into
the ``.bin`` format of :mod:`spectra_lab.data.format`; the hub and the local readers only
produce such iterables. Hub datasets are streamed through the optional ``datasets``
package (``pip install 'spectra-optim[hub]'``), imported only when needed.

Validation documents are chosen by position: with validation fraction ``f``, document
``i`` (counting from 0 in stream order) is held out when ``⌈(i+1)·f⌉ > ⌈i·f⌉``. That holds
out documents 0, ⌈1/f⌉, … — ``⌈n·f⌉`` of the first ``n``, at least one.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from spectra_lab.data.errors import DataError
from spectra_lab.data.format import begin_dataset, write_dataset
from spectra_lab.data.request import CorpusRequest
from spectra_lab.data.tokenizers import BPE_FILE, get_tokenizer

__all__ = [
    "HUB_DATASETS",
    "hub_source",
    "is_val_document",
    "iter_hub_texts",
    "label_documents",
    "prepare_documents",
    "read_local_texts",
]

# name -> load_dataset arguments and the text column
HUB_DATASETS: dict[str, dict[str, Any]] = {
    "fineweb-edu": {"path": "HuggingFaceFW/fineweb-edu", "config": "sample-10BT", "split": "train"},
    "slimpajama": {"path": "cerebras/SlimPajama-627B", "config": None, "split": "train"},
}
TEXT_FIELD = "text"


def is_val_document(i: int, val_fraction: float) -> bool:
    """Whether document ``i`` is held out: ``⌈(i+1)·f⌉ > ⌈i·f⌉``."""
    return math.ceil((i + 1) * val_fraction) > math.ceil(i * val_fraction)


def label_documents(texts: Iterable[str], val_fraction: float) -> Iterator[tuple[str, str]]:
    """``(split, text)`` for each document, by :func:`is_val_document`."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    return (
        ("val" if is_val_document(i, val_fraction) else "train", text)
        for i, text in enumerate(texts)
    )


def iter_hub_texts(
    path: str, config: str | None = None, split: str = "train", text_field: str = TEXT_FIELD
) -> Iterator[str]:
    """Stream the ``text_field`` of a hub dataset with ``datasets.load_dataset(streaming=True)``.

    The package is imported and the stream opened at the call; records are read lazily.
    """
    try:
        import datasets
    except ImportError as exc:
        raise DataError(
            "hub datasets need the 'datasets' package: pip install 'spectra-optim[hub]'"
        ) from exc

    def unreachable(exc: Exception) -> DataError:
        return DataError(
            f"could not stream {path} from the Hugging Face hub ({type(exc).__name__}: {exc}); "
            "check the network, or train on an already prepared dataset directory (--dataset DIR)"
        )

    try:
        stream = datasets.load_dataset(path, name=config, split=split, streaming=True)
    except Exception as exc:  # the hub client raises many types for network trouble
        raise unreachable(exc) from exc

    def records() -> Iterator[str]:
        try:
            for record in stream:
                if text_field not in record:
                    raise DataError(f"{path} has records without a {text_field!r} field")
                yield record[text_field]
        except DataError:
            raise
        except Exception as exc:
            raise unreachable(exc) from exc

    return records()


def _jsonl_lines(path: Path) -> Iterator[str]:
    """The lines of a ``.jsonl`` file, or of a zstandard-compressed ``.jsonl.zst`` one (the
    format of SlimPajama's shards; needs the ``zstandard`` package)."""
    if path.name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as exc:
            raise DataError(f"{path}: .zst files need the 'zstandard' package") from exc
        import io

        with open(path, "rb") as raw:
            reader = zstandard.ZstdDecompressor().stream_reader(raw)
            yield from io.TextIOWrapper(reader, encoding="utf-8")
        return
    with open(path, encoding="utf-8") as f:
        yield from f


def _parquet_texts(path: Path, text_field: str) -> Iterator[str]:
    """The ``text_field`` column of a parquet file, batch by batch (FineWeb-Edu's shards have
    ``text``, ``id``, ``dump``, ``url``, ``score``, … columns; needs ``pyarrow``)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise DataError(f"{path}: parquet files need the 'pyarrow' package") from exc
    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own error types for a bad file
        raise DataError(f"{path}: not a readable parquet file ({exc})") from exc
    if text_field not in table.schema_arrow.names:
        raise DataError(
            f"{path}: no {text_field!r} column (columns: {', '.join(table.schema_arrow.names)})"
        )
    for batch in table.iter_batches(columns=[text_field]):
        for text in batch.column(0).to_pylist():
            if not isinstance(text, str):
                raise DataError(f"{path}: a {text_field!r} value is not a string")
            yield text


def read_local_texts(paths: Sequence[str | Path], text_field: str = TEXT_FIELD) -> Iterator[str]:
    """Documents from local files, in the given order.

    A ``.parquet`` file gives one document per row (its ``text_field`` column, the format of
    FineWeb-Edu's hub shards); a ``.jsonl`` or ``.jsonl.zst`` file one per non-empty line (its
    ``text_field``, the format of SlimPajama's shards); any other file is read as UTF-8 text
    and is one document.
    """
    for p in paths:
        path = Path(p)
        check_input_file(path)
        try:
            yield from _file_texts(path, text_field)
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{path}: not UTF-8 text (byte {exc.start} of the text is 0x"
                f"{exc.object[exc.start]:02x}); convert it to UTF-8, e.g. with "
                f"`iconv -f latin1 -t utf-8`"
            ) from None


def check_input_file(path: Path) -> None:
    """A one-line ``DataError`` unless ``path`` is a file."""
    if path.is_dir():
        raise DataError(f"input {path} is a folder; give the files in it (e.g. {path}/*.txt)")
    if not path.is_file():
        raise DataError(f"input file {path} does not exist")


def _file_texts(path: Path, text_field: str) -> Iterator[str]:
    """The documents of one input file (see :func:`read_local_texts`)."""
    if path.suffix == ".parquet":
        yield from _parquet_texts(path, text_field)
    elif path.name.endswith((".jsonl", ".jsonl.zst")):
        for lineno, line in enumerate(_jsonl_lines(path), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                text = record[text_field]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise DataError(
                    f"{path}:{lineno}: expected a JSON object with a {text_field!r} string"
                ) from exc
            if not isinstance(text, str):
                raise DataError(f"{path}:{lineno}: {text_field!r} is not a string")
            yield text
    else:
        yield path.read_text(encoding="utf-8")


def prepare_documents(
    out_dir: str | Path,
    texts: Iterable[str],
    request: CorpusRequest,
    *,
    bpe_train_chars: int = 50_000_000,
    progress: bool = False,
) -> Path:
    """Tokenize a stream of documents into a dataset directory; see the module docstring.

    With a token budget (``request.tokens``) the stream is read until about that many
    tokens (whole documents) are written. A ``"bpe"`` tokenizer is trained on the training
    documents among the first ``bpe_train_chars`` characters of the stream (at most five
    characters per budgeted token), which are then written too. ``request.record()`` is
    stored in ``meta.json`` so that an identical later request can be recognised.
    """
    tokenizer, token_budget, val_fraction = request.tokenizer, request.tokens, request.val_fraction
    labeled = label_documents(texts, val_fraction)
    out_dir = begin_dataset(out_dir)
    corpus_texts = None
    if tokenizer == "bpe":
        limit = bpe_train_chars if token_budget is None else min(bpe_train_chars, 5 * token_budget)
        head: list[tuple[str, str]] = []
        chars = 0
        for split, text in labeled:
            head.append((split, text))
            chars += len(text)
            if chars >= limit:
                break
        corpus_texts = [t for s, t in head if s == "train"]
        labeled = itertools.chain(head, labeled)
        (out_dir / BPE_FILE).unlink(missing_ok=True)  # always trained afresh
    if progress and tokenizer == "bpe":
        print(f"prepare-data: training the bpe tokenizer on {len(corpus_texts)} documents",
              file=sys.stderr, flush=True)  # fmt: skip
    tok = get_tokenizer(tokenizer, corpus_texts, request.vocab_size, cache_dir=out_dir)
    meta = {
        "name": request.name,
        "split": {
            "rule": "document i (from 0) is validation when ceil((i+1)*f) > ceil(i*f)",
            "val_fraction": val_fraction,
        },
        "token_budget": token_budget,
        "source": request.source,
        "request": request.record(),
    }
    write_dataset(out_dir, labeled, tok, meta=meta, token_budget=token_budget, progress=progress)
    return out_dir


def hub_source(dataset: str, hub_path: str | None = None, config: str | None = None) -> dict:
    """The ``load_dataset`` arguments for ``dataset`` with optional overrides."""
    if dataset not in HUB_DATASETS:
        raise ValueError(f"unknown hub dataset {dataset!r}; valid: {', '.join(HUB_DATASETS)}")
    spec = dict(HUB_DATASETS[dataset])
    if hub_path is not None:
        spec["path"] = hub_path
        spec["config"] = config
    elif config is not None:
        spec["config"] = config
    spec["text_field"] = TEXT_FIELD
    return spec
