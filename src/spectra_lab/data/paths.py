"""Where downloads and prepared datasets live by default."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_cache_dir", "default_dataset_dir"]


def default_cache_dir() -> Path:
    """``$SPECTRA_CACHE`` if set, else ``~/.cache/spectra``."""
    env = os.environ.get("SPECTRA_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "spectra"


def default_dataset_dir(
    name: str,
    tokenizer: str = "bpe",
    vocab_size: int = 4096,
    cache_dir: str | Path | None = None,
) -> Path:
    """``<cache>/datasets/<name>-<tokenizer>``, e.g. ``shakespeare-bpe4096``."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    tag = f"bpe{vocab_size}" if tokenizer == "bpe" else tokenizer
    return root / "datasets" / f"{name}-{tag}"
