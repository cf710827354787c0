"""SGD under sparse spectral spikes: plain, globally clipped, spectrally clipped, with momentum.

"Enhancing LLM Training via Spectral Clipping", Sec. 4 and Appendix "Validation of robustness
to sparse spectral spikes". The stochastic gradient is ``g(X) = ∇f(X) + N`` with a fresh
``N = ℓ U Vᵀ`` at every call, where U, V ∈ R^{d×r} are independent and uniform on the Stiefel
manifold, drawn by the polar construction ``U = A (AᵀA)^{-1/2}``, A with i.i.d. N(0, 1)
entries (then E[U] = 0 and E[UUᵀ] = (r/d)·I: bounded anisotropy with κ = 1). The methods,
all with η_k = η₀/√(k+1):

* ``sgd``:                X ← X − η_k g
* ``sgd_global_clip``:    X ← X − η_k clip^g_c(g)                       (eq. SGD-global-clipping)
* ``sgd_spectral_clip``:  X ← X − η_k clip^sp_c(g)                      (eq. SGD-spectral-clipping)
* ``sgdm``:               M ← (1−β)M + βg,            X ← X − η_k M
* ``sgdm_pre_clip``:      M ← (1−β)M + β clip^sp_c(g), X ← X − η_k M    (eq. clipped-momentum)

with M₀ = the first (clipped) stochastic gradient. Every run of one call shares the same noise
sequence (common random numbers), so methods and step sizes are compared on equal draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from spectra.ops import global_clip, hard_clip
from spectra_lab.synth.problem import DTYPE, LogisticProblem

SGD_METHODS = ("sgd", "sgd_global_clip", "sgd_spectral_clip")
MOMENTUM_METHODS = ("sgdm", "sgdm_pre_clip")
METHODS = SGD_METHODS + MOMENTUM_METHODS


def stiefel_polar(d: int, r: int, generator: torch.Generator) -> Tensor:
    """A d × r matrix uniform on the Stiefel manifold: ``A (AᵀA)^{-1/2}``, A ~ N(0, 1)^{d×r}."""
    if not 1 <= r <= d:
        raise ValueError(f"need 1 <= r <= d, got r={r}, d={d}")
    A = torch.randn(d, r, generator=generator, dtype=DTYPE)
    mu, Q = torch.linalg.eigh(A.mT @ A)
    return A @ ((Q * mu.rsqrt()) @ Q.mT)


def spike_noise(
    shape: tuple[int, int], rank: int, scale: float, generator: torch.Generator
) -> Tensor:
    """``N = ℓ U Vᵀ`` with independent Stiefel-uniform U (m × r) and V (p × r)."""
    U = stiefel_polar(shape[0], rank, generator)
    V = stiefel_polar(shape[1], rank, generator)
    return scale * (U @ V.mT)


@dataclass(frozen=True)
class SpikeRuns:
    """Training losses f(X_k), k = 0..K, of one method for each η₀ (rows)."""

    method: str
    eta0: Tensor  # (G,)
    losses: Tensor  # (G, K+1)

    def final_losses(self, tail: float = 0.05) -> Tensor:
        """Mean loss over the last ``tail`` fraction of iterates; inf where the run diverged.

        A run diverged if a loss is non-finite or the final value exceeds f(X₀).
        """
        K = self.losses.shape[1] - 1
        n_tail = max(1, math.ceil(tail * (K + 1)))
        final = self.losses[:, -n_tail:].mean(1)
        bad = ~torch.isfinite(self.losses).all(1) | ~(final <= self.losses[:, 0])
        return torch.where(bad, torch.full_like(final, math.inf), final)

    def best(self) -> int | None:
        """Index of the η₀ with the smallest final loss, None if every run diverged."""
        final = self.final_losses()
        if not torch.isfinite(final).any():
            return None
        return int(final.argmin())


def run_spike_method(
    problem: LogisticProblem,
    method: str,
    eta0: Tensor | list[float],
    scale: float,
    iters: int,
    *,
    clip_c: float = 15.0,
    rank: int = 1,
    beta: float = 0.1,
    seed: int = 0,
) -> SpikeRuns:
    """Run ``method`` from X₀ = 0 once per η₀ (batched), with spikes of size ``scale`` = ℓ."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be finite and >= 0, got {scale!r}")
    if not 0 < beta <= 1:
        raise ValueError(f"beta must be in (0, 1], got {beta!r}")
    eta0 = torch.as_tensor(eta0, dtype=DTYPE).reshape(-1)
    if not bool((eta0 > 0).all()):
        raise ValueError(f"every eta0 must be > 0, got {eta0.tolist()}")
    gen = torch.Generator().manual_seed(seed)
    X = torch.zeros(eta0.numel(), *problem.shape, dtype=DTYPE)
    losses = torch.empty(eta0.numel(), iters + 1, dtype=DTYPE)
    M = None
    dead = torch.zeros(eta0.numel(), dtype=torch.bool)  # runs that left the floats
    for k in range(iters):
        loss, grad = problem.loss_and_grad(X)
        losses[:, k] = torch.where(dead, math.inf, loss)
        g = grad + spike_noise(problem.shape, rank, scale, gen)
        if method == "sgd":
            step = g
        elif method == "sgd_global_clip":
            step = global_clip(g, clip_c)
        elif method == "sgd_spectral_clip":
            step = hard_clip(g, clip_c)
        else:
            if method == "sgdm_pre_clip":
                g = hard_clip(g, clip_c)
            M = g if M is None else (1.0 - beta) * M + beta * g
            step = M
        X = X - (eta0 / math.sqrt(k + 1)).view(-1, 1, 1) * step
        dead |= ~torch.isfinite(X).flatten(1).all(1)
        if dead.any():  # keep the batch computable; these runs are already scored inf
            X = torch.where(dead.view(-1, 1, 1), 0.0, X)
            if M is not None:
                M = torch.where(dead.view(-1, 1, 1), 0.0, M)
    losses[:, iters] = torch.where(dead, math.inf, problem.loss(X))
    return SpikeRuns(method, eta0, losses)
