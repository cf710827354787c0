"""Figures quoted inside sentences of the architecture, baselines, diagnostics, distributed,
evaluation, gpu and optimizers pages, each a phrase
or a small table rendered from its stored file: :data:`LIBRARY_PHRASES`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

#: The phrases by block key.
LIBRARY_PHRASES: dict[str, Callable[[Path], str]] = {}
