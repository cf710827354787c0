"""A run's model, loaded from a checkpoint for inference (``sample``, ``eval``, ``export``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spectra_lab.errors import CLIError
from spectra_lab.runs.checkpoint import (
    list_checkpoints,
    load_model_weights,
    read_checkpoint,
    resolve_checkpoint,
)


def load_model(
    ckpt: str | Path, device: str = "cpu", *, option: str = "--ckpt"
) -> tuple[nn.Module, dict[str, Any]]:
    """The model saved in ``ckpt`` (checkpoint or run directory) in eval mode, and the
    checkpoint (for a directory checkpoint: its trainer file, without model and optimizer).

    A damaged checkpoint is a ``CheckpointError`` that names another checkpoint of the run to
    give as ``option`` (the command's argument for it) instead.
    """
    from spectra_lab.model import Llama, ModelConfig

    path = resolve_checkpoint(ckpt, hint=another_checkpoint(Path(ckpt), option))
    state = read_checkpoint(path, map_location="cpu", hint=another_checkpoint(path, option))
    model = Llama(ModelConfig(**state["model_config"]))
    if "model" in state:
        model.load_state_dict(state["model"])
    else:  # the shards of an FSDP2 run, read whole
        load_model_weights(path, model)
    return model.to(device).eval(), state


def another_checkpoint(path: Path, option: str) -> str:
    """What a command that reads the checkpoint ``path`` (``RUN/ckpt/step_N``) can do when it
    is damaged: read the newest other checkpoint of the run instead."""
    if path.parent.name != "ckpt":  # not a checkpoint of a run directory
        return f"give {option} a run directory or one of its checkpoints (RUN/ckpt/step_N.pt)"
    others = [p for _, p in list_checkpoints(path.parent.parent) if p != path]
    if not others:
        return "the run has no other checkpoint to read"
    return f"give another checkpoint of the run as {option}: {others[-1]}"


def check_device(option: str, device: str, *, available: bool = True) -> str:
    """``device`` if it is ``cpu``, ``cuda`` or ``cuda:N`` (and, with ``available``, there is
    such a CUDA device here); a one-line ``CLIError`` naming ``option`` otherwise."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise CLIError(f"{option} must be cpu, cuda or cuda:N, got {device!r}")
    if available and device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device[5:]) if ":" in device else 0
        if index >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise CLIError(
                f"{option} {device}: this machine has {have} (torch {torch.__version__}); "
                f"use {option} cpu"
            )
    return device
