"""SPECTRA's per-group settings: their defaults, their checks, and a parameter's plan for a step.

A param group of any optimizer in ``spectra.optim`` (and of the ``Spectra`` wrapper) carries:

===================== ============ ==========================================================
key                   default      meaning
===================== ============ ==========================================================
``clip_c``            ``10.0``     c, the post operator's threshold; ``None``: no post clip
``clip_kappa``        ``None``     κ of a relative threshold: each matrix ``U_i`` of the
                                   direction is clipped at ``κ·factor(k)·‖U_i‖_F`` (instead
                                   of ``clip_c``; see below)
``clip_scale``        ``"auto"``   α; ``"auto"`` is ``max(1, √(m/n))`` for an (m, n) matrix
``clip_method``       ``"auto"``   the operators' ``method`` (see :mod:`spectra.ops`)
``clip_schedule``     ``None``     ``step → factor`` with ``c_k = c·factor(k)``; ``None``: 1
``clip_params``       ``"matrices"`` ``"all"`` also clips 1-D tensors (the vector rule)
``post``              ``"soft_clip"`` ``"soft_clip"`` (H_c), ``"hard_clip"`` or
                                   ``"orthogonalize"`` (ignores c)
``pre_clip_c``        ``None``     threshold of the soft pre-clip of raw gradients
``pre_clip_schedule`` ``None``     its ``step → factor`` schedule
``pre_clip_kappa``    ``None``     κ of the adaptive pre-clip, ``c_k = κ·factor(k)·m̂_k`` per
                                   matrix (instead of ``pre_clip_c``; see below)
``pre_clip_beta``     ``0.99``     β of its running scale ``m̂_k``
``clip_ns_steps``     ``None``     iterations of an iterative ``clip_method`` (``"paper"``:
                                   the paper's N_s); ``None``: the operator's default
``clip_ns_dtype``     ``None``     its working precision (``torch.bfloat16``, ``float32``,
                                   ``float64`` or their names); ``None``: the operator's
``clip_ratio_bound``  ``None``     with ``capturable=True`` and a ``"polar"`` or ``"mixed"``
                                   soft clip: a bound on σ_max/c that the schedule covers
                                   (fewer steps; see :func:`spectra.ops.soft_clip`)
``clip_batch_dims``   ``0``        leading dimensions that index separate matrices (an
                                   expert stack ``(E, m, n)``: 1)
``clip_split``        ``None``     ``(sizes, dim)``: blocks of a fused tensor along ``dim``,
                                   each its own matrix (``torch.split``'s arguments)
``clip_transposed``   ``False``    the tensors store ``(in, out)`` (HF ``Conv1D``): α reads
                                   ``(out, in)``
===================== ============ ==========================================================

The last three say how a tensor's dimensions map to matrices (:mod:`spectra.optim.layout`);
:func:`spectra.optim.groups.matrix_param_groups` sets them for the usual modules.

**A relative threshold** (``clip_kappa=κ``) clips each matrix of the direction at a multiple
of its own scale, ``c_k = κ·factor(k)·ŝ`` with ``ŝ = ‖U‖_F`` taken at the same step. Since
``H_{κŝ}(U) = ŝ·H_κ(U/ŝ)`` (and ``min(σ, κŝ) = ŝ·min(σ/ŝ, κ)``), the link divides each matrix
by ``ŝ``, clips at ``κ·factor(k)`` and multiplies back. With SGD-M's momentum ``M`` this is a
one-parameter family between SGD-M (κ large: ``H`` leaves ``M`` as it is) and Muon (κ small:
``H_{κŝ}(M) → κŝ·orth(M)``) that keeps the small singular directions small. ``ŝ`` bounds
σ_max, ``σ_max ≤ ŝ ≤ √rank·σ_max``, and is formed for sharded matrices by one all-reduce.

**Adaptive pre-clipping** follows each matrix's own spectral scale (the layer-wise, adaptive
thresholds that "Enhancing LLM Training via Spectral Clipping" leaves as future work): with
``σ̂_j`` the spectral scale of the raw gradient at step j, read off the Gram matrix the clip
forms (:func:`spectra.ops.soft_clip_with_norm`: σ_max for ``eigh``, a bound within
``rank^{1/4}`` of it for ``polar``, ``mixed`` and ``chebyshev``),

    c_k = κ · factor(k) · m_{k−1} / (1 − β^{k−1}),
    m_k = β · m_{k−1} + (1 − β) · min(σ̂_k, c_k),      m_0 = 0,

for the k-th step (1-based) of the matrix. The first step measures σ̂_1 without clipping.
Feeding the running scale the clipped ``min(σ̂_k, c_k)`` keeps one spike from raising the
thresholds after it; a scale that grows for good is followed at up to ``(1 − β)(κ − 1)`` of
itself per step. ``m_k`` is kept per parameter as ``state["pre_clip_ema"]``: a float, or a
list of one per matrix where the group's layout makes the tensor several (experts, blocks).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral
from typing import Any

import torch
from torch import Tensor

from spectra.ops.base import Options
from spectra.ops.methods import check_capturable, method_names, operator
from spectra.ops.polar import check_ratio_bound
from spectra.optim.chain import matrix_shape
from spectra.optim.distributed import holds_whole_matrices, is_sharded
from spectra.optim.layout import MatrixLayout, default_scale
from spectra.optim.plan import POST_KINDS, ParamPlan, SpectralOp
from spectra.validate import check_choice, check_int, check_number

CLIP_PARAMS = ("matrices", "all")
SCHEDULE_KEYS = ("clip_schedule", "pre_clip_schedule")
#: The settings that say how a tensor's dimensions map to matrices (:mod:`spectra.optim.layout`).
LAYOUT_KEYS = ("clip_batch_dims", "clip_split", "clip_transposed")

#: SPECTRA settings every param group carries, with their defaults.
SPECTRA_DEFAULTS: dict[str, Any] = {
    "clip_c": 10.0,
    "clip_kappa": None,
    "clip_scale": "auto",
    "clip_method": "auto",
    "clip_schedule": None,
    "clip_params": "matrices",
    "post": "soft_clip",
    "pre_clip_c": None,
    "pre_clip_schedule": None,
    "pre_clip_kappa": None,
    "pre_clip_beta": 0.99,
    "clip_ns_steps": None,
    "clip_ns_dtype": None,
    "clip_ratio_bound": None,
    "clip_batch_dims": 0,
    "clip_split": None,
    "clip_transposed": False,
}
#: working precisions ``clip_ns_dtype`` may name
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def ns_dtype_of(value: Any) -> torch.dtype | None:
    """``clip_ns_dtype`` as a ``torch.dtype`` (``None`` stays ``None``)."""
    return NS_DTYPES.get(value, value) if isinstance(value, str) else value


def check_spectra_settings(group: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the first bad SPECTRA setting of ``group``."""
    check_number("clip_c", group["clip_c"], low=0.0, low_open=True, none_ok=True)
    check_number("clip_kappa", group["clip_kappa"], low=0.0, low_open=True, none_ok=True)
    check_number("pre_clip_c", group["pre_clip_c"], low=0.0, low_open=True, none_ok=True)
    check_number("pre_clip_kappa", group["pre_clip_kappa"], low=0.0, low_open=True, none_ok=True)
    check_number("pre_clip_beta", group["pre_clip_beta"], low=0.0, high=1.0, high_open=True)
    if group["pre_clip_c"] is not None and group["pre_clip_kappa"] is not None:
        raise ValueError(
            f"pre_clip_c={group['pre_clip_c']!r} and pre_clip_kappa={group['pre_clip_kappa']!r}: "
            "give one (a fixed pre-clip threshold, or κ of the adaptive one)"
        )
    if group["clip_scale"] != "auto":
        check_number("clip_scale ('auto' or a number)", group["clip_scale"], low=0.0, low_open=True)
    check_choice("post", group["post"], POST_KINDS)
    if group["clip_kappa"] is not None and group["post"] == "orthogonalize":
        raise ValueError(
            f"clip_kappa={group['clip_kappa']!r} sets a threshold, which post='orthogonalize' "
            "has none of; use post='soft_clip' or 'hard_clip'"
        )
    check_choice("clip_params", group["clip_params"], CLIP_PARAMS)
    for key in SCHEDULE_KEYS:
        if group[key] is not None and not callable(group[key]):
            raise ValueError(
                f"{key} must be None or a callable step -> factor (for example "
                f"spectra.ClipSchedule or spectra.standard_clip_schedule), got {group[key]!r}"
            )
    check_int("clip_ns_steps", group["clip_ns_steps"], low=0, none_ok=True)
    if ns_dtype_of(group["clip_ns_dtype"]) not in (None, *NS_DTYPES.values()):
        raise ValueError(
            f"clip_ns_dtype must be None, torch.bfloat16, torch.float32 or torch.float64 (or "
            f"their names), got {group['clip_ns_dtype']!r}"
        )
    check_layout_settings(group)
    iteration = group["clip_ns_steps"] is not None or group["clip_ns_dtype"] is not None
    if iteration and group["post"] == "hard_clip":
        raise ValueError("clip_ns_steps and clip_ns_dtype apply to soft_clip and orthogonalize")
    kinds = {group["post"]} | ({"soft_clip"} if pre_clips(group) else set())
    for kind in sorted(kinds):
        if group["clip_method"] not in method_names(kind):
            raise ValueError(
                f"clip_method={group['clip_method']!r} is not valid for post={kind!r}; expected "
                f"one of {', '.join(method_names(kind))}"
            )
        # the method's own check of its settings (e.g. ns_steps for polar_express)
        capturable = bool(group.get("capturable", False))  # "auto" resolves as the step will
        op = operator(kind, group["clip_method"], torch.device("cpu"), torch.float32, capturable)
        try:
            op.check(Options(group["clip_ns_steps"], ns_dtype_of(group["clip_ns_dtype"])))
        except ValueError as err:
            raise ValueError(f"clip_method={group['clip_method']!r}: {err}") from None
    check_ratio_bound_setting(group, kinds)
    if group.get("capturable"):
        check_capturable_settings(group, kinds)


def check_ratio_bound_setting(group: dict[str, Any], kinds: set[str]) -> None:
    """Refuse a ``clip_ratio_bound`` that is not a number ≥ 1, that comes without
    ``capturable=True``, or whose operators take none (``post`` other than ``"soft_clip"``
    without a pre-clip, or a method other than ``"polar"``, ``"mixed"`` or ``"auto"``, which
    under ``capturable`` is one of them)."""
    bound = group["clip_ratio_bound"]
    if bound is None:
        return
    capturable = bool(group.get("capturable", False))
    try:
        check_ratio_bound(Options(capturable=capturable, ratio_bound=bound))
    except ValueError as err:
        raise ValueError(f"clip_{err}") from None
    if kinds != {"soft_clip"} or group["clip_method"] not in ("auto", "polar", "mixed"):
        raise ValueError(
            f"clip_ratio_bound={bound!r} sets the schedule of a capturable soft clip by 'polar' "
            f"or 'mixed'; post={group['post']!r} with clip_method={group['clip_method']!r} "
            "takes none"
        )


def check_capturable_settings(group: dict[str, Any], kinds: set[str]) -> None:
    """Refuse the settings a step without host reads cannot follow: schedules (a Python
    function of the step count, which stays on the device), the adaptive pre-clip (it reads
    each gradient's scale) and methods that need a host read."""
    for key in SCHEDULE_KEYS:
        if group[key] is not None:
            raise ValueError(
                f"capturable=True: {key}={group[key]!r} is a function of the step count, which "
                "stays on the device; give a constant threshold (or step without capturable)"
            )
    if group["pre_clip_kappa"] is not None:
        raise ValueError(
            f"capturable=True: pre_clip_kappa={group['pre_clip_kappa']!r} (the adaptive "
            "pre-clip) reads each gradient's scale on the host; give pre_clip_c instead"
        )
    for kind in sorted(kinds):
        try:
            check_capturable(kind, group["clip_method"])
        except ValueError as err:
            raise ValueError(f"capturable=True: {err}") from None


def check_layout_settings(group: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming a bad ``clip_batch_dims``, ``clip_split`` or
    ``clip_transposed``, or (for a group with ``params``) the first tensor they do not fit."""
    check_int("clip_batch_dims", group["clip_batch_dims"], low=0)
    check_choice("clip_transposed", group["clip_transposed"], (True, False))
    split = group["clip_split"]
    if split is not None:
        pair = isinstance(split, (tuple, list)) and len(split) == 2
        sizes = split[0] if pair else None
        ok = (
            pair
            and isinstance(sizes, (tuple, list))
            and len(sizes) > 0
            and all(_is_int(n) and n >= 1 for n in sizes)
            and _is_int(split[1])
        )
        if not ok:
            raise ValueError(
                "clip_split must be None or (sizes, dim), torch.split's arguments: a non-empty "
                f"sequence of ints >= 1 and a dimension, got {split!r}"
            )
    for i, p in enumerate(group.get("params", ())):
        if not isinstance(p, Tensor):
            continue
        layout = layout_of(group, p, f"parameter {i} of its group")
        several = layout is not None and layout.several
        if group.get("clip_kappa") is not None and several and is_sharded(p):
            if not holds_whole_matrices(p, layout):
                raise ValueError(
                    f"clip_kappa={group['clip_kappa']!r}: parameter {i} of its group is a "
                    f"DTensor of shape {tuple(p.shape)} whose shards cut its several matrices; "
                    "a relative threshold takes each matrix's norm, which needs whole matrices "
                    "or one matrix per tensor"
                )


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def layout_of(group: dict[str, Any], p: Tensor, where: str = "a parameter") -> MatrixLayout | None:
    """The :class:`~spectra.optim.layout.MatrixLayout` of ``p`` under ``group``'s settings;
    ``None`` where ``p`` is one matrix stored ``(out, in)`` as the spectral links see it by
    default (or no matrix). ``ValueError`` when the settings do not fit ``p``'s shape
    (``where`` names it)."""
    k, split = group["clip_batch_dims"], group["clip_split"]
    transposed = group["clip_transposed"]
    if p.dim() < 2 or p.numel() == 0 or not (k or split is not None or transposed):
        return None
    shape = tuple(p.shape)
    settings = f"clip_batch_dims={k!r}, clip_split={split!r}"
    if p.dim() < k + 2:
        raise ValueError(
            f"{settings}: {where} has shape {shape}, not {k} batch dimension(s) and a matrix"
        )
    if split is None:
        return MatrixLayout(k, None, 0, transposed)
    sizes, dim = tuple(int(n) for n in split[0]), int(split[1])
    dim = dim + p.dim() if dim < 0 else dim
    if p.dim() != k + 2 or dim not in (k, k + 1) or sum(sizes) != shape[dim]:
        raise ValueError(
            f"{settings}: {where} has shape {shape}; a split takes {k} batch dimension(s), then "
            f"a matrix, split along one of its two dimensions into sizes summing to its length"
        )
    layout = MatrixLayout(k, sizes, dim, transposed)
    if is_sharded(p) and len(set(layout.scales(shape))) > 1:
        cut = [getattr(pl, "dim", None) for pl in p.placements if not pl.is_replicate()]
        if dim in cut:
            raise ValueError(
                f"{settings}: {where} is a DTensor split along dimension {dim}, the dimension "
                "of blocks whose α differ; shard it along another dimension"
            )
    return layout


def op_of(group: dict[str, Any], kind: str, c: float | None) -> SpectralOp:
    """The operator ``kind`` at threshold ``c`` with the group's method and iteration settings
    (and, under ``capturable``, without host reads)."""
    return SpectralOp(
        kind,
        c,
        group["clip_method"],
        group["clip_ns_steps"],
        ns_dtype_of(group["clip_ns_dtype"]),
        bool(group.get("capturable", False)),
        group["clip_ratio_bound"],
    )


def threshold(c: float | None, schedule: Any, step: int) -> float | None:
    """``c·factor(step)`` (``None`` when ``c`` is; ``inf`` means no clipping at this step)."""
    if c is None:
        return None
    return c * (1.0 if schedule is None else float(schedule(step)))


def pre_clips(group: dict[str, Any]) -> bool:
    """Whether the group pre-clips its matrices' gradients (fixed or adaptive threshold)."""
    return group["pre_clip_c"] is not None or group["pre_clip_kappa"] is not None


def adaptive_pre(group: dict[str, Any], p: Tensor) -> bool:
    """Whether ``p`` of ``group`` has an adaptive pre-clip (and so a ``pre_clip_ema`` state)."""
    return group["pre_clip_kappa"] is not None and (
        matrix_shape(p, group["clip_params"] == "all") is not None
    )


def group_clips(group: dict[str, Any]) -> bool:
    """Whether the group's post operator is on (``orthogonalize``, or a clip with a c or a κ)."""
    return (
        group["post"] == "orthogonalize"
        or group["clip_c"] is not None
        or group["clip_kappa"] is not None
    )


def plan(
    group: dict[str, Any],
    p: Tensor,
    step: int,
    *,
    lr_scale: float = 1.0,
    weight_decay: float | None = None,
    state: dict[str, Any] | None = None,
) -> ParamPlan:
    """The chain's links for parameter ``p`` of ``group`` at its 0-based ``step``.

    ``lr_scale`` and ``weight_decay`` override the group's for this parameter (MARS's 1-D
    rule uses them). ``state`` is ``p``'s optimizer state, which an adaptive pre-clip reads
    its running scale from (and its link updates).
    """
    shape = matrix_shape(p, group["clip_params"] == "all")
    lr = group["lr"]
    if group.get("capturable") and torch.is_tensor(lr):
        # a tensor lr stays on its device: a captured step reads its live value
        lr = lr if lr_scale == 1.0 else lr * lr_scale
    else:
        lr = float(lr) * lr_scale
    wd = float(group.get("weight_decay", 0.0)) if weight_decay is None else weight_decay
    if shape is None:
        return ParamPlan(lr, wd)
    layout = layout_of(group, p)
    if layout is not None:
        shape = layout.shapes(p.shape)[0]
    shard = p if is_sharded(p) else None
    pre = None
    c_pre = threshold(group["pre_clip_c"], group["pre_clip_schedule"], step)
    tracked = None
    pre_cs = None
    if group["pre_clip_kappa"] is not None:
        # (an observer may plan a parameter with no state yet: it has not been measured)
        tracked = state if state is not None and "pre_clip_ema" in state else None
        ms = pre_clip_ema_init(group, p) if tracked is None else tracked["pre_clip_ema"]
        # one running scale per matrix of the tensor (a list where it holds several); c = inf
        # (the first step, or a zero scale so far): the link measures that matrix, clips nothing
        cs = []
        for m in ms if isinstance(ms, list) else [ms]:
            running = running_scale(m, group["pre_clip_beta"], step)
            kappa_scale = group["pre_clip_kappa"] * running
            cs.append(threshold(kappa_scale, group["pre_clip_schedule"], step) if running > 0
                      else math.inf)  # fmt: skip
        finite = [c for c in cs if math.isfinite(c)]
        c_pre = max(finite, default=math.inf)
        pre_cs = tuple(cs) if isinstance(ms, list) else None
        if tracked is not None or finite:
            pre = op_of(group, "soft_clip", c_pre)
    elif c_pre is not None and math.isfinite(c_pre):
        pre = op_of(group, "soft_clip", c_pre)
    track = {"pre_state": tracked, "pre_beta": float(group["pre_clip_beta"]), "pre_cs": pre_cs}
    if not group_clips(group):
        return ParamPlan(lr, wd, shape, pre, shard=shard, **track, layout=layout)
    scale, scales = group["clip_scale"], None
    if scale != "auto":
        scale = float(scale)
    elif layout is None:
        scale = default_scale(shape)
    else:  # α of each block of the split (or of every matrix, which share it)
        scales = tuple(layout.scales(p.shape)[:: max(1, math.prod(p.shape[: layout.batch_dims]))])
        scale = max(scales)
        scales = scales if len(set(scales)) > 1 else None
    relative = group["clip_kappa"] is not None
    c = threshold(group["clip_kappa" if relative else "clip_c"], group["clip_schedule"], step)
    post = None
    if group["post"] == "orthogonalize" or math.isfinite(c):
        post = op_of(group, group["post"], None if group["post"] == "orthogonalize" else c)
    return ParamPlan(lr, wd, shape, pre, post, scale, shard, **track, layout=layout,
                     scales=scales, relative=relative)  # fmt: skip


def pre_clip_ema_init(group: dict[str, Any], p: Tensor) -> float | list[float]:
    """The adaptive pre-clip's running scale before any step: 0, or one 0 per matrix where the
    group's layout makes ``p`` several matrices."""
    layout = layout_of(group, p)
    count = 1 if layout is None else len(layout.shapes(p.shape))
    return [0.0] * count if count > 1 else 0.0


def running_scale(m: float, beta: float, updates: int) -> float:
    """The adaptive pre-clip's bias-corrected scale ``m / (1 − β^updates)`` (0 before any)."""
    return 0.0 if updates == 0 else float(m) / (1.0 - beta**updates)


def clip_threshold(
    groups: Iterable[dict[str, Any]], state: dict[Tensor, Any], step: int | None
) -> float | None:
    """c_k of the first group that clips at a fixed threshold (``None``: none does).

    ``step=None`` means the step about to be taken: the count of steps its parameters have
    taken so far.
    """
    for group in groups:
        if group["post"] == "orthogonalize" or group["clip_c"] is None or group["clip_kappa"]:
            continue
        if step is None and group["clip_schedule"] is None:
            step = 0  # c_k = c: no need to read the counts (on the device under capturable)
        if step is None:
            taken = [int(state[p]["step"]) for p in group["params"] if "step" in state.get(p, {})]
            step = max(taken, default=0)
        return threshold(group["clip_c"], group["clip_schedule"], step)
    return None


def describe_schedules(saved_groups: list[dict[str, Any]]) -> None:
    """In a ``state_dict``'s groups, replace each schedule by its ``repr``.

    A schedule is configuration, like a ``LambdaLR`` lambda: the saved dict stays loadable
    with ``torch.load(weights_only=True)``, and ``load_state_dict`` keeps the schedules the
    optimizer was built with (see :func:`keep_schedules`).
    """
    for g in saved_groups:
        for key in SCHEDULE_KEYS:
            if g.get(key) is not None:
                g[key] = repr(g[key])


def keep_schedules(groups: list[dict[str, Any]], built: list[dict[str, Any]]) -> None:
    """After ``load_state_dict``, put back the schedules the groups were built with."""
    for g, schedules in zip(groups, built, strict=True):
        g.update(schedules)


def schedules_of(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: g.get(key) for key in SCHEDULE_KEYS} for g in groups]
