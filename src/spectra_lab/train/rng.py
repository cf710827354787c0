"""The random states of one process, as a checkpoint component."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


class RNGState:
    """This process's Python, NumPy, torch and (on CUDA) device random states."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        state = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),  # noqa: NPY002 (global state used by any legacy caller)
            "torch": torch.get_rng_state(),
        }
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])  # noqa: NPY002
        torch.set_rng_state(state["torch"])
        if "cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)
