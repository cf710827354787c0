r"""Param groups that tell the spectral links where the matrices of a model's tensors are.

:func:`matrix_param_groups` walks a module and sets, per group, the settings of
:mod:`spectra.optim.layout` for the tensors that hold several matrices or store them
``(in, out)``:

=========================================== ========================================= ==========
tensor                                      matrices                                  settings
=========================================== ========================================= ==========
``nn.Linear`` weight ``(out, in)``          one                                       none
HF ``Conv1D`` weight ``(in, out)``          one, α from ``(out, in)``                 transposed
fused q/k/v (``c_attn``, ``qkv_proj``,      q, k and v (sizes from the attention's    split
``Wqkv``, ``nn.MultiheadAttention``)        head counts, else thirds)
fused gate/up (``gate_up_proj``, ``w13``)   gate and up (halves)                      split
expert stack ``(E, m, n)`` (a tensor of     ``E`` matrices (``gate_up_proj`` also     batch dims
three or more dimensions of an experts      split into gate and up)
module, or named as an expert weight)
=========================================== ========================================= ==========

Everything else (embeddings, norms, biases, convolutions, routers) keeps the default rule.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

#: Names of fused q/k/v projections whose blocks are contiguous (q, then k, then v).
QKV_NAMES = ("c_attn", "qkv_proj", "qkv", "Wqkv", "wqkv")
#: Names of fused gate/up projections whose blocks are contiguous (gate, then up).
GATE_UP_NAMES = ("gate_up_proj", "gate_up", "w13", "w1_w3")
#: Names of projections that interleave q, k and v per head (GPT-NeoX, Falcon, BLOOM): no
#: contiguous split describes them, so they stay one matrix, with a warning.
INTERLEAVED_NAMES = ("query_key_value",)
#: Expert modules whose ``gate_up_proj`` interleaves gate and up columns (gpt-oss): each expert
#: stays one matrix.
INTERLEAVED_EXPERTS = ("GptOssExperts",)
#: Names of expert tensors whose output is the hidden size (the others take it as input).
DOWN_NAMES = ("down_proj", "w2")

Layout = tuple[int, tuple[tuple[int, ...], int] | None, bool]


def matrix_param_groups(
    module: nn.Module,
    *,
    splits: Mapping[str, tuple[Sequence[int], int]] | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    r"""``module``'s trainable parameters as param groups whose ``clip_batch_dims``,
    ``clip_split`` and ``clip_transposed`` make each spectral clip see one weight matrix.

    Each clipped matrix ``W`` of ``(out, in)`` shape ``(m, n)`` takes
    ``W ← (1 − λη)W − αη·post(U_W)`` with ``α = max(1, √(m/n))`` and ``U_W`` its own block of
    the direction: an expert of a stack ``(E, m, n)``, the q, k or v of a fused projection, the
    ``(out, in)`` view of a ``Conv1D`` weight (see the module's table).

    Args:
        module: the model. Parameters shared by several modules (tied embeddings) are listed
            once; frozen ones (``requires_grad=False``) are left out.
        splits: ``{parameter name: (sizes, dim)}`` for fused tensors the table does not know
            (or knows wrongly); it replaces the detected split of that parameter.
        **settings: keys every returned group gets (``lr``, ``weight_decay``, ``clip_c``, ...).

    Returns a list of param groups: the parameters with the default rule first, then one group
    per distinct layout. A name in ``splits`` that is no parameter raises ``ValueError``.
    """
    splits = dict(splits or {})
    modules = dict(module.named_modules())
    found: dict[Layout, list[Tensor]] = {(0, None, False): []}
    seen: set[int] = set()
    names = set()
    for mod_name, mod in modules.items():
        for p_name, p in mod.named_parameters(recurse=False):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            names.add(name)
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            layout = _layout(mod, p_name, p, name, modules, mod_name)
            if name in splits:
                sizes, dim = splits[name]
                layout = (layout[0], (tuple(sizes), dim), layout[2])
            found.setdefault(layout, []).append(p)
    unknown = sorted(set(splits) - names)
    if unknown:
        raise ValueError(f"splits names no parameter of the module: {', '.join(unknown)}")
    groups = []
    for (batch_dims, split, transposed), params in found.items():
        if not params:
            continue
        group: dict[str, Any] = {"params": params, **settings}
        if batch_dims:
            group["clip_batch_dims"] = batch_dims
        if split is not None:
            group["clip_split"] = split
        if transposed:
            group["clip_transposed"] = True
        groups.append(group)
    return groups


def _layout(
    mod: nn.Module, p_name: str, p: Tensor, name: str, modules: dict[str, nn.Module], path: str
) -> Layout:
    """``(clip_batch_dims, clip_split, clip_transposed)`` of parameter ``p_name`` of ``mod``."""
    short = path.rsplit(".", 1)[-1]
    parent = modules.get(path.rsplit(".", 1)[0] if "." in path else "")
    if isinstance(mod, nn.MultiheadAttention) and p_name == "in_proj_weight":
        return 0, ((mod.embed_dim,) * 3, 0), False
    if p_name != "weight" or p.dim() < 2:
        return _expert_layout(mod, p_name, p) if _experts(mod, p_name, p) else (0, None, False)
    if isinstance(mod, nn.modules.conv._ConvNd):
        return 0, None, False
    conv1d = type(mod).__name__ == "Conv1D" and hasattr(mod, "nf") and p.dim() == 2
    out_dim = 1 if conv1d else 0
    split = None
    if short in QKV_NAMES and p.dim() == 2:
        split = _qkv_sizes(p.shape[out_dim], parent, name)
    elif short in GATE_UP_NAMES and p.dim() == 2 and p.shape[out_dim] % 2 == 0:
        split = (p.shape[out_dim] // 2,) * 2
    elif short in INTERLEAVED_NAMES:
        warnings.warn(
            f"matrix_param_groups: {name} interleaves q, k and v per head, so it stays one "
            "matrix; its blocks are no contiguous split",
            UserWarning,
            stacklevel=3,
        )
    if _experts(mod, p_name, p):
        return _expert_layout(mod, p_name, p)
    return 0, None if split is None else (split, out_dim), conv1d


def _experts(mod: nn.Module, p_name: str, p: Tensor) -> bool:
    """Whether ``p`` is a stack of expert matrices: three or more dimensions, in a module whose
    expert count is its first, whose class name says experts, or under an expert weight's name
    (a position table ``(1, T, d)`` is none)."""
    if p.dim() < 3:
        return False
    count = _attr(mod, ("num_experts", "num_local_experts", "n_experts"))
    named = p_name in (*GATE_UP_NAMES, *DOWN_NAMES, "up_proj", "gate_proj", "w1", "w3")
    return count == p.shape[0] or "expert" in type(mod).__name__.lower() or named


def _expert_layout(mod: nn.Module, p_name: str, p: Tensor) -> Layout:
    """A stack of expert matrices ``(E, a, b)``: ``(out, in)`` unless its hidden side (the
    input of ``gate_up_proj``, the output of ``down_proj``) says ``(in, out)``; a gate/up stack
    is also split into its halves."""
    batch_dims = p.dim() - 2
    hidden = _attr(mod, ("hidden_dim", "hidden_size"))
    a, b = p.shape[-2], p.shape[-1]
    down = p_name in DOWN_NAMES
    transposed = hidden is not None and (
        (down and b == hidden and a != hidden) or (not down and a == hidden and b != hidden)
    )
    split = None
    interleaved = type(mod).__name__ in INTERLEAVED_EXPERTS
    if p_name in GATE_UP_NAMES and not interleaved:
        out_dim = p.dim() - 1 if transposed else p.dim() - 2
        if p.shape[out_dim] % 2 == 0:
            split = ((p.shape[out_dim] // 2,) * 2, out_dim)
    return batch_dims, split, transposed


def _qkv_sizes(out: int, attention: nn.Module | None, name: str) -> tuple[int, ...] | None:
    """The q, k, v (or k, v) sizes of a fused projection with ``out`` outputs, from the
    attention module's head counts; thirds where they are unknown."""
    heads = _attr(attention, ("num_heads", "num_attention_heads", "n_head"))
    kv_heads = _attr(attention, ("num_key_value_heads", "num_kv_heads", "n_kv_heads"))
    head_dim = _attr(attention, ("head_dim",))
    kv_heads = heads if kv_heads is None else kv_heads
    if heads is not None and head_dim is not None:
        q, kv = heads * head_dim, kv_heads * head_dim
        if q + 2 * kv == out:
            return (q, kv, kv)
        if 2 * kv == out:  # a cross-attention's fused k and v
            return (kv, kv)
    if out % 3 == 0:
        return (out // 3,) * 3
    warnings.warn(
        f"matrix_param_groups: {name} looks like a fused q/k/v projection with {out} outputs, "
        "which its attention's head counts do not divide; it stays one matrix (pass "
        f"splits={{{name!r}: (sizes, dim)}})",
        UserWarning,
        stacklevel=4,
    )
    return None


def _attr(mod: nn.Module | None, keys: Sequence[str]) -> int | None:
    """The first of ``keys`` that ``mod`` or its ``config`` holds as an int."""
    for holder in (mod, getattr(mod, "config", None)):
        for key in keys:
            value = getattr(holder, key, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None
