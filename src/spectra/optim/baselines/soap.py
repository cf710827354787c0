"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner.

Following "SOAP: Improving and Stabilizing Shampoo using Adam" (Vyas et al., 2024).
For a parameter ``W`` with gradient ``G`` and, for each dimension ``i``
with ``dᵢ ≤ max_precond_dim``, a Kronecker factor ``Lᵢ`` (``L = GGᵀ`` and ``R = GᵀG``
for a matrix) with eigenbasis ``Qᵢ``::

    G̃ ← G ×ᵢ Qᵢᵀ                    rotate (G̃ = Q_Lᵀ G Q_R for a matrix)
    M ← β₁M + (1 − β₁)G̃              Adam moments, kept in the rotated basis
    V ← β₂V + (1 − β₂)G̃²
    N ← M/(√V + ε) ×ᵢ Qᵢ              rotate back
    W ← (1 − ηλ)W − η·√(1 − β₂ᵗ)/(1 − β₁ᵗ) · N
    Lᵢ ← β_s Lᵢ + (1 − β_s) G_(i) G_(i)ᵀ     after the step, so the basis never sees
                                             the current gradient
    every f steps: Qᵢ ← QR(Lᵢ Qᵢ)       one power iteration; V is permuted to the new
                                        column order (descending estimated eigenvalues)
                                        and M is rotated into the new basis

Dimensions larger than ``max_precond_dim`` are left unrotated, so a tensor with no
preconditioned dimension gets plain AdamW. 1-D tensors get AdamW unless
``precondition_1d=True`` (then a single factor ``ggᵀ`` of size d×d).

The first step: the reference implementation only initialises the preconditioner
there and returns without moving the parameters. Here the first step is a real step,
with the weight decay: ``Lᵢ`` is initialised from the first gradient
(``(1 − β_s)·G_(i)G_(i)ᵀ``, not added a second time), ``Qᵢ`` is its exact eigenbasis
(``eigh``), and the Adam step itself is taken in the original basis, the only basis
not built from the current gradient. (In its own eigenbasis G is diagonal, and Adam's
elementwise normalisation would blow the rounding noise of the zero entries up to
full-size steps: for a 64×32 float32 gradient of unit scale the update RMS comes
out 6.8× too large.) The moments
are then moved into the new basis: ``M`` is rotated exactly, and ``V`` becomes
``(1 − β₂)·G̃²``, what it would be had G been seen in that basis. From the second
step on the update is the reference's.

Conventions that follow the reference: ε is added to ``√V`` before the bias
correction (folded into the step size); weight decay is decoupled and multiplies by
``(1 − ηλ)``, applied before the update as in ``torch.optim.AdamW`` (the reference
applies it after; the two differ by O(η²λ)). The moments, the weight decay and the step go
through the links of the SPECTRA chain (:func:`~spectra.optim.adamw.adam_moments_`,
:func:`~spectra.optim.chain.decay_weights_`, :func:`~spectra.optim.chain.add_update_`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from spectra.ops._common import compute_dtype
from spectra.optim.adamw import adam_moments_
from spectra.optim.base import step_counter
from spectra.optim.baselines.base import BaselineOptimizer
from spectra.optim.chain import add_update_, decay_weights_
from spectra.optim.plan import ParamPlan
from spectra.validate import check_int, check_number, check_pair


def rotate(x: Tensor, bases: list[Tensor | None]) -> Tensor:
    """``x ×ᵢ Qᵢᵀ`` for every dimension i with a basis (``Q_Lᵀ X Q_R`` for a matrix)."""
    for Q in bases:
        # tensordot over dim 0 moves that dimension to the end; after a full pass the
        # dimensions are back in their original order.
        x = torch.tensordot(x, Q, dims=([0], [0])) if Q is not None else x.movedim(0, -1)
    return x


def rotate_back(x: Tensor, bases: list[Tensor | None]) -> Tensor:
    """``x ×ᵢ Qᵢ`` for every dimension i with a basis (``Q_L X Q_Rᵀ`` for a matrix)."""
    for Q in bases:
        x = torch.tensordot(x, Q, dims=([0], [1])) if Q is not None else x.movedim(0, -1)
    return x


def kronecker_factor(g: Tensor, dim: int) -> Tensor:
    """``G_(dim) G_(dim)ᵀ``: the Gram matrix of the mode-``dim`` unfolding of ``g``."""
    others = [d for d in range(g.dim()) if d != dim]
    return torch.tensordot(g, g, dims=(others, others))


def _eigenbasis(L: Tensor) -> Tensor:
    """Eigenvectors of the symmetric ``L``, columns ordered by descending eigenvalue."""
    try:
        _, Q = torch.linalg.eigh(L)
    except torch.linalg.LinAlgError:
        _, Q = torch.linalg.eigh(L.to(torch.float64))
        Q = Q.to(L.dtype)
    return Q.flip(-1)


def _power_iteration(
    factors: list[Tensor | None], bases: list[Tensor | None], exp_avg_sq: Tensor
) -> tuple[list[Tensor | None], Tensor]:
    """Refresh each basis by one step of power iteration, ``Qᵢ ← QR(Lᵢ Qᵢ)``.

    The columns of ``Qᵢ`` are first sorted by descending estimated eigenvalue
    ``diag(Qᵢᵀ Lᵢ Qᵢ)``, and ``exp_avg_sq`` is permuted along dimension i to match, so
    each second-moment entry stays with its (slowly moving) eigenvector.
    """
    new_bases: list[Tensor | None] = []
    for dim, (L, Q) in enumerate(zip(factors, bases, strict=True)):
        if Q is None:
            new_bases.append(None)
            continue
        LQ = L.to(Q.dtype) @ Q
        order = torch.argsort((LQ * Q).sum(dim=0), descending=True)
        exp_avg_sq = exp_avg_sq.index_select(dim, order)
        Q_new, _ = torch.linalg.qr(LQ[:, order])
        new_bases.append(Q_new)
    return new_bases, exp_avg_sq


class SOAP(BaselineOptimizer):
    r"""SOAP (Vyas et al., 2024): Adam run in the slowly updated eigenbasis of Shampoo.

    See the module docstring for the update. State per parameter: ``exp_avg`` and
    ``exp_avg_sq`` (parameter-shaped, in the rotated basis), and for each dimension
    ``GG`` (the factor ``Lᵢ``, dᵢ×dᵢ, or ``None``) and ``Q`` (its eigenbasis or ``None``):
    ``2M + Σ_{dᵢ ≤ D} 2dᵢ²`` numbers in all. State tensors have the parameter's dtype;
    the arithmetic runs in at least float32.

    Args:
        params: parameters or param groups.
        lr: learning rate η (default 3e-3, the paper's 780M/820M value).
        betas: Adam (β₁, β₂) (default (0.95, 0.95), the paper's 780M/820M setting; it
            uses (0.9, 0.999) at 160M).
        shampoo_beta: EMA factor β_s of the Kronecker factors; a negative value (default
            -1) means β₂.
        eps: ε added to √V (default 1e-8).
        weight_decay: decoupled weight decay λ (default 0.1, as in all the paper's runs).
        precondition_frequency: steps between eigenbasis refreshes f (default 10).
        max_precond_dim: largest dimension that gets a factor, D (default 10000).
        precondition_1d: give 1-D parameters a d×d factor (default False: AdamW).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = 3e-3,
        betas: tuple[float, float] = (0.95, 0.95),
        shampoo_beta: float = -1,
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        precondition_frequency: int = 10,
        max_precond_dim: int = 10000,
        precondition_1d: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": betas,
            "shampoo_beta": shampoo_beta,
            "eps": eps,
            "weight_decay": weight_decay,
            "precondition_frequency": precondition_frequency,
            "max_precond_dim": max_precond_dim,
            "precondition_1d": precondition_1d,
        }
        super().__init__(params, defaults)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_number("lr", group["lr"], low=0.0)
        if len(check_pair("betas", group["betas"])) != 2:
            raise ValueError(f"betas must be a pair, got {group['betas']!r}")
        check_number("shampoo_beta", group["shampoo_beta"], high=1.0, high_open=True)
        check_number("eps", group["eps"], low=0.0)
        check_number("weight_decay", group["weight_decay"], low=0.0)
        check_int("precondition_frequency", group["precondition_frequency"], low=1)
        check_int("max_precond_dim", group["max_precond_dim"], low=0)
        if not isinstance(group["precondition_1d"], bool):
            raise ValueError(f"precondition_1d must be a bool, got {group['precondition_1d']!r}")

    @staticmethod
    def _preconditioned_dims(p: Tensor, group: dict[str, Any]) -> list[bool]:
        if p.dim() == 1 and not group["precondition_1d"]:
            return [False]
        return [d <= group["max_precond_dim"] for d in p.shape]

    def _init_state(
        self,
        state: dict[str, Any],
        p: Tensor,
        g: Tensor,
        group: dict[str, Any],
        shampoo_beta: float,
    ) -> None:
        state["step"] = step_counter()
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
        gg, qs = [], []
        for dim, on in enumerate(self._preconditioned_dims(p, group)):
            if not on:
                gg.append(None)
                qs.append(None)
                continue
            L = (1 - shampoo_beta) * kronecker_factor(g, dim)
            gg.append(L.to(p.dtype))
            qs.append(_eigenbasis(L).to(p.dtype))
        state["GG"] = gg
        state["Q"] = qs

    def _update(self, group: dict[str, Any], p: Tensor, w: Tensor, grad: Tensor) -> None:
        """One SOAP step of the weights ``w`` (``p`` itself, or its whole tensor under FSDP2),
        with the state of ``p``."""
        beta1, beta2 = group["betas"]
        shampoo_beta = group["shampoo_beta"]
        if shampoo_beta < 0:
            shampoo_beta = beta2
        wd = compute_dtype(w)
        g = grad.to(wd)
        state = self.state[p]
        first = not state
        if first:
            self._init_state(state, w, g, group, shampoo_beta)
        state["step"] += 1
        t = int(state["step"])
        Q = [q.to(wd) if q is not None else None for q in state["Q"]]
        # The moments live in the basis Q, except before the first step, when no basis
        # built from past gradients exists yet: that step is taken in the original basis.
        step_basis = [None] * len(Q) if first else Q

        g_rot = rotate(g, step_basis)
        exp_avg, exp_avg_sq = state["exp_avg"].to(wd), state["exp_avg_sq"].to(wd)
        adam_moments_([g_rot], [exp_avg], [exp_avg_sq], beta1, beta2)
        direction = rotate_back(exp_avg / (exp_avg_sq.sqrt() + group["eps"]), step_basis)
        # The bias corrections are folded into the step size, with ε added before them.
        lr = float(group["lr"])  # a 1-element tensor lr counts as its number
        step_size = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
        decay_weights_([w], [ParamPlan(lr, group["weight_decay"])])
        add_update_([w], [direction.to(w.dtype)], [ParamPlan(step_size)])

        if first:
            # Move the moments into the basis built from this gradient: M rotates
            # exactly; V is what it would be had G been seen in that basis.
            g_rot = rotate(g, Q)
            exp_avg = rotate(exp_avg, Q)
            exp_avg_sq = torch.zeros_like(g_rot).addcmul_(g_rot, g_rot, value=1 - beta2)
        else:
            for dim, L in enumerate(state["GG"]):
                if L is not None:
                    L.copy_(L.to(wd).lerp_(kronecker_factor(g, dim), 1 - shampoo_beta))
        if t % group["precondition_frequency"] == 0:
            Q_new, exp_avg_sq = _power_iteration(state["GG"], Q, exp_avg_sq)
            exp_avg = rotate(rotate_back(exp_avg, Q), Q_new)
            state["Q"] = [q.to(w.dtype) if q is not None else None for q in Q_new]
        state["exp_avg"].copy_(exp_avg)
        state["exp_avg_sq"].copy_(exp_avg_sq)
