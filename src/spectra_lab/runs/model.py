"""A run's model, loaded from a checkpoint for inference (``sample``, ``eval``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from spectra_lab.runs.checkpoint import load_model_weights, read_checkpoint, resolve_checkpoint


def load_model(ckpt: str | Path, device: str = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """The model saved in ``ckpt`` (checkpoint or run directory) in eval mode, and the
    checkpoint (for a directory checkpoint: its trainer file, without model and optimizer)."""
    from spectra_lab.model import Llama, ModelConfig

    path = resolve_checkpoint(ckpt)
    state = read_checkpoint(path, map_location="cpu")
    model = Llama(ModelConfig(**state["model_config"]))
    if "model" in state:
        model.load_state_dict(state["model"])
    else:  # the shards of an FSDP2 run, read whole
        load_model_weights(path, model)
    return model.to(device).eval(), state
