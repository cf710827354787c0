"""The validation loss of a run's model: its mean token loss over fixed batches, split across
ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from spectra_lab.data import iter_eval_batches
from spectra_lab.train.config import ConfigError, TrainConfig
from spectra_lab.train.runtime import Runtime


@torch.no_grad()
def evaluate(model: nn.Module, val: Any, cfg: TrainConfig, rt: Runtime) -> float:
    """Mean token loss over the fixed validation batches, split across ranks.

    Batches are weighted by their number of sequences (the last may be smaller). A sharded
    (FSDP2) model gathers its weights inside each forward, a collective: a rank with one
    batch fewer than the others runs one more forward, whose loss is not counted.
    """
    batch = cfg.eval_batch_size or cfg.batch_size
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=rt.device)
    batches = iter_eval_batches(val, batch, max_batches=cfg.eval_batches or None)
    count = mine = 0
    for i, (x, y) in enumerate(batches):
        count += 1
        if i % rt.dp_size != rt.dp_rank:
            continue
        x, y = x.to(rt.device), y.to(rt.device)
        with rt.autocast():
            _, loss = model(x, y)
        total[0] += loss.double() * x.shape[0]
        total[1] += x.shape[0]
        mine += 1
    if isinstance(model, FSDPModule) and mine < -(-count // rt.dp_size):
        with rt.autocast():
            model(x.to(rt.device))
    total = rt.mean(total)  # the ratio of the sums is the ratio of the means
    model.train()
    if total[1] == 0:
        raise ConfigError("the validation split yields no batch; lower eval_batch_size")
    return (total[0] / total[1]).item()
