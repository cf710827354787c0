"""Where a run starts: from scratch in a cleared run directory, or from its latest checkpoint
with a config that keeps what the checkpoint holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spectra_lab.runs.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_components,
)
from spectra_lab.runs.layout import clear_run
from spectra_lab.train.config import ConfigError, TrainConfig, fixed_on_resume
from spectra_lab.train.runtime import Runtime


def start_or_resume(
    run_dir: Path, cfg: TrainConfig, rt: Runtime, components: dict[str, Any]
) -> tuple[int, int]:
    """``(step, tokens)`` to start from: the latest checkpoint's with ``resume``, else 0.

    A fresh run refuses a directory holding checkpoints unless ``overwrite``; it starts by
    deleting (rank 0) every file of the run it replaces, before anything new is written. A
    resumed run refuses a config that changes what its checkpoint holds (``lr``, the
    optimizer's settings, the model, the data), which would otherwise be silently ignored.
    """
    existing = list_checkpoints(run_dir)
    start = tokens = 0
    if cfg.resume:
        path = latest_checkpoint(run_dir)
        if path is None:
            raise CheckpointError(f"--resume: no checkpoint in {run_dir / 'ckpt'}")
        sequences = cfg.batch_size * cfg.grad_accum * rt.dp_size
        state = load_components(path, components, rt.world_size, sequences)
        check_resumed_config(cfg, state["config"], path)
        start, tokens = state["step"], state["tokens"]
    elif existing and not cfg.overwrite:
        raise CheckpointError(
            f"{run_dir} already holds a run (checkpoint at step {existing[-1][0]}); "
            "use --resume to continue it or --overwrite to start over"
        )
    elif rt.is_main:
        clear_run(run_dir)
    rt.barrier()  # nobody reads a checkpoint that rank 0 is deleting
    return start, tokens


def check_resumed_config(cfg: TrainConfig, saved: dict[str, Any], path: Path) -> None:
    """One-line ``ConfigError`` for the first field the checkpoint fixes that ``cfg`` changes."""
    new = cfg.to_dict()
    for name in fixed_on_resume():
        if name in saved and name in new and saved[name] != new[name]:
            raise ConfigError(
                f"config field '{name}' = {new[name]!r} differs from {saved[name]!r} in the "
                f"checkpoint {path}, which a resumed run keeps; resume without changing it, "
                "or start a new run (another --out, or --overwrite)"
            )
