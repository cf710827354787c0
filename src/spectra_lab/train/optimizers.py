"""Every optimizer the trainer can build, in one registry: ``name -> builder``.

A builder receives the parameter groups made by :func:`param_groups` and the
:class:`~spectra_lab.train.config.TrainConfig`, and returns a ``torch.optim.Optimizer``.
All optimizer construction lives here so that the rest of the trainer never depends
on an optimizer's keyword arguments.

Parameter groups follow the paper's code: decoupled weight decay on the hidden (MLP)
and attention matrices only; none on norms, the token embedding and the output head.
SPECTRA clips the groups listed in ``TrainConfig.clip_groups`` (default: hidden and
attention matrices). The embedding and the head are lookup/readout tables with one
vocabulary-sized dimension: a row of the embedding is only touched by the tokens in
the batch, so its "spectrum" reflects token frequencies rather than a linear map, and
norm gains are vectors, for which a spectral norm is just the Euclidean norm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from spectra_lab.train.config import TrainConfig

Builder = Callable[[list[dict[str, Any]], TrainConfig], torch.optim.Optimizer]

#: groups that get weight decay (the paper's code: hidden and attention matrices)
DECAY_GROUPS = ("hidden", "attn")


def group_of(name: str, param: torch.Tensor) -> str:
    """Which parameter group a named parameter of ``spectra_lab.model.Llama`` belongs to.

    ``head``: the output projection; ``norm``: vectors (norm gains, biases); ``attn`` and
    ``hidden``: the matrices of the transformer blocks (``layers.*``); ``embed``: every
    other table (the token embedding, any learned position table).
    """
    if name.startswith("lm_head"):
        return "head"
    if param.ndim < 2:
        return "norm"
    if name.startswith("layers."):
        return "attn" if ".attn." in name else "hidden"
    return "embed"


def param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """Split the trainable parameters into the named groups (empty groups dropped).

    Each group dict has ``params``, ``group`` (its name), ``weight_decay`` and
    ``spectral_clip`` (whether SPECTRA clips it); builders turn the last key into the
    optimizer's own keywords.
    """
    buckets: dict[str, list[torch.Tensor]] = {}
    for name, p in model.named_parameters():  # tied weights appear once
        if p.requires_grad:
            buckets.setdefault(group_of(name, p), []).append(p)
    return [
        {
            "params": params,
            "group": group,
            "weight_decay": cfg.weight_decay if group in DECAY_GROUPS else 0.0,
            "spectral_clip": group in cfg.clip_groups,
        }
        for group, params in buckets.items()
    ]


def _plain(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Groups for an optimizer that knows nothing of SPECTRA."""
    return [{k: v for k, v in g.items() if k != "spectral_clip"} for g in groups]


def _pre_clip_schedule(cfg: TrainConfig) -> str | dict[str, Any]:
    if cfg.pre_clip_schedule == "constant":
        return "constant"
    # cosine from pre_clip_c to pre_clip_c_final over the whole run
    final = cfg.pre_clip_c_final if cfg.pre_clip_c_final is not None else cfg.pre_clip_c / 1000
    return {
        "kind": "cosine",
        "total_steps": cfg.steps,
        "decay_fraction": 1.0,
        "final_ratio": final / cfg.pre_clip_c,
    }


def spectral_groups(
    groups: list[dict[str, Any]], cfg: TrainConfig, spectral: bool = True, **extra: Any
) -> list[dict[str, Any]]:
    """Groups carrying the SPECTRA keywords of ``spectra.optim`` optimizers.

    Groups in ``cfg.clip_groups`` get the threshold ``clip_c``, the scale ``clip_scale``,
    the clipping schedule (``clip_schedule`` with the run's ``warmup_steps``, which the
    "standard" schedule needs) and the pre-clipping settings; the optimizer computes the
    per-step thresholds ``c_k`` itself. Every other group, and every group when
    ``spectral=False`` (the plain base optimizers), gets ``clip_c=None``: no clipping.
    """
    out = []
    for g in groups:
        d = {k: v for k, v in g.items() if k != "spectral_clip"}
        if spectral and g["spectral_clip"]:
            d.update(
                clip_c=cfg.clip_c,
                clip_scale=cfg.clip_scale,
                clip_schedule=cfg.clip_schedule,
                warmup_steps=cfg.warmup_steps,
                pre_clip_c=cfg.pre_clip_c,
                pre_clip_schedule=_pre_clip_schedule(cfg),
                **extra,
            )
        else:
            d.update(clip_c=None, pre_clip_c=None)
        out.append(d)
    return out


def current_clip_c(optimizer: torch.optim.Optimizer, step: int) -> float | None:
    """The threshold ``c_k`` the optimizer applies at 0-based ``step`` (first clipped group).

    ``None`` when no group is spectrally clipped. Call it after the LR scheduler has set
    this step's learning rate, since the "standard" schedule depends on it.
    """
    for group in optimizer.param_groups:
        if group.get("clip_c") is not None and group.get("post", "clip") != "orth":
            from spectra.optim.base import post_threshold

            return post_threshold(group, step)
    return None


def _optim(name: str) -> type:
    import spectra.optim

    return getattr(spectra.optim, name)


def _adamw(groups, cfg, spectral=False, **extra):
    return _optim("AdamW")(
        spectral_groups(groups, cfg, spectral, **extra),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        **cfg.optimizer_kwargs,
    )


def _signum(groups, cfg, spectral=False):
    return _optim("Signum")(
        spectral_groups(groups, cfg, spectral),
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=True,
        **cfg.optimizer_kwargs,
    )


def _ademamix(groups, cfg, spectral=False):
    return _optim("AdEMAMix")(
        spectral_groups(groups, cfg, spectral),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2, cfg.beta3),
        alpha=cfg.ademamix_alpha,
        eps=cfg.eps,
        **cfg.optimizer_kwargs,
    )


def _mars(groups, cfg, spectral=False):
    # MARS keeps its own betas (0.95, 0.99), gamma 0.025 and 1-D AdamW settings, the
    # paper's table values; override them through optimizer_kwargs.
    return _optim("MARS")(
        spectral_groups(groups, cfg, spectral), lr=cfg.lr, eps=cfg.eps, **cfg.optimizer_kwargs
    )


def _sgdm(groups, cfg, spectral=False):
    # spectra's SGDM averages M <- (1 - beta) M + beta g: beta is one minus the momentum.
    return _optim("SGDM")(
        spectral_groups(groups, cfg, spectral),
        lr=cfg.lr,
        beta=1.0 - cfg.momentum,
        **cfg.optimizer_kwargs,
    )


def _dmuon(groups, cfg):
    # Muon on the hidden/attention matrices, AdamW on the rest (embeddings, head, norms).
    g = [{**d, "use_muon": d["group"] in DECAY_GROUPS} for d in _plain(groups)]
    return _optim("DMuon")(
        g, lr=cfg.lr, momentum=cfg.momentum, nesterov=True, **cfg.optimizer_kwargs
    )


def _soap(groups, cfg):
    return _optim("SOAP")(
        _plain(groups),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        **cfg.optimizer_kwargs,
    )


def _torch_adamw(groups, cfg):
    """PyTorch's own AdamW: a reference baseline with no SPECTRA code involved."""
    return torch.optim.AdamW(
        _plain(groups),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        **cfg.optimizer_kwargs,
    )


OPTIMIZERS: dict[str, Builder] = {
    "adamw": _adamw,
    "spectra-adamw": lambda g, c: _adamw(g, c, spectral=True),
    "adamw-post-orth": lambda g, c: _adamw(g, c, spectral=True, post="orth"),
    "signum": _signum,
    "spectra-signum": lambda g, c: _signum(g, c, spectral=True),
    "ademamix": _ademamix,
    "spectra-ademamix": lambda g, c: _ademamix(g, c, spectral=True),
    "mars": _mars,
    "spectra-mars": lambda g, c: _mars(g, c, spectral=True),
    "sgdm": _sgdm,
    "spectra-sgdm": lambda g, c: _sgdm(g, c, spectral=True),
    "dmuon": _dmuon,
    "soap": _soap,
    "torch-adamw": _torch_adamw,
}


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` over ``param_groups(model, cfg)``."""
    return OPTIMIZERS[cfg.optimizer](param_groups(model, cfg), cfg)
