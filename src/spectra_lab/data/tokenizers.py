"""Tokenizers behind one small interface.

Every tokenizer has ``name``, ``vocab_size``, ``eot_id`` (the end-of-text id, or ``None``),
``encode(str) -> list[int]``, ``encode_batch(list[str]) -> list[list[int]]`` and
``decode(list[int]) -> str``:

* ``"bpe"`` — byte-level BPE (Hugging Face ``tokenizers``) trained on the training split
  of the corpus; saved as ``tokenizer.json`` in the dataset directory, so it works offline.
* ``"gpt2"`` — GPT-2's BPE through ``tiktoken`` (50,257 tokens); tiktoken downloads its
  BPE files on first use and caches them.
* ``"bytes"`` — raw UTF-8 bytes, vocabulary 256, no end-of-text token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from spectra_lab.data.errors import DataError
from spectra_lab.files import atomic_write

__all__ = [
    "BPE_FILE",
    "EOT_TEXT",
    "MIN_BPE_VOCAB",
    "TOKENIZERS",
    "BPETokenizer",
    "ByteTokenizer",
    "GPT2Tokenizer",
    "Tokenizer",
    "get_tokenizer",
]

TOKENIZERS = ("bpe", "gpt2", "bytes")
EOT_TEXT = "<|endoftext|>"
BPE_FILE = "tokenizer.json"
#: the smallest BPE vocabulary: the 256 bytes and the end-of-text token
MIN_BPE_VOCAB = 257


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens. Decoding replaces invalid byte sequences with U+FFFD."""

    name = "bytes"
    vocab_size = 256
    eot_id: int | None = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE from Hugging Face ``tokenizers``; decode(encode(s)) == s for any s."""

    name = "bpe"

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size()
        self.eot_id: int | None = tokenizer.token_to_id(EOT_TEXT)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 4096) -> BPETokenizer:
        """Learn ``vocab_size`` tokens (256 bytes, ``<|endoftext|>``, merges) from ``texts``."""
        if vocab_size < MIN_BPE_VOCAB:
            raise ValueError(
                f"BPE vocab_size must be at least {MIN_BPE_VOCAB} (the 256 bytes and "
                f"{EOT_TEXT}), got {vocab_size}"
            )
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOT_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        """Write the tokenizer JSON atomically."""
        atomic_write(path, self._tok.to_str())

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


_GPT2_URLS = (
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)


def _gpt2_unavailable(exc: Exception) -> DataError:
    names = ", ".join(
        f"{url.rsplit('/', 1)[1]} as {hashlib.sha1(url.encode()).hexdigest()}" for url in _GPT2_URLS
    )
    return DataError(
        "GPT-2 BPE files are unavailable offline "
        f"(tiktoken could not load them: {type(exc).__name__}). Run once with internet access, "
        f"or set TIKTOKEN_CACHE_DIR to a folder holding tiktoken's cached copies ({names}), "
        "or use --tokenizer bpe"
    )


class GPT2Tokenizer:
    """GPT-2's byte-level BPE via ``tiktoken`` (vocabulary 50,257; end-of-text 50,256)."""

    name = "gpt2"

    def __init__(self) -> None:
        try:
            import tiktoken
        except ImportError as exc:
            raise DataError(
                "the gpt2 tokenizer needs tiktoken: pip install 'spectra-optim[train]'"
            ) from exc
        try:
            self._enc = tiktoken.get_encoding("gpt2")
        except Exception as exc:  # network errors surface as many different types
            raise _gpt2_unavailable(exc) from exc
        self.vocab_size: int = self._enc.n_vocab
        self.eot_id: int | None = self._enc.eot_token

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode([int(i) for i in ids], errors="replace")


def get_tokenizer(
    name: str,
    corpus_texts: Iterable[str] | None = None,
    vocab_size: int = 4096,
    cache_dir: str | Path | None = None,
) -> Tokenizer:
    """Build tokenizer ``name`` (one of :data:`TOKENIZERS`).

    For ``"bpe"``: if ``cache_dir`` holds a ``tokenizer.json`` it is loaded; otherwise one is
    trained on ``corpus_texts`` (the training split) with ``vocab_size`` tokens and, when
    ``cache_dir`` is given, saved there. ``vocab_size`` is ignored by the fixed tokenizers.
    """
    if name == "bytes":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    if name == "bpe":
        path = Path(cache_dir) / BPE_FILE if cache_dir is not None else None
        if path is not None and path.exists():
            return BPETokenizer.load(path)
        if corpus_texts is None:
            raise ValueError("training a bpe tokenizer needs corpus_texts (the training split)")
        tok = BPETokenizer.train(corpus_texts, vocab_size)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tok.save(path)
        return tok
    raise ValueError(f"unknown tokenizer {name!r}; valid tokenizers: {', '.join(TOKENIZERS)}")
