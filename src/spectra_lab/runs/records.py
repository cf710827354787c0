"""A run's ``metrics.jsonl``: one JSON record a line (kinds "train", "eval", "monitor")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file, in order (``[]`` when it does not exist)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
