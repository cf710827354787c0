"""Every optimizer the trainer can build, in one registry: ``name -> Recipe``.

A recipe is the optimizer's class, its default keywords (the settings of the paper's
runs; ``TrainConfig.optimizer_kwargs`` overrides them), how the parameter groups are
shaped for it, and the size of its state by the paper's memory table (``spectra bench
memory`` and ``spectra bench plan`` read it). All optimizer construction lives here, so the
rest of the trainer never depends on an optimizer's keyword arguments, and an optimizer is
added by adding its row.

Parameter groups follow the paper's code: decoupled weight decay on the hidden (MLP)
and attention matrices only; none on norms, the token embedding and the output head.
SPECTRA clips the groups listed in ``TrainConfig.clip_groups`` (default: hidden and
attention matrices). The embedding and the head are lookup/readout tables with one
vocabulary-sized dimension: a row of the embedding is only touched by the tokens in
the batch, so its "spectrum" reflects token frequencies rather than a linear map, and
norm gains are vectors, for which a spectral norm is just the Euclidean norm.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

import spectra
from spectra.optim.base import ENGINE_OPTIONS, SpectraOptimizer
from spectra.optim.baselines.dmuon import default_use_muon
from spectra.optim.settings import LAYOUT_KEYS
from spectra.validate import check_choice
from spectra_lab.train.config import ConfigError, TrainConfig, did_you_mean

LRLambda = Callable[[int], float]
Groups = list[dict[str, Any]]

#: groups that get weight decay (the paper's code: hidden and attention matrices)
DECAY_GROUPS = ("hidden", "attn")
#: keywords that have a config field of the same name, which sets them
CONFIG_KEYWORDS = (
    "lr", "weight_decay", "clip_c", "clip_kappa", "clip_scale", "clip_schedule", "pre_clip_c",
    "pre_clip_schedule", "pre_clip_kappa", "pre_clip_beta",
)  # fmt: skip
#: per-group SPECTRA settings without a config field; spectra's optimizers take them
SPECTRA_KEYWORDS = (
    "clip_method", "clip_params", "post", "clip_ns_steps", "clip_ns_dtype", "clip_ratio_bound",
)  # fmt: skip


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


def param_groups(model: nn.Module, cfg: TrainConfig) -> Groups:
    """Split the trainable parameters into the named groups (empty groups dropped).

    Each group dict has ``params``, ``group`` (its name), ``weight_decay`` and
    ``spectral_clip`` (whether SPECTRA clips it); a recipe's group shaper turns the last
    key into the optimizer's own keys. With ``clip_layout="matrices"`` the groups are split
    further by the layout :func:`spectra.matrix_param_groups` finds (an expert stack's
    ``clip_batch_dims``, ...), which the spectral recipes pass on.
    """
    layouts = matrix_layouts(model) if cfg.clip_layout == "matrices" else {}
    buckets: dict[tuple[str, tuple], list[torch.Tensor]] = {}
    for name, p in model.named_parameters():  # tied weights appear once
        if p.requires_grad:
            layout = tuple(layouts.get(id(p), {}).items())
            buckets.setdefault((group_of(name, p), layout), []).append(p)
    mult = mup_lr_multipliers(cfg)
    return [
        {
            "params": params,
            "group": group,
            "weight_decay": cfg.weight_decay if group in DECAY_GROUPS else 0.0,
            "spectral_clip": group in cfg.clip_groups,
            **({"lr": cfg.lr * mult[group]} if group in mult else {}),
            **dict(layout),
        }
        for (group, layout), params in buckets.items()
    ]


def matrix_layouts(model: nn.Module) -> dict[int, dict[str, Any]]:
    """``id(parameter) -> its layout settings`` (``clip_batch_dims``, ``clip_split``,
    ``clip_transposed``) for the parameters that hold several matrices or store them
    ``(in, out)``, as :func:`spectra.matrix_param_groups` finds them."""
    out = {}
    for group in spectra.matrix_param_groups(model):
        for p in group["params"]:
            out[id(p)] = {k: v for k, v in group.items() if k != "params"}
    return {k: v for k, v in out.items() if v}


def mup_lr_multipliers(cfg: TrainConfig) -> dict[str, float]:
    """μP's per-layer learning rates, as multipliers of ``cfg.lr`` per group.

    The hidden and attention matrices take ``lr / m`` with ``m = d_model / mup_base_width``
    (μP for Adam- and sign-type updates, whose entries do not shrink with width); the
    embedding, the head and the norm gains keep ``lr``. Empty for the standard
    parametrization and with ``mup_lr_scaling`` off (the authors' ``mup_llama`` model, run by
    the 1.5B training scripts linked by the paper, keeps one lr for every parameter).
    """
    if cfg.parametrization != "mup" or not cfg.mup_lr_scaling:
        return {}
    from spectra_lab.model import PRESETS

    d_model = cfg.d_model or PRESETS.get(cfg.preset, {}).get("d_model", cfg.mup_base_width)
    return {group: cfg.mup_base_width / d_model for group in DECAY_GROUPS}


# ---------------------------------------------------------------------------------------
# group shapers: (groups, cfg, lr_lambda) -> the optimizer's param groups


def plain_groups(groups: Groups, cfg: TrainConfig, lr_lambda: LRLambda) -> Groups:
    """Groups for an optimizer that knows nothing of SPECTRA."""
    return [
        {k: v for k, v in g.items() if k != "spectral_clip" and k not in LAYOUT_KEYS}
        for g in groups
    ]


def muon_groups(groups: Groups, cfg: TrainConfig, lr_lambda: LRLambda) -> Groups:
    """D-Muon: Muon on the hidden/attention matrices, AdamW on the rest. With pre-clipping
    (``pre_clip_c`` or ``pre_clip_kappa``) the Muon groups carry its settings, which the
    ``spectra.Spectra`` wrapper :func:`build_optimizer` puts around D-Muon reads: SPECTRA's
    pre-clip of the raw gradients before D-Muon's momentum."""
    plain = plain_groups(groups, cfg, lr_lambda)
    pre = pre_clip_settings(cfg) if pre_clips(cfg) else {}
    return [{**g, "use_muon": (muon := g["group"] in DECAY_GROUPS), **(pre if muon else {})}
            for g in plain]  # fmt: skip


def pre_clips(cfg: TrainConfig) -> bool:
    """Whether the run pre-clips raw gradients (a fixed or an adaptive threshold)."""
    return cfg.pre_clip_c is not None or cfg.pre_clip_kappa is not None


def pre_clip_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The pre-clipping keys of a param group, from the config."""
    return {
        "pre_clip_c": cfg.pre_clip_c,
        "pre_clip_schedule": pre_clip_schedule(cfg),
        "pre_clip_kappa": cfg.pre_clip_kappa,
        "pre_clip_beta": cfg.pre_clip_beta,
    }


def clip_schedule(cfg: TrainConfig, lr_lambda: LRLambda) -> Callable[[int], float] | None:
    """``c_k / c``: the paper's "standard" rule over the run's own lr schedule, or constant."""
    if cfg.clip_schedule == "standard":  # c_k = c / lr_lambda(k) during warmup
        return spectra.standard_clip_schedule(lr_lambda, cfg.warmup)
    return None


def pre_clip_schedule(cfg: TrainConfig) -> Callable[[int], float] | None:
    """Constant, or cosine from ``pre_clip_c`` to ``pre_clip_c_final`` over the whole run."""
    if cfg.pre_clip_schedule == "constant" or cfg.pre_clip_c is None:
        return None
    final = cfg.pre_clip_c_final if cfg.pre_clip_c_final is not None else cfg.pre_clip_c / 1000
    return spectra.ClipSchedule(
        "cosine", total_steps=cfg.steps, decay_fraction=1.0, final_ratio=final / cfg.pre_clip_c
    )


def spectral_groups(
    groups: Groups,
    cfg: TrainConfig,
    lr_lambda: LRLambda,
    *,
    clip: bool = True,
    post: str | None = None,
) -> Groups:
    """Groups carrying the SPECTRA keys of ``spectra``'s optimizers.

    With ``clip``, the groups in ``cfg.clip_groups`` get the threshold ``clip_c`` (or the
    relative ``clip_kappa``), the
    scale ``clip_scale``, the threshold schedule, the pre-clipping settings and ``post``
    when given; the optimizer computes the per-step thresholds ``c_k`` itself. Without
    ``clip`` (the plain base optimizers) they get the pre-clipping settings only, so that
    ``pre_clip_c`` (or ``pre_clip_kappa``) gives the paper's "X with pre-clipping" variant.
    Every other group gets
    neither.
    """
    off = {"clip_c": None, "pre_clip_c": None}
    pre = pre_clip_settings(cfg)
    on = {**off, **pre}
    if clip:
        on = {
            "clip_c": cfg.clip_c,
            "clip_kappa": cfg.clip_kappa,
            "clip_scale": cfg.clip_scale,
            "clip_schedule": clip_schedule(cfg, lr_lambda),
            **pre,
            **({"post": post} if post is not None else {}),
        }
    return [
        {**plain, **(on if g["spectral_clip"] else off), **layout_of(g)}
        for g, plain in zip(groups, plain_groups(groups, cfg, lr_lambda), strict=True)
    ]


def layout_of(group: dict[str, Any]) -> dict[str, Any]:
    """The layout settings a group of :func:`param_groups` carries."""
    return {k: group[k] for k in LAYOUT_KEYS if k in group}


# ---------------------------------------------------------------------------------------
# state sizes: the paper's Table memory-optimizer, in elements of a built optimizer


@dataclass(frozen=True)
class StateSize:
    """An optimizer's state by the paper's memory table: the formula in ``words`` (M: the
    parameters' elements) and ``elements``, its value for a built optimizer (the elements of
    the state's tensors after a step, one-element step counters left out)."""

    words: str
    elements: Callable[[torch.optim.Optimizer], int]


def _numel(optimizer: torch.optim.Optimizer, keep: Callable[..., bool] | None = None) -> int:
    """Elements of the optimizer's parameters (those ``keep(group, param)`` accepts)."""
    return sum(
        p.numel() for g in optimizer.param_groups for p in g["params"] if keep is None or keep(g, p)
    )


def _is_matrix(group: dict[str, Any], p: torch.Tensor) -> bool:
    return p.dim() >= 2


def _uses_muon(group: dict[str, Any], p: torch.Tensor) -> bool:
    return default_use_muon(p) if group.get("use_muon") is None else group["use_muon"]


def _soap_elements(optimizer: torch.optim.Optimizer) -> int:
    """m and v, and GG and Q (d × d each) for every dimension d ≤ D of the matrices."""
    preconditioners = sum(
        2 * d * d
        for g in optimizer.param_groups
        for p in g["params"]
        if p.dim() >= 2
        for d in p.shape
        if d <= g["max_precond_dim"]
    )
    return 2 * _numel(optimizer) + preconditioners


STATE_M = StateSize("M", _numel)
STATE_2M = StateSize("2M", lambda opt: 2 * _numel(opt))
STATE_3M = StateSize("3M", lambda opt: 3 * _numel(opt))
#: m and v, and the previous gradient of the matrices
STATE_MARS = StateSize("2M + M_2d", lambda opt: 2 * _numel(opt) + _numel(opt, _is_matrix))
#: m of the Muon matrices, m and v of the AdamW parameters
STATE_DMUON = StateSize("M_muon + 2 M_adamw", lambda opt: 2 * _numel(opt) - _numel(opt, _uses_muon))
STATE_SOAP = StateSize("2M + sum over dims d <= D of 2 d^2", _soap_elements)


# ---------------------------------------------------------------------------------------
# the registry


@dataclass(frozen=True)
class Recipe:
    """How the harness builds one optimizer: class, default keywords, group shaper, and the
    size of its state (``state``; SPECTRA adds none, so ``spectra-X`` has the one of ``X``)."""

    optimizer: Callable[..., torch.optim.Optimizer]
    defaults: dict[str, Any]
    groups: Callable[[Groups, TrainConfig, LRLambda], Groups] = plain_groups
    state: StateSize = field(kw_only=True)

    def keywords(self) -> set[str]:
        """The keywords ``optimizer_kwargs`` may set."""
        params = inspect.signature(self.optimizer).parameters.values()
        named = {p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if any(p.kind is p.VAR_KEYWORD for p in params):  # spectra's per-group settings
            named.update(SPECTRA_KEYWORDS)
        if isinstance(self.optimizer, type) and issubclass(self.optimizer, SpectraOptimizer):
            named.update(ENGINE_OPTIONS)  # how the step runs: nonfinite, chunk_elements, ...
        return named - {"params", *CONFIG_KEYWORDS}


ADAM = {"betas": (0.9, 0.999), "eps": 1e-8}
MOMENTUM = {"momentum": 0.95, "nesterov": True}
ADEMAMIX = {"betas": (0.9, 0.999, 0.999), "alpha": 8.0, "eps": 1e-8}
# MARS keeps its own betas (0.95, 0.99), gamma 0.025 and 1-D AdamW settings, the paper's.
MARS = {"eps": 1e-8}
SGDM = {"momentum": 0.95}  # M <- 0.95 M + 0.05 g

_base = partial(spectral_groups, clip=False)

OPTIMIZERS: dict[str, Recipe] = {
    "adamw": Recipe(spectra.AdamW, ADAM, _base, state=STATE_2M),
    "spectra-adamw": Recipe(spectra.AdamW, ADAM, spectral_groups, state=STATE_2M),
    "adamw-post-orth": Recipe(
        spectra.AdamW, ADAM, partial(spectral_groups, post="orthogonalize"), state=STATE_2M
    ),
    "signum": Recipe(spectra.Signum, MOMENTUM, _base, state=STATE_M),
    "spectra-signum": Recipe(spectra.Signum, MOMENTUM, spectral_groups, state=STATE_M),
    "ademamix": Recipe(spectra.AdEMAMix, ADEMAMIX, _base, state=STATE_3M),
    "spectra-ademamix": Recipe(spectra.AdEMAMix, ADEMAMIX, spectral_groups, state=STATE_3M),
    "mars": Recipe(spectra.MARS, MARS, _base, state=STATE_MARS),
    "spectra-mars": Recipe(spectra.MARS, MARS, spectral_groups, state=STATE_MARS),
    "sgdm": Recipe(spectra.SGDM, SGDM, _base, state=STATE_M),
    "spectra-sgdm": Recipe(spectra.SGDM, SGDM, spectral_groups, state=STATE_M),
    "dmuon": Recipe(spectra.DMuon, MOMENTUM, muon_groups, state=STATE_DMUON),
    "soap": Recipe(spectra.SOAP, ADAM, plain_groups, state=STATE_SOAP),
    # PyTorch's own AdamW: a reference with no code of this project in the step
    "torch-adamw": Recipe(torch.optim.AdamW, ADAM, plain_groups, state=STATE_2M),
}


def check_optimizer(cfg: TrainConfig) -> Recipe:
    """The recipe of ``cfg.optimizer``; a bad name or keyword is a one-line ``ConfigError``."""
    try:
        check_choice("optimizer", cfg.optimizer, OPTIMIZERS)
    except ValueError as exc:
        hint = did_you_mean(cfg.optimizer, OPTIMIZERS)
        raise ConfigError(f"config field 'optimizer' = {cfg.optimizer!r}: {exc}{hint}") from None
    recipe = OPTIMIZERS[cfg.optimizer]
    for key in ("pre_clip_c", "pre_clip_kappa"):
        if getattr(cfg, key) is not None and recipe.groups is plain_groups:
            raise ConfigError(
                f"config field '{key}' = {getattr(cfg, key)!r}: {cfg.optimizer} does not "
                "pre-clip (pre-clipping is part of spectra's AdamW, Signum, AdEMAMix, MARS, "
                "SGDM and D-Muon recipes)"
            )
    post_clips = recipe.groups is spectral_groups or (
        isinstance(recipe.groups, partial) and recipe.groups.keywords.get("clip", True)
    )
    if cfg.clip_kappa is not None and not post_clips:
        raise ConfigError(
            f"config field 'clip_kappa' = {cfg.clip_kappa!r}: {cfg.optimizer} does not "
            "post-clip (a relative threshold is part of the spectra-X recipes)"
        )
    takes = recipe.keywords()
    for key in cfg.optimizer_kwargs:
        if key in CONFIG_KEYWORDS:
            why = f"set the config field '{key}' instead"
        elif key not in takes:
            close = difflib.get_close_matches(key, takes, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            why = f"{cfg.optimizer} takes no keyword '{key}'{hint}"
        else:
            continue
        raise ConfigError(f"config field 'optimizer_kwargs' = {cfg.optimizer_kwargs!r}: {why}")
    return recipe


def build_optimizer(
    model: nn.Module, cfg: TrainConfig, lr_lambda: LRLambda
) -> torch.optim.Optimizer:
    """The optimizer ``cfg.optimizer`` over ``param_groups(model, cfg)``.

    ``lr_lambda`` is the run's LR schedule, the same object ``LambdaLR`` gets: the
    "standard" clipping schedule is defined through it.
    """
    recipe = check_optimizer(cfg)
    groups = recipe.groups(param_groups(model, cfg), cfg, lr_lambda)
    optimizer = recipe.optimizer(groups, lr=cfg.lr, **{**recipe.defaults, **cfg.optimizer_kwargs})
    if recipe.groups is muon_groups and pre_clips(cfg):
        # SPECTRA on top of Muon: the wrapper pre-clips the raw gradients of the Muon groups
        # (their keys) and leaves D-Muon's own step as it is (no post clip)
        optimizer = spectra.Spectra(optimizer, clip_c=None)
    if optimizer.defaults.get("capturable"):
        # a capturable step reads each group's lr live from a tensor on the parameters' device
        for group in optimizer.param_groups:
            device = group["params"][0].device
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
    return optimizer


def clip_threshold(optimizer: torch.optim.Optimizer) -> float | None:
    """``c_k`` of the step about to be taken, or ``None`` (no clipping, or not spectra's)."""
    threshold = getattr(optimizer, "clip_threshold", None)
    return threshold() if threshold is not None else None
