r"""The SPECTRA step as one chain of named links: the functional core of every optimizer here.

One step of Algorithm SPECTRA of "Enhancing LLM Training via Spectral Clipping", for each
parameter ``X`` with gradient ``g``:

====================  =========================================  ==========================
link                  math                                       function
====================  =========================================  ==========================
pre-clip              ``g̃ = H_{c_pre}(g)`` (matrices; optional)  :func:`pre_clip`
base direction        ``U = direction(g̃)`` (AdamW, Signum, …)    the caller's ``direction``
post operator         ``U ← post(U)``: ``H_{c_k}``, ``clip^sp_{c_k}``  :func:`post_operator_`
                      or ``orth`` (optional)
weight decay          ``X ← (1 − λη) X``                         :func:`decay_weights_`
learning rate         ``X ← X − αη · U``                          :func:`add_update_`
====================  =========================================  ==========================

:func:`spectra_step` composes them. It is used by the native optimizers
(:class:`~spectra.optim.base.SpectraOptimizer`), by the :class:`~spectra.optim.Spectra` wrapper
(whose direction is the wrapped optimizer's) and by the synthetic experiments. Each
parameter's scalars for the step (η, λ, α, the operators with their ``c_k``) come in a
:class:`~spectra.optim.plan.ParamPlan`; the chain itself knows nothing of param groups or schedules.

By default the directions of every parameter are formed before any parameter changes, so
that a non-finite direction stops the step with the weights untouched; that costs one
parameter-sized buffer, the same transient as ``torch.optim.AdamW(foreach=True)``. With
``chunk_elements`` the chain runs chunk by chunk instead, for a transient of one chunk.
Same-shaped matrices go through each spectral operator together
(:func:`spectra.ops.batched_apply_`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from spectra.ops import batched_apply_all_, soft_clip_with_norm
from spectra.ops.batched import BATCH_FRACTION, consecutive_runs
from spectra.optim.distributed import (
    apply_sharded,
    frobenius_norms,
    holds_whole_matrices,
    mesh_group,
)
from spectra.optim.plan import ParamPlan, SpectralOp
from spectra.optim.replicated import all_agree_finite, apply_replicated

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

#: ``direction(idx, grads) -> updates``: the base optimizer's link. For the parameters at
#: positions ``idx`` it receives their (pre-clipped) gradients and returns one fresh tensor per
#: parameter, which the chain overwrites.
Direction = Callable[[list[int], list[Tensor]], list[Tensor]]

#: Devices where :func:`finite_flag` checks tensor by tensor (``aminmax``) rather than with one
#: multi-tensor max-norm: on the CPU the first is about five times faster (1.1 against 6.0 ms
#: at the main job's shapes, two threads); on a GPU the second launches one kernel where the
#: first launches one a tensor, and stacks their results (some 340 operations at the 124M
#: shapes).
PER_TENSOR_CHECK_DEVICES = ("cpu",)

#: The threshold at which an adaptive pre-clip's measuring step forms its Gram matrix: so large
#: that the clip's scale is σ̂_max itself for any float64 gradient (its result is not used).
MEASURE_C = 1e150


# --------------------------------------------------------------------------- the links


def _apply_ops(
    tensors: Sequence[Tensor],
    plans: Sequence[ParamPlan],
    ops: Sequence[SpectralOp | None],
    batch_elements: int | None,
    group: ProcessGroup | None,
    finite: Tensor | None = None,
) -> bool:
    """``t ← op(t)`` in place on each parameter's matrix view.

    Local matrices go through one :func:`batched_apply_all_` for all operators (off the CPU:
    one host read for all of them, ``finite`` included; False, with nothing changed, when
    ``finite`` holds False); with a ``group`` their work is divided among its ranks; shards of
    ``DTensor`` parameters are assembled into whole matrices one at a time
    (:mod:`spectra.optim.distributed`).
    """
    whole: list[tuple[SpectralOp, Tensor]] = []
    sharded, layouts = [], []
    for t, pl, op in zip(tensors, plans, ops, strict=True):
        if op is None or pl.shape is None:
            continue
        if pl.shard is not None and not holds_whole_matrices(pl.shard, pl.layout):
            sharded.append((op, t, pl.shard, pl.shape))
            layouts.append(pl.layout)
        else:
            whole += [(op, X) for X in pl.matrices(t)]

    def apply_local(
        items: Sequence[tuple[SpectralOp, Tensor]],
        total: int | None = None,
        finite: Tensor | None = None,
    ) -> bool:
        by_op: dict[SpectralOp, list[Tensor]] = {}
        for op, X in items:
            by_op.setdefault(op, []).append(X)
        jobs = list(by_op.items())
        return batched_apply_all_(jobs, max_elements=batch_elements, finite=finite, total=total)

    if group is None:
        if not apply_local(whole, finite=finite):
            return False
    else:
        apply_replicated(whole, group, apply_local, batch_elements)
    apply_sharded(sharded, layouts)
    return True


def pre_clip(
    grads: list[Tensor],
    plans: Sequence[ParamPlan],
    batch_elements: int | None = None,
    group: ProcessGroup | None = None,
) -> list[Tensor]:
    """``g̃ = pre(g)`` for the parameters with a pre operator (copies; ``grads`` are not
    modified), ``g`` for the others.

    An adaptive pre-clip (``pre_state``) also measures each gradient's spectral scale σ̂ and
    updates its running scale, ``m ← β·m + (1 − β)·min(σ̂, c)``; its matrices are clipped
    on every rank of a ``group`` (their gradients are the same there), and it reads the device
    once per call."""
    idx = [i for i, pl in enumerate(plans) if pl.pre is not None and pl.shape is not None]
    if not idx:
        return grads
    out = list(grads)
    for i in idx:
        if math.isfinite(plans[i].pre.c):
            out[i] = grads[i].clone(memory_format=torch.contiguous_format)
    tracked = [i for i in idx if plans[i].pre_state is not None]
    fixed = [None if pl.pre_state is not None else pl.pre for pl in plans]
    _apply_ops(out, plans, fixed, batch_elements, group)
    if tracked:
        _adaptive_pre_clip([out[i] for i in tracked], [plans[i] for i in tracked])
    return out


def _adaptive_pre_clip(grads: list[Tensor], plans: list[ParamPlan]) -> None:
    """The adaptive pre-clip of :func:`pre_clip`: clip in place (where ``c`` is finite) with
    :func:`spectra.ops.soft_clip_with_norm`, one call per batch of same-shaped matrices with the
    same operator, and update each running scale (one per matrix, where a layout makes the
    tensor several: ``ParamPlan.pre_cs``) from the σ̂ read in one host read."""
    batches: dict[tuple, list[tuple[int, int, Tensor]]] = {}
    for j, (g, pl) in enumerate(zip(grads, plans, strict=True)):
        mats = pl.matrices(g)
        cs = pl.pre_cs if pl.pre_cs is not None else (pl.pre.c,) * len(mats)
        for i, (X, c) in enumerate(zip(mats, cs, strict=True)):
            op = pl.pre if pl.pre_cs is None else pl.pre._replace(c=c)
            key = (op, tuple(X.shape), X.dtype, X.device)
            batches.setdefault(key, []).append((j, i, X))
    norms: list[Tensor] = []
    order: list[tuple[int, int, float]] = []
    for (op, _, _, _), items in batches.items():
        mats = [X for _, _, X in items]
        # c = inf only measures: the scale of H_c for a huge c is σ̂ itself, the result is unused
        c = op.c if math.isfinite(op.c) else MEASURE_C
        Y, sigma = soft_clip_with_norm(torch.stack(mats), c, method=op.method, **op._iteration())
        if math.isfinite(op.c):
            torch._foreach_copy_(mats, list(Y.unbind(0)))
        norms.append(sigma.reshape(-1).to(torch.float64))
        order += [(j, i, op.c) for j, i, _ in items]
    values = torch.cat([n.cpu() for n in norms]).tolist()
    for (j, i, c), sigma in zip(order, values, strict=True):
        pl = plans[j]
        ema = pl.pre_state["pre_clip_ema"]
        m = ema[i] if isinstance(ema, list) else ema
        m = pl.pre_beta * m + (1.0 - pl.pre_beta) * min(sigma, c)
        if isinstance(ema, list):
            ema[i] = m
        else:
            pl.pre_state["pre_clip_ema"] = m


def post_operator_(
    updates: list[Tensor],
    plans: Sequence[ParamPlan],
    batch_elements: int | None = None,
    group: ProcessGroup | None = None,
    finite: Tensor | None = None,
) -> bool:
    """``U ← post(U)`` in place for the parameters with a post operator. With ``finite`` (a 0-d
    bool tensor, read with the operators' own host read): False, and nothing changed, when it
    holds False. A relative threshold (``ParamPlan.relative``) clips each matrix at ``c·ŝ``,
    ``ŝ = ‖U_i‖_F``, as ``ŝ·post(U_i/ŝ)``."""
    scaled = _divide_by_scale_(updates, plans)
    if not _apply_ops(updates, plans, [pl.post for pl in plans], batch_elements, group, finite):
        return False
    for X, s in scaled:
        X.mul_(s)
    return True


def _divide_by_scale_(
    updates: list[Tensor], plans: Sequence[ParamPlan]
) -> list[tuple[Tensor, Tensor]]:
    """``U_i ← U_i/ŝ_i``, ``ŝ_i = ‖U_i‖_F``, for each matrix of the parameters whose post
    threshold is relative (the whole tensor's norm, summed over its shards, for a ``DTensor``
    that splits a matrix); ``(U_i, ŝ_i)`` pairs to multiply back. No host read."""
    pairs: list[tuple[Tensor, Tensor]] = []
    shards, params = [], []
    for u, pl in zip(updates, plans, strict=True):
        if not pl.relative or pl.post is None:
            continue
        if pl.shard is not None and not holds_whole_matrices(pl.shard, pl.layout):
            shards.append(u)
            params.append(pl.shard)
        else:
            mats = pl.matrices(u)
            pairs += zip(mats, torch._foreach_norm(mats), strict=True)
    if shards:
        pairs += zip(shards, frobenius_norms(shards, params), strict=True)
    pairs = [(X, s.clamp_min(torch.finfo(s.dtype).tiny)) for X, s in pairs]
    for X, s in pairs:
        X.div_(s)  # a zero matrix stays zero
    return pairs


def decay_weights_(
    params: list[Tensor], plans: Sequence[ParamPlan], keep: Tensor | None = None
) -> None:
    """``X ← (1 − λη) X``, one foreach call per distinct ``(η, λ)``; with ``keep`` (a 0-d bool
    tensor) only where it holds True."""
    for lr, wd, idx in _by_scalars(plans, lambda pl: pl.weight_decay):
        ps = [params[i] for i in idx]
        factor = 1.0 - lr * wd
        if keep is not None:
            factor = torch.where(keep, factor, 1.0)
        torch._foreach_mul_(ps, factor)


def add_update_(
    params: list[Tensor],
    updates: list[Tensor],
    plans: Sequence[ParamPlan],
    keep: Tensor | None = None,
) -> None:
    """``X ← X − αη · U``, one foreach call per distinct coefficient (per matrix where the
    blocks of a tensor take different α: ``ParamPlan.scales``); with ``keep`` (a 0-d bool
    tensor) only where it holds True (the updates, which may then hold inf or nan, are zeroed
    in place where it holds False)."""
    if keep is not None:
        drop = ~keep
        for u in updates:
            u.masked_fill_(drop, 0.0)
    # by coefficient: a float lr as the product αη (α = 1), a tensor lr (capturable) by
    # identity with α, never compared by value
    by: list[tuple[float | Tensor, float, list[tuple[Tensor, Tensor]]]] = []
    for p, u, pl in zip(params, updates, plans, strict=True):
        for X, U, scale in _scaled_pairs(p, u, pl):
            if torch.is_tensor(pl.lr):
                _join(by, pl.lr, scale, (X, U))
            elif scale * pl.lr != 0.0:
                _join(by, scale * pl.lr, 1.0, (X, U))
    for lr, scale, pairs in by:
        ps, us = [X for X, _ in pairs], [U for _, U in pairs]
        if torch.is_tensor(lr):
            torch._foreach_mul_(us, -scale * lr)
            torch._foreach_add_(ps, us)
        else:
            torch._foreach_add_(ps, us, alpha=-scale * lr)


def _scaled_pairs(p: Tensor, u: Tensor, pl: ParamPlan) -> list[tuple[Tensor, Tensor, float]]:
    """``(X, U, α)``: the parameter and its update whole, or one pair per matrix where the
    blocks of a tensor take different α (each block's α repeated over the batch entries)."""
    if pl.scales is None:
        return [(p, u, pl.scale)]
    ps, us = pl.matrices(p), pl.matrices(u)
    per = max(1, len(ps) // len(pl.scales))
    return [(X, U, pl.scales[j // per]) for j, (X, U) in enumerate(zip(ps, us, strict=True))]


def _by_scalars(
    plans: Sequence[ParamPlan], second: Callable[[ParamPlan], float]
) -> list[tuple[float | Tensor, float, list[int]]]:
    """``(lr, second(plan), positions)`` for each distinct pair (a tensor lr by identity,
    never compared by value), those with a zero second scalar left out: each takes one foreach
    call."""
    groups: list[tuple[float | Tensor, float, list[int]]] = []
    for i, pl in enumerate(plans):
        if second(pl) != 0.0:
            _join(groups, pl.lr, second(pl), i)
    return groups


def _join(groups: list, lr: float | Tensor, second: float, item: object) -> None:
    """Append ``item`` to the group ``(lr, second, items)`` of ``groups`` with the same scalars,
    or start one: a tensor lr is the same as another only if it is that tensor (never compared
    by value), a float by value. By ``is``, not ``id()``: torch.compile cannot take the id of a
    tensor made in the step (a per-parameter scale of a tensor lr)."""
    for g_lr, g_second, items in groups:
        tensor = torch.is_tensor(g_lr) or torch.is_tensor(lr)
        if g_second == second and (g_lr is lr if tensor else g_lr == lr):
            items.append(item)
            return
    groups.append((lr, second, [item]))


def finite_flag(tensors: Sequence[Tensor]) -> Tensor | None:
    """A 0-d bool tensor: whether every entry is finite, with no host synchronisation; ``None``
    when the tensors span several devices."""
    dense = [t._values() if t.is_sparse else t for t in tensors]
    dense = [t for t in dense if t.numel()]
    if len({t.device for t in dense}) > 1:
        return None
    if not dense:
        return torch.ones((), dtype=torch.bool)
    if dense[0].device.type not in PER_TENSOR_CHECK_DEVICES:
        return _largest_entries_finite(dense)
    # min and max are finite exactly when every entry is (nan propagates), and unlike a norm
    # they cannot overflow for finite input; cat promotes them to the widest dtype, which
    # holds each (a float64 direction of 1e300 is finite)
    return torch.cat([v.reshape(1) for t in dense for v in torch.aminmax(t)]).isfinite().all()


def _largest_entries_finite(tensors: Sequence[Tensor]) -> Tensor:
    """Whether every entry is finite, from ``max|t|`` of each tensor (``torch._foreach_norm``
    with ``ord=inf``): finite exactly when every entry is (an inf is its own max; nan
    propagates through the max, on CUDA as on the CPU), and it cannot overflow. One
    multi-tensor kernel per dtype on CUDA."""
    by_dtype: dict[torch.dtype, list[Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    flags = [
        torch.stack(torch._foreach_norm(ts, ord=math.inf)).isfinite().all()
        for ts in by_dtype.values()
    ]
    return flags[0] if len(flags) == 1 else torch.stack(flags).all()


def all_finite(tensors: Sequence[Tensor], group: ProcessGroup | None = None) -> bool:
    """Whether every entry is finite; one host synchronisation per device.

    With a ``group`` (tensors that are shards of a whole), the ranks' verdicts are combined,
    so that every rank takes the same branch.
    """
    if group is not None:
        return all_agree_finite(all_finite(tensors), tensors, group)
    by_device: dict[torch.device, list[Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    return all(bool(finite_flag(ts)) for ts in by_device.values())


# --------------------------------------------------------------------------- the chain


def chunks(sizes: Sequence[int], max_elements: int | None) -> list[list[int]]:
    """Consecutive runs of indices holding at most ``max_elements`` (at least one index each;
    ``None``: one run)."""
    if max_elements is None:
        return [list(range(len(sizes)))] if sizes else []
    return consecutive_runs(sizes, max_elements)


def spectra_step(
    params: list[Tensor],
    grads: list[Tensor],
    plans: Sequence[ParamPlan],
    direction: Direction,
    *,
    chunk_elements: int | None = None,
    batch_elements: int | None = None,
    group: ProcessGroup | None = None,
    finite: Tensor | None = None,
    capturable: bool = False,
) -> bool | Tensor:
    r"""One SPECTRA step: ``X ← (1 − λη)X − αη · post(direction(pre(g)))``, in place.

    Args:
        params: the parameters (updated in place).
        grads: their gradients (never modified).
        plans: one :class:`ParamPlan` per parameter.
        direction: the base optimizer's link (see :data:`Direction`); it may update the
            optimizer's state.
        chunk_elements: run the chain over consecutive chunks of at most this many elements
            (one parameter, if larger), bounding the direction buffers; ``None``: all at once.
        batch_elements: cap of one spectral-operator batch (see
            :func:`spectra.ops.batched_apply_`); ``None``: 1/``BATCH_FRACTION`` of the step's
            matrices that a spectral link sees, whole-step even when the chain runs in chunks
            (with no floor: a chunked step is asked for to bound its memory).
        group: a process group whose ranks all hold these (replicated) parameters, as under
            DDP: each spectral operator runs on one rank and its result is broadcast
            (:mod:`spectra.optim.distributed`). Shards of ``DTensor`` parameters (``plans``'
            ``shard``) are handled by their own mesh.

        finite: a 0-d bool tensor that must hold True for any parameter to move (for example
            whether the gradients were finite), read with the first chunk's finite check.
        capturable: read nothing back to the host (one process, operators with
            ``capturable`` set, parameters on one device): each chunk's parameters move only
            where its gradients and directions are finite, decided on the device, and the
            return value is a 0-d bool tensor, whether every chunk moved.

    Returns ``False`` when a direction holds inf or nan, or ``finite`` holds False, before that
    chunk's parameters change (with ``chunk_elements=None``: before any parameter changes);
    the base optimizer's state has then taken the step. ``True`` otherwise.

    Host synchronisations: in one process the finite check of a chunk's directions is read
    together with every post operator's own host read (:func:`batched_apply_all_`), so a step
    without ``chunk_elements`` and without pre-clipping reads the device once (on the CPU the
    operators read nothing asynchronous). With a process group or ``DTensor`` parameters the
    finite check is its own collective and read.
    """
    if not (len(params) == len(grads) == len(plans)):
        raise ValueError(
            f"spectra_step: {len(params)} params, {len(grads)} grads and {len(plans)} plans"
        )
    shards = next((mesh_group(pl.shard.device_mesh) for pl in plans if pl.shard is not None), None)
    # Whole-tensor sizes, so that every rank of a sharded run cuts the same chunks.
    sizes = [
        (p if pl.shard is None else pl.shard).numel() for p, pl in zip(params, plans, strict=True)
    ]
    if batch_elements is None and chunk_elements is not None:
        batch_elements = whole_step_budget(sizes, plans)
    if capturable:
        return _capturable_step(params, grads, plans, direction, chunk_elements, batch_elements)
    for idx in chunks(sizes, chunk_elements):
        ps, pls = [params[i] for i in idx], [plans[i] for i in idx]
        updates = direction(idx, pre_clip([grads[i] for i in idx], pls, batch_elements, group))
        # Single process: the finite check is read with the post operators' own host read.
        flag = finite_flag(updates) if group is None and shards is None else None
        if flag is None and not all_finite(updates, shards):
            return False
        if flag is not None and finite is not None:
            flag = flag & finite.to(flag.device)
        finite = None
        if not post_operator_(updates, pls, batch_elements, group, finite=flag):
            return False
        decay_weights_(ps, pls)
        add_update_(ps, updates, pls)
        del updates
    return True


def whole_step_budget(sizes: Sequence[int], plans: Sequence[ParamPlan]) -> int:
    """The clip's batch budget of a chunked step: the whole step's 1/``BATCH_FRACTION``, not a
    chunk's, which would be below one matrix and serialise the clip's batches."""
    spectral = [pl.shape is not None and (pl.pre or pl.post) is not None for pl in plans]
    seen = sum(n for n, s in zip(sizes, spectral, strict=True) if s)
    return max(1, -(-seen // BATCH_FRACTION))


def _capturable_step(
    params: list[Tensor],
    grads: list[Tensor],
    plans: Sequence[ParamPlan],
    direction: Direction,
    chunk_elements: int | None,
    batch_elements: int | None,
) -> Tensor:
    """:func:`spectra_step` with ``capturable``: the same links, with the finite check kept on
    the device and applied as a mask instead of read."""
    moved = None
    for idx in chunks([p.numel() for p in params], chunk_elements):
        ps, pls = [params[i] for i in idx], [plans[i] for i in idx]
        gs = [grads[i] for i in idx]
        updates = direction(idx, pre_clip(gs, pls, batch_elements))
        keep = finite_flag(gs + updates)
        post_operator_(updates, pls, batch_elements)
        decay_weights_(ps, pls, keep)
        add_update_(ps, updates, pls, keep)
        moved = keep if moved is None else moved & keep
        del updates
    return moved if moved is not None else torch.ones((), dtype=torch.bool)


def matrix_shape(p: Tensor, clip_vectors: bool = False) -> tuple[int, int] | None:
    """The ``(m, n)`` matrix a tensor is seen as by the spectral links, or ``None``.

    Tensors with two or more dimensions are ``(d0, d1·d2·…)`` matrices (the convention for
    convolution kernels); a 1-D tensor is a ``(1, d)`` matrix when ``clip_vectors`` (its only
    singular value is its Euclidean norm, so the matrix rule is the paper's vector rule); 0-D
    and empty tensors are never seen.
    """
    if p.numel() == 0:
        return None
    if p.dim() >= 2:
        return p.shape[0], p.numel() // p.shape[0]
    if p.dim() == 1 and clip_vectors:
        return 1, p.shape[0]
    return None
