"""A sweep's grid file: which runs it holds, their names, and where each one stands.

A grid file (YAML) has four keys, all optional but one of ``grid``/``cases``::

    base:              # config fields every run shares
      preset: cpu-small
      steps: 200
    cases:             # runs that are not a product: each is crossed with the grid
      - {optimizer: adamw}
      - {optimizer: spectra-adamw}
    grid:              # a list per field; the runs are the cartesian product
      lr: [1.0e-3, 2.0e-3, 4.0e-3]
    seeds: [0, 1, 2]   # default: the base seed only

The runs are ``cases × product(grid) × seeds``. A run's name lists its case and grid values
and its seed (``optimizer=adamw,lr=0.002,seed=1``), and its directory is
``OUT/runs/<name>``. Every run's configuration is checked when the file is read, so a bad
field or value is reported in one line before anything trains.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectra_lab.errors import UserError
from spectra_lab.runs.checkpoint import latest_checkpoint
from spectra_lab.train.config import (
    ConfigError,
    TrainConfig,
    build_config,
    read_config_file,
)
from spectra_lab.train.resume import same_setting

KEYS = ("base", "cases", "grid", "seeds")


class SweepError(UserError):
    """A bad grid file, reported as one line."""


@dataclass(frozen=True)
class Run:
    """One run of a sweep: its varying fields (``point``), its seed and its configuration."""

    name: str
    point: dict[str, Any]  # case and grid values, without the seed
    seed: int
    config: TrainConfig = field(compare=False)

    @property
    def group(self) -> str:
        """The name without the seed: runs that differ only in seed share it."""
        return label(self.point)


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format(v) for v in value) + "]"
    if isinstance(value, dict):
        return "+".join(f"{k}-{_format(v)}" for k, v in value.items())
    return str(value)


def label(point: dict[str, Any]) -> str:
    """``key=value,…`` in the point's order; a safe directory name."""
    text = ",".join(f"{k}={_format(v)}" for k, v in point.items()) or "base"
    return re.sub(r"[^A-Za-z0-9=,.+\-_\[\]]", "_", text)


def read_grid(path: str | Path, out: str | Path) -> list[Run]:
    """Every run of the grid file at ``path``, configured to write under ``out/runs``."""
    data = read_config_file(path)
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise SweepError(f"{path}: unknown key {unknown[0]!r}; a grid file has {', '.join(KEYS)}")
    base = data.get("base") or {}
    cases = data.get("cases") or [{}]
    grid = data.get("grid") or {}
    if not isinstance(base, dict):
        raise SweepError(f"{path}: 'base' must be a mapping of config fields")
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise SweepError(f"{path}: 'cases' must be a list of mappings of config fields")
    if not isinstance(grid, dict):
        raise SweepError(f"{path}: 'grid' must map config fields to lists of values")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{path}: grid field {key!r} must be a non-empty list")
    if "seed" in grid or any("seed" in c for c in cases):
        raise SweepError(f"{path}: give seeds under 'seeds', not as a grid or case field")
    seeds = data.get("seeds")
    if seeds is None:
        seeds = [base.get("seed", TrainConfig.seed)]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise SweepError(f"{path}: 'seeds' must be a non-empty list of integers")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"{path}: 'seeds' repeats a seed")

    runs: list[Run] = []
    keys = list(grid)
    for case in cases:
        for values in itertools.product(*(grid[k] for k in keys)):
            point = {**case, **dict(zip(keys, values, strict=True))}
            for seed in seeds:
                name = label({**point, "seed": seed})
                out_dir = Path(out) / "runs" / name
                try:
                    cfg = build_config(
                        (f"{path} base", base),
                        (f"{path} run {name}", point),
                        ("the sweep", {"seed": seed, "out_dir": str(out_dir)}),
                    )
                except ConfigError as exc:
                    raise SweepError(str(exc)) from None
                runs.append(Run(name, point, seed, cfg))
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise SweepError(f"{path}: two runs share the name {dup!r} (a case repeats)")
    return runs


#: Fields that say how a run is started or shown, not what it trains.
NOT_COMPARED = {"resume", "overwrite", "progress", "plot"}


def check_unchanged(run: Run) -> None:
    """Refuse a run directory whose saved config differs from the grid's for that run
    (folders compared as folders: ``out`` and ``/abs/out`` are one).

    A finished or half-done run trained with other settings (a changed ``base``, say) would
    otherwise be skipped or resumed as if it were this one.
    """
    saved_path = Path(run.config.out_dir) / "config.yaml"
    if not saved_path.is_file():
        return
    from spectra_lab.train.config import load_saved_config

    saved = load_saved_config(saved_path)
    # the trainer saves the warmup and the accumulation it resolved (one process here)
    wanted = {
        **run.config.to_dict(),
        "warmup_steps": run.config.warmup,
        "grad_accum": run.config.accumulation(1),
    }
    # a field the saved config lacks is newer than the run, which had its default
    defaults = TrainConfig().to_dict()
    for key in sorted(set(saved) | set(wanted)):
        if key in NOT_COMPARED:
            continue
        before = saved[key] if key in saved else defaults.get(key)
        if not same_setting(key, before, wanted.get(key)):
            raise SweepError(
                f"{run.config.out_dir} was trained with {key} = {before!r}, the grid "
                f"now says {wanted.get(key)!r}; use another --out or delete that run"
            )


def summary(run: Run) -> dict[str, Any] | None:
    """The run's ``summary.json`` when it records the full step count (a finished run)."""
    path = Path(run.config.out_dir) / "summary.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:  # written atomically, so only a foreign file can be unreadable
        return None
    return data if data.get("step") == run.config.steps else None


def status(run: Run) -> str:
    """``done`` (its summary is there for the full step count), ``partial`` (a checkpoint to
    resume from) or ``new``."""
    if summary(run) is not None:
        return "done"
    return "partial" if latest_checkpoint(Path(run.config.out_dir)) is not None else "new"
