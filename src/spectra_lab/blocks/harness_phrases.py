"""Figures quoted inside sentences of the scale, synthetic and training pages, each a phrase
or a small table rendered from its stored file: :data:`HARNESS_PHRASES`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

#: The phrases by block key.
HARNESS_PHRASES: dict[str, Callable[[Path], str]] = {}
