"""Figures quoted inside sentences of the operators pages, each a phrase
or a small table rendered from its stored file: :data:`OPERATORS_PHRASES`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

#: The phrases by block key.
OPERATORS_PHRASES: dict[str, Callable[[Path], str]] = {}
