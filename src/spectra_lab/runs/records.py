"""A run's ``metrics.jsonl``: one JSON record a line (kinds "train", "eval", "monitor")."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
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


def perplexity_text(loss: float, decimals: int = 2) -> str:
    """The perplexity of ``loss`` to ``decimals`` places, or in 4 significant digits with an
    exponent past a million (a diverged run's), ``nan`` for a nan loss."""
    ppl = perplexity(loss) if not math.isnan(loss) else math.nan
    return f"{ppl:.{decimals}f}" if abs(ppl) < 1e6 else f"{ppl:.4g}"


#: a loss curve spanning more than this factor (a diverging run) is drawn on a log scale
LOG_SCALE_RATIO = 20.0


def loss_scale(ax: Any, what: str = "loss", skip: Iterable[str] = ()) -> None:
    """A log y-scale for the matplotlib axes ``ax`` when the finite losses drawn (its lines,
    but those whose gid is in ``skip``) span more than :data:`LOG_SCALE_RATIO`; the y label
    then says ``what (nats per token, log scale)``."""
    skip = set(skip)
    drawn = [line.get_ydata() for line in ax.lines if line.get_gid() not in skip]
    ys = [float(y) for values in drawn for y in values if math.isfinite(float(y))]
    if ys and min(ys) > 0 and max(ys) / min(ys) > LOG_SCALE_RATIO:
        ax.set_yscale("log")
        ax.set_ylabel(f"{what} (nats per token, log scale)")
