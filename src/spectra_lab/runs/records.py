"""A run's ``metrics.jsonl``: one JSON record a line (kinds "train", "eval", "monitor")."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file, in order (``[]`` when it does not exist)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


#: the largest x whose exp(x) is a finite float64
MAX_LOG_FLOAT = math.log(sys.float_info.max)


def perplexity(loss: float) -> float:
    """``exp(loss)``; ``inf`` where it overflows a float (a diverged run's loss)."""
    return math.exp(loss) if loss < MAX_LOG_FLOAT else math.inf
