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
from dataclasses import dataclass, field

import torch
from torch import Tensor

from spectra.ops import global_clip, hard_clip
from spectra_lab.synth.problem import DTYPE, LogisticProblem

SGD_METHODS = ("sgd", "sgd_global_clip", "sgd_spectral_clip")
MOMENTUM_METHODS = ("sgdm", "sgdm_pre_clip")
METHODS = SGD_METHODS + MOMENTUM_METHODS


def default_eta_grid() -> tuple[float, ...]:
    """η₀ ∈ {10⁻⁵, 10^{-4.5}, …, 10¹}: half-decades."""
    return tuple(10 ** (e / 2) for e in range(-10, 3))


@dataclass(frozen=True)
class SpikeConfig:
    """Experiment 2: the data (``d × d`` matrices, ``n`` samples, label noise ``noise_std``),
    the spike sizes ℓ (``scales``) and ``rank``, the threshold ``clip_c``, the momentum
    ``beta``, the η₀ grid, the methods, the steps per run (``iters``) and the data's seed."""

    d: int = 50
    n: int = 100
    noise_std: float = 5.0
    scales: tuple[float, ...] = (10.0, 100.0, 1000.0)  # ℓ
    rank: int = 1
    clip_c: float = 15.0
    beta: float = 0.1
    eta_grid: tuple[float, ...] = field(default_factory=default_eta_grid)
    methods: tuple[str, ...] = METHODS
    iters: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; expected a subset of {METHODS}")
        if not self.eta_grid or any(not (e > 0) for e in self.eta_grid):
            raise ValueError(f"eta_grid must be non-empty and every eta0 > 0, got {self.eta_grid}")
        if not 1 <= self.rank <= self.d:
            raise ValueError(f"rank must be in [1, d={self.d}], got {self.rank}")
        if self.iters < 1:
            raise ValueError(f"iters must be >= 1, got {self.iters}")


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
    problem: LogisticProblem, method: str, scale: float, cfg: SpikeConfig, *, seed: int = 0
) -> SpikeRuns:
    """Run ``method`` from X₀ = 0 once per η₀ of ``cfg.eta_grid`` (batched), ``cfg.iters``
    steps, with spikes of size ``scale`` = ℓ and rank ``cfg.rank``, threshold ``cfg.clip_c``
    and momentum ``cfg.beta``; ``seed`` seeds the noise (``cfg``'s data fields and seed are
    not read: the data are ``problem``)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
    if not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be finite and >= 0, got {scale!r}")
    iters, clip_c, rank, beta = cfg.iters, cfg.clip_c, cfg.rank, cfg.beta
    if not 0 < beta <= 1:
        raise ValueError(f"beta must be in (0, 1], got {beta!r}")
    eta0 = torch.as_tensor(cfg.eta_grid, dtype=DTYPE).reshape(-1)
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
