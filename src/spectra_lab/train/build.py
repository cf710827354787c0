"""What a training run is built from: its prepared dataset, its model, its data and its monitor.

:func:`prepared_dataset` is the run's one call into ``spectra_lab.data`` that may prepare a
corpus. :func:`model_config_of` and :func:`build_model` give the model of a config as
``spectra train`` builds it; the benchmarks, the μP check and the analyses build theirs
through them too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from spectra import SpectralMonitor
from spectra.validate import check_choice
from spectra_lab.data import TOKENIZERS, BatchSampler, TokenDataset, training_dataset
from spectra_lab.model import Llama, ModelConfig, model_config
from spectra_lab.train.config import ConfigError, TrainConfig
from spectra_lab.train.optimizers import group_of
from spectra_lab.train.runtime import Runtime


def prepared_dataset(cfg: TrainConfig, rt: Runtime) -> Path:
    """The run's prepared dataset directory (see ``spectra_lab.data.training_dataset``):
    rank 0 finds it, or prepares a named corpus once, and tells the other ranks."""
    path = None
    try:
        check_choice("tokenizer", cfg.tokenizer, choices=TOKENIZERS)
    except ValueError as exc:
        raise ConfigError(f"config field 'tokenizer' = {cfg.tokenizer!r}: {exc}") from None
    if rt.is_main:
        try:
            path = str(
                training_dataset(
                    cfg.dataset, cfg.tokenizer, cfg.vocab_size, cfg.data_dir, cfg.progress
                )
            )
        except ValueError as exc:  # unknown dataset or tokenizer
            raise ConfigError(f"config field 'dataset' = {cfg.dataset!r}: {exc}") from None
    return Path(rt.broadcast(path))


def model_config_of(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    """The ``ModelConfig`` of ``cfg``: its preset with the shape and μP fields it changes; a
    shape that does not work is a one-line ``ConfigError`` naming the field."""
    overrides = cfg.model_overrides()
    try:
        return model_config(cfg.preset, vocab_size, vocab_multiple=cfg.vocab_multiple, **overrides)
    except ValueError as exc:
        msg = str(exc)
        named = [k for k in overrides if k in msg and getattr(cfg, k, None) is not None]
        field_ = "mup_base_width" if "mup_base_width" in msg else (named[0] if named else "preset")
        raise ConfigError(f"config field '{field_}' = {getattr(cfg, field_)!r}: {msg}") from None


def build_model(cfg: TrainConfig, vocab_size: int) -> tuple[Llama, ModelConfig]:
    """The Llama of preset ``cfg.preset`` and its config (same initial weights on every rank)."""
    model_cfg = model_config_of(cfg, vocab_size)
    torch.manual_seed(cfg.seed)
    return Llama(model_cfg), model_cfg


def build_data(cfg: TrainConfig, rt: Runtime, dataset_dir: Path, seq_len: int) -> tuple[Any, Any]:
    """The training batch sampler and the validation split (``BatchSampler``, ``TokenDataset``).

    One global batch of ``batch_size * dp_size`` windows per micro-step; data-parallel rank r
    takes the r-th slice, so data-parallel ranks see disjoint data (the ranks of one
    tensor-parallel group the same).
    """
    train_split = TokenDataset(dataset_dir / "train.bin", seq_len)
    val = TokenDataset(dataset_dir / "val.bin", seq_len)
    sampler = BatchSampler(
        train_split, cfg.batch_size, seed=cfg.seed, rank=rt.dp_rank, world_size=rt.dp_size
    )
    return sampler, val


def build_monitor(
    cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer, start: int
) -> SpectralMonitor | None:
    """The run's ``SpectralMonitor`` (``None`` when ``monitor_every`` is 0).

    It watches every matrix of ``monitor_groups`` (default: all weight matrices, so that its
    ``sum_weight_*`` are the paper's aggregated weight norms) and counts steps from ``start``,
    so a resumed run records at the same steps, and the same values, as an uninterrupted one.
    Every rank runs it (under FSDP2 it gathers each matrix, a collective); rank 0 logs it.
    """
    if not cfg.monitor_every:
        return None
    watched = [
        (name, p)
        for name, p in model.named_parameters()
        if p.requires_grad and p.dim() >= 2 and group_of(name, p) in cfg.monitor_groups
    ]
    monitor = SpectralMonitor(
        model, optimizer, params=watched, every=cfg.monitor_every, seed=cfg.seed
    )
    monitor.step_count = start
    return monitor
