"""D-Muon: Muon on hidden weight matrices, AdamW on everything else.

The D-Muon baseline of "Enhancing LLM Training via Spectral Clipping" is the Muon
variant of "Muon is Scalable for LLM Training" (Liu et al., 2025): Muon's
orthogonalized momentum with decoupled weight decay, its step rescaled so that the
update RMS matches AdamW's, and AdamW for the embeddings, the output head and every
1-D parameter. Both parts share one learning rate and one weight decay.

Muon part, for a matrix ``W ∈ ℝ^{m×n}`` with gradient ``G`` (the arithmetic of
``torch.optim.Muon(..., adjust_lr_fn="match_rms_adamw")``)::

    B ← μ·B + (1 − μ)·G                     momentum (an EMA)
    U ← (1 − μ)·G + μ·B  (Nesterov)  or  B
    O ← NS₅(U)                               quintic Newton–Schulz in bfloat16 ≈ orth(U)
    W ← (1 − η·λ)·W − η · 0.2·√max(m, n) · O

With ``soft_kappa=κ`` the orthogonalization is a soft one, a family between Muon and
normalized SGD-M built on the soft clip of "Enhancing LLM Training via Spectral Clipping"::

    O ← √r · H_1(Y) / ‖H_1(Y)‖_F,   Y = U / (κ·‖U‖_F),   r = min(m, n)

``H_1(Y) = H_{κŝ}(U)/(κŝ)`` (``ŝ = ‖U‖_F``) maps each singular value σ of U to
``t/√(1 + t²)`` with ``t = σ/(κŝ)``: near 1 for ``σ ≫ κŝ``, ``σ/(κŝ)`` for the small ones.
The normalization gives O the Frobenius norm of ``orth(U)`` (``√r`` for a full-rank U), so
the update's RMS and the shared learning rate stay Muon's. κ → 0 is ``orth(U)`` (Muon);
κ → ∞ is ``√r·U/‖U‖_F`` (SGD-M's direction at Muon's size).

AdamW part: exactly ``torch.optim.AdamW`` with ``betas=adamw_betas`` and
``eps=adamw_eps`` (its single-tensor arithmetic).

Both parts take their moments, weight decay and step through the links of the SPECTRA chain
(:func:`~spectra.optim.adamw.adam_moments_`, :func:`~spectra.optim.chain.decay_weights_`,
:func:`~spectra.optim.chain.add_update_`); the AdamW part keeps torch's single-tensor
normalisation ``m / (√v/√(1 − β₂ᵗ) + ε)`` fused into its step, to the bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from spectra.ops import newton_schulz_quintic
from spectra.ops.muon import MUON_NS_COEFFS
from spectra.optim.adamw import adam_moments_
from spectra.optim.base import step_counter
from spectra.optim.baselines.base import BaselineOptimizer
from spectra.optim.chain import add_update_, decay_weights_
from spectra.optim.distributed import apply_sharded, frobenius_norms, is_sharded, local
from spectra.optim.plan import ParamPlan, SpectralOp
from spectra.optim.settings import NS_DTYPES, ns_dtype_of
from spectra.validate import check_int, check_number, check_pair

# Dimensions at or above this go to AdamW under the default rule: the embedding and the
# output head of a language model (footnote to the memory table of the SPECTRA paper:
# Muon for 2-D matrices with fewer than 10000 rows, AdamW for the rest).
MUON_MAX_DIM = 10000

# Update scale that gives an orthogonalized m×n update the RMS of a typical AdamW
# update: RMS(O) ≈ 1/√max(m, n), times 0.2√max(m, n) gives 0.2 ("Muon is Scalable for
# LLM Training", Sec. 2.2).
RMS_MATCH = 0.2

# Names (components of a parameter's qualified name) that mark embeddings and output
# heads for :func:`dmuon_param_groups`.
DEFAULT_ADAMW_NAMES = (
    "embed",
    "embedding",
    "embeddings",
    "embed_tokens",
    "tok_embeddings",
    "wte",
    "wpe",
    "lm_head",
    "head",
    "output",
)


def default_use_muon(p: Tensor) -> bool:
    """The default split: Muon for a 2-D parameter whose two dimensions are both < 10000."""
    return p.dim() == 2 and max(p.shape) < MUON_MAX_DIM


def dmuon_param_groups(
    model: nn.Module,
    adamw_names: Iterable[str] = DEFAULT_ADAMW_NAMES,
    **group_options: Any,
) -> list[dict[str, Any]]:
    """Split a model's trainable parameters into a Muon group and an AdamW group.

    A parameter goes to AdamW when it is not 2-D, when it belongs to an
    ``nn.Embedding``, or when a dot-separated component of its qualified name is one of
    ``adamw_names`` (e.g. ``lm_head.weight``); every other parameter goes to Muon.
    Tied weights appear once, under their first name. ``group_options`` (e.g. ``lr``)
    are copied into both groups; empty groups are left out.
    """
    names = set(adamw_names)
    embedding_params = {
        id(p) for mod in model.modules() if isinstance(mod, nn.Embedding) for p in mod.parameters()
    }
    muon, adamw = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        to_adamw = (
            p.dim() != 2 or id(p) in embedding_params or any(c in names for c in name.split("."))
        )
        (adamw if to_adamw else muon).append(p)
    groups = []
    if muon:
        groups.append({"params": muon, "use_muon": True, **group_options})
    if adamw:
        groups.append({"params": adamw, "use_muon": False, **group_options})
    return groups


def muon_update(
    param: Tensor,
    grad: Tensor,
    momentum_buffer: Tensor,
    *,
    lr: float,
    weight_decay: float,
    momentum: float,
    nesterov: bool,
    ns_steps: int,
    ns_dtype: torch.dtype = torch.bfloat16,
    soft_kappa: float | None = None,
    shard_of: Tensor | None = None,
) -> None:
    """One Muon step on ``param`` in place (see the module docstring for the math; with
    ``soft_kappa``, the soft orthogonalization).

    Tensors with more than two dimensions are treated as the matrix
    ``(shape[0], prod(shape[1:]))``. With ``shard_of`` (a ``DTensor`` parameter), ``param``,
    ``grad`` and ``momentum_buffer`` are its local shards and ``NS₅(U)`` is formed by the
    sharded route of :func:`spectra.optim.distributed.apply_sharded` (the Gram route, with
    the iteration carried as a polynomial in the Gram matrix, where the long side is split).
    """
    momentum_buffer.lerp_(grad, 1 - momentum)
    update = grad.lerp(momentum_buffer, momentum) if nesterov else momentum_buffer
    whole = param.shape if shard_of is None else shard_of.shape
    shape = (whole[0], math.prod(whole[1:]))
    if soft_kappa is not None:
        ortho = soft_orthogonalize(update, soft_kappa, shape, shard_of)
    elif shard_of is None:
        matrix = update.reshape(shape)
        ortho = newton_schulz_quintic(
            matrix, ns_steps=ns_steps, coeffs=MUON_NS_COEFFS, dtype=ns_dtype
        ).view_as(param)
    else:
        ortho = update.clone(memory_format=torch.contiguous_format)
        op = SpectralOp("orthogonalize", None, "muon", ns_steps, ns_dtype)
        apply_sharded([(op, ortho, shard_of, shape)])
    plan = ParamPlan(lr, weight_decay, scale=RMS_MATCH * math.sqrt(max(shape)))
    decay_weights_([param], [plan])
    add_update_([param], [ortho], [plan])


def soft_orthogonalize(
    update: Tensor, kappa: float, shape: tuple[int, int], shard_of: Tensor | None = None
) -> Tensor:
    r"""``O = √r·H_1(Y)/‖H_1(Y)‖_F`` with ``Y = U/(κ‖U‖_F)`` and ``r = min(m, n)`` for the
    ``shape`` matrix ``U`` (``update``, or its local shard of the ``DTensor`` ``shard_of``);
    a new tensor of ``update``'s shape. See the module docstring."""
    ortho = update.clone(memory_format=torch.contiguous_format)
    owner = update if shard_of is None else shard_of
    tiny = torch.finfo(ortho.dtype).tiny
    ortho.div_(frobenius_norms([ortho], [owner])[0].clamp_min(tiny) * kappa)
    op = SpectralOp("soft_clip", 1.0)
    if shard_of is None:
        ortho = op(ortho.reshape(1, *shape)).view_as(update)
    else:
        apply_sharded([(op, ortho, shard_of, shape)])
    return ortho.mul_(math.sqrt(min(shape)) / frobenius_norms([ortho], [owner])[0].clamp_min(tiny))


def adamw_update(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    step: int,
    *,
    lr: float,
    weight_decay: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    r"""One AdamW step (``step`` counts from 1), in ``torch.optim.AdamW``'s arithmetic.

    ``W ← (1 − ηλ)W − η/(1 − β₁ᵗ) · m / (√v/√(1 − β₂ᵗ) + ε)``.
    """
    decay_weights_([param], [ParamPlan(lr, weight_decay)])
    adam_moments_([grad], [exp_avg], [exp_avg_sq], beta1, beta2)
    step_size = lr / (1 - beta1**step)
    denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


class DMuon(BaselineOptimizer):
    r"""D-Muon: Muon (Nesterov momentum, bf16 Newton–Schulz, AdamW-matched RMS) + AdamW.

    Which parameters Muon handles is set per param group by the key ``use_muon``:
    ``True`` (Muon; the parameter must have at least 2 dimensions), ``False`` (AdamW),
    or ``None``/absent, where each parameter follows :func:`default_use_muon` — 2-D with
    both dimensions below 10000 → Muon, anything else → AdamW. A language model whose
    vocabulary is below 10000 needs explicit groups; :func:`dmuon_param_groups` builds
    them from module types and names.

    On Muon parameters the step equals ``torch.optim.Muon(params, lr, weight_decay,
    momentum, nesterov, ns_steps=ns_steps, adjust_lr_fn="match_rms_adamw")`` up to
    bfloat16 rounding in the Newton–Schulz iteration; on AdamW parameters it equals
    ``torch.optim.AdamW(params, lr, betas=adamw_betas, eps=adamw_eps,
    weight_decay=weight_decay)``.

    Args:
        params: parameters or param groups.
        lr: learning rate η, shared by both parts (default 1e-3, the paper's tuned value).
        momentum: Muon momentum μ in [0, 1) (default 0.95).
        nesterov: Nesterov momentum for Muon (default True).
        weight_decay: decoupled weight decay λ for both parts (default 0.1).
        ns_steps: Newton–Schulz steps (default 5).
        ns_dtype: working precision of the Newton–Schulz iteration: ``torch.bfloat16``
            (default, Muon's), ``torch.float32`` or ``torch.float64`` (a dtype or its name,
            :data:`spectra.optim.settings.NS_DTYPES`); on CPUs without bf16
            units a bf16 product runs ~60x slower than a float32 one.
        adamw_betas: AdamW (β₁, β₂) (default (0.8, 0.999), the paper's 160M setting;
            it uses (0.9, 0.99) at 780M/820M).
        adamw_eps: AdamW ε (default 1e-8).
        soft_kappa: κ of the soft orthogonalization (module docstring) in place of
            Newton–Schulz; ``None`` (default): Muon's ``NS₅``.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.1,
        ns_steps: int = 5,
        ns_dtype: torch.dtype | str = torch.bfloat16,
        adamw_betas: tuple[float, float] = (0.8, 0.999),
        adamw_eps: float = 1e-8,
        soft_kappa: float | None = None,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "nesterov": nesterov,
            "weight_decay": weight_decay,
            "ns_steps": ns_steps,
            "ns_dtype": ns_dtype_of(ns_dtype),
            "adamw_betas": adamw_betas,
            "adamw_eps": adamw_eps,
            "use_muon": None,
            "soft_kappa": soft_kappa,
        }
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_number("lr", group["lr"], low=0.0)
        check_number("momentum", group["momentum"], low=0.0, high=1.0, high_open=True)
        check_number("weight_decay", group["weight_decay"], low=0.0)
        check_number("adamw_eps", group["adamw_eps"], low=0.0)
        check_int("ns_steps", group["ns_steps"], low=1)
        check_number("soft_kappa", group["soft_kappa"], low=0.0, low_open=True, none_ok=True)
        if group["ns_dtype"] not in NS_DTYPES.values():
            raise ValueError(
                f"ns_dtype must be one of {', '.join(NS_DTYPES)} (a torch.dtype or its name), "
                f"got {group['ns_dtype']!r}"
            )
        if len(check_pair("adamw_betas", group["adamw_betas"])) != 2:
            raise ValueError(f"adamw_betas must be a pair, got {group['adamw_betas']!r}")
        if not isinstance(group["nesterov"], bool):
            raise ValueError(f"nesterov must be a bool, got {group['nesterov']!r}")
        if group["use_muon"] not in (None, True, False):
            raise ValueError(f"use_muon must be True, False or None, got {group['use_muon']!r}")

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # state dicts saved before ns_dtype existed
            group.setdefault("ns_dtype", torch.bfloat16)
            group.setdefault("soft_kappa", None)

    def _check_params(self, group: dict[str, Any]) -> None:
        if group["use_muon"]:
            for p in group["params"]:
                if p.dim() < 2:
                    raise ValueError(
                        f"use_muon=True needs parameters with >= 2 dimensions, got a "
                        f"parameter of shape {tuple(p.shape)}"
                    )

    @staticmethod
    def _uses_muon(group: dict[str, Any], p: Tensor) -> bool:
        use = group["use_muon"]
        return default_use_muon(p) if use is None else use

    # A DTensor parameter steps on its shards: its state is DTensors of its layout, the AdamW
    # part is elementwise, and the Muon part's orthogonalization takes the sharded route.
    _on_shards = True

    def _update(self, group: dict[str, Any], p: Tensor, w: Tensor, g: Tensor) -> None:
        state = self.state[p]
        if self._uses_muon(group, p):
            if not state:
                state["momentum_buffer"] = torch.zeros_like(p)
            muon_update(
                w,
                g,
                local(state["momentum_buffer"]),
                lr=float(group["lr"]),
                weight_decay=group["weight_decay"],
                momentum=group["momentum"],
                nesterov=group["nesterov"],
                ns_steps=group["ns_steps"],
                ns_dtype=group["ns_dtype"],
                soft_kappa=group["soft_kappa"],
                shard_of=p if is_sharded(p) else None,
            )
            return
        if not state:
            state["step"] = step_counter()
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        beta1, beta2 = group["adamw_betas"]
        adamw_update(
            w,
            g,
            local(state["exp_avg"]),
            local(state["exp_avg_sq"]),
            int(state["step"]),
            lr=float(group["lr"]),
            weight_decay=group["weight_decay"],
            beta1=beta1,
            beta2=beta2,
            eps=group["adamw_eps"],
        )
