"""Training harness: config, optimizer registry, trainer, checkpoints, metrics."""

from spectra_lab.train.config import TrainConfig
from spectra_lab.train.trainer import TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "train"]
