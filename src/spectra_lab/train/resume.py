"""Where a run starts: from scratch in a cleared run directory, or from its latest checkpoint
with a config that keeps what the checkpoint holds.

:func:`check_start` settles, before anything is built, whether the run may start in its
directory at all: one that can be written, a fresh run where no other run (or files of one's
own that a run would delete) is in the way, a resumed run with a checkpoint to go on from and
a config that keeps the fields that checkpoint fixes. :func:`start_or_resume` then clears the
directory or loads the checkpoint, comparing the config with the checkpoint's own first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spectra_lab.runs.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_components,
)
from spectra_lab.runs.layout import clear_run, foreign_run_names, unwritable
from spectra_lab.train.config import ConfigError, TrainConfig, fixed_on_resume, load_saved_config
from spectra_lab.train.runtime import Runtime

#: fields that name a folder: two spellings of one folder are the same setting
PATH_FIELDS = ("out_dir", "data_dir", "dataset")


def check_start(cfg: TrainConfig) -> None:
    """One-line error, before anything is built or written, for a run that cannot start in
    ``cfg.out_dir``: a path that cannot be written; a fresh run in a directory that holds
    checkpoints (without ``overwrite``) or that holds files named like a run's without being
    one; a resumed run without a checkpoint, with fewer ``steps`` than its checkpoint has
    taken, or with a config that changes a field the run keeps (against its ``config.yaml``)."""
    run_dir = Path(cfg.out_dir)
    why = unwritable(run_dir)
    if why is not None:
        raise ConfigError(f"config field 'out_dir' = {cfg.out_dir!r}: {why}; give another --out")
    found = list_checkpoints(run_dir)
    if not cfg.resume:
        if found and not cfg.overwrite:
            raise holds_a_run(run_dir, found[-1][0])
        foreign = foreign_run_names(run_dir)
        if foreign:
            raise ConfigError(
                f"config field 'out_dir' = {cfg.out_dir!r}: {run_dir} holds no run but holds "
                f"{', '.join(foreign)}, which a run there would delete or overwrite; give "
                "another --out (a new directory, or a run's)"
            )
        return
    if not found:
        where = "does not exist" if not run_dir.exists() else f"has no checkpoint in {run_dir}/ckpt"
        raise CheckpointError(
            f"--resume: {run_dir} {where}, so there is nothing to continue; "
            "start the run without --resume"
        )
    step = found[-1][0]
    if cfg.steps < step:
        raise ConfigError(
            f"config field 'steps' = {cfg.steps}: the run in {run_dir} has taken {step} steps "
            f"(its latest checkpoint), and a resumed run goes on from there; give --steps {step} "
            "or more"
        )
    recorded = run_dir / "config.yaml"
    if recorded.is_file():
        check_resumed_config(cfg, load_saved_config(recorded), recorded)


def start_or_resume(
    run_dir: Path, cfg: TrainConfig, rt: Runtime, components: dict[str, Any]
) -> tuple[int, int]:
    """``(step, tokens)`` to start from: the latest checkpoint's with ``resume``, else 0.

    A fresh run refuses a directory holding checkpoints unless ``overwrite``; it starts by
    deleting (rank 0) every file of the run it replaces, before anything new is written. A
    resumed run refuses a config that changes what its checkpoint holds (``lr``, the
    optimizer's settings, the model, the data), which would otherwise be silently ignored;
    the checkpoint's config is compared before any of its state is loaded.
    """
    existing = list_checkpoints(run_dir)
    start = tokens = 0
    if cfg.resume:
        path = latest_checkpoint(run_dir)
        if path is None:
            raise CheckpointError(f"--resume: no checkpoint in {run_dir / 'ckpt'}")
        sequences = cfg.batch_size * cfg.grad_accum * rt.dp_size

        def keeps_config(saved: dict[str, Any]) -> None:
            check_resumed_config(cfg, saved["config"], f"the checkpoint {path}")

        state = load_components(path, components, rt.world_size, sequences, check=keeps_config)
        start, tokens = state["step"], state["tokens"]
    elif existing and not cfg.overwrite:
        raise holds_a_run(run_dir, existing[-1][0])
    elif rt.is_main:
        clear_run(run_dir)
    rt.barrier()  # nobody reads a checkpoint that rank 0 is deleting
    return start, tokens


def holds_a_run(run_dir: Path, step: int) -> CheckpointError:
    return CheckpointError(
        f"{run_dir} already holds a run (checkpoint at step {step}); "
        "use --resume to continue it or --overwrite to start over"
    )


def check_resumed_config(cfg: TrainConfig, saved: dict[str, Any], where: str | Path) -> None:
    """One-line ``ConfigError`` naming every field the run keeps that ``cfg`` changes, with its
    new value and the one ``where`` (the run's ``config.yaml`` or checkpoint) holds."""
    new = cfg.to_dict()
    changed = [
        name
        for name in fixed_on_resume()
        if name in saved and name in new and not same_setting(name, saved[name], new[name])
    ]
    if not changed:
        return
    what = "start a new run (another --out, or --overwrite)"
    if len(changed) == 1:
        name = changed[0]
        raise ConfigError(
            f"config field '{name}' = {new[name]!r} differs from {saved[name]!r} in {where}, "
            f"which a resumed run keeps; resume without changing it, or {what}"
        )
    fields = ", ".join(f"'{name}' = {new[name]!r} (was {saved[name]!r})" for name in changed)
    raise ConfigError(
        f"config fields {fields} differ from {where}, which a resumed run keeps; resume "
        f"without changing them, or {what}"
    )


def same_setting(name: str, before: Any, after: Any) -> bool:
    """Whether two values of field ``name`` say the same: equal, or, for a field of
    :data:`PATH_FIELDS`, two spellings of one folder (``out`` and ``/abs/out`` from the folder
    above it). A ``dataset`` is a name unless both values are folders that exist."""
    if before == after:
        return True
    if name not in PATH_FIELDS or not isinstance(before, str) or not isinstance(after, str):
        return False
    paths = [Path(v).expanduser() for v in (before, after)]
    if name == "dataset" and not all(p.is_dir() for p in paths):
        return False
    return paths[0].resolve() == paths[1].resolve()
