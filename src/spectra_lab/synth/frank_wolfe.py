"""Post-spectral clipping as a composite Frank–Wolfe method, and a reference solver.

"Enhancing LLM Training via Spectral Clipping", Sec. 3. The update (SGDM-spectral-clipping)

    X_{k+1} = (1 − λη_k) X_k − αη_k clip^sp_c(M_k),
    M_{k+1} = (1 − β_k) M_k + β_k g(X_{k+1}),

is (Proposition "Frank–Wolfe reformulation") the composite Frank–Wolfe method

    V_{k+1} = argmin_{‖V‖₂ ≤ D₂} ⟨M_k, V⟩ + (b/2)‖V‖_F²,
    X_{k+1} = (1 − γ_k) X_k + γ_k V_{k+1},

for ``min_{‖X‖₂ ≤ D₂} F(X) = f(X) + (b/2)‖X‖_F²`` with γ_k = λη_k, c = λD₂/α, b = λ/α.
The Theorem's parameters are 1/λ = D₂, α = λ/b, c = bD₂, λη_k = 2/(k+2), and either β_k = 1
(full batch) or β_k = (k+1)^{-2/3} with M₀ = g(X₀).

For b = 0 the Theorem's α is infinite and c is 0; the update is their limit. When
bD₂ ≤ σ_min(M), clip^sp_{bD₂}(M) = bD₂·orth(M), so αη·clip^sp_{bD₂}(M) = (λ/b)η·bD₂·orth(M)
= γ D₂ orth(M) for every b small enough, and the step becomes X ← (1 − γ)X − γD₂·orth(M):
the pure spectral LMO step (Muon's direction), the paper's "Connection to Muon".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from spectra.ops import spectral_lmo
from spectra.optim.chain import spectra_step
from spectra.optim.plan import ParamPlan, SpectralOp
from spectra_lab.synth.problem import DTYPE, LogisticProblem

StepForm = Literal["clip", "fw"]


# --------------------------------------------------------------------------- the two update forms


def post_clip_step(
    X: Tensor, M: Tensor, *, lr: float, weight_decay: float, clip_scale: float, post: SpectralOp
) -> Tensor:
    """Eq. (SGDM-spectral-clipping): ``X ← (1 − λη)X − αη·post(M)``, through the SPECTRA chain.

    ``X`` and ``M`` are ``(runs, m, p)`` batches (or single matrices); ``M`` is the direction.
    Returns the new iterate; the inputs are not modified.
    """
    X = X.clone()
    U = M.clone()
    Xs = list(X.reshape(-1, *X.shape[-2:]).unbind(0))
    Us = list(U.reshape(-1, *U.shape[-2:]).unbind(0))
    plan = ParamPlan(lr, weight_decay, shape=tuple(X.shape[-2:]), post=post, scale=clip_scale)
    spectra_step(Xs, Us, [plan] * len(Xs), lambda idx, g: g)
    return X


def frank_wolfe_step(X: Tensor, M: Tensor, *, radius: float, b: float, gamma: float) -> Tensor:
    """Composite Frank–Wolfe: ``V = argmin_{‖V‖₂≤D₂} ⟨M,V⟩ + (b/2)‖V‖_F²``, ``X ← (1−γ)X + γV``."""
    V = spectral_lmo(M, radius, "frobenius", b)
    return (1.0 - gamma) * X + gamma * V


@dataclass(frozen=True)
class TheoremParameters:
    """Step-k parameters of the Theorem: 1/λ = D₂, α = λ/b, c = bD₂, λη_k = 2/(k+2)."""

    lr: float  # η_k
    weight_decay: float  # λ
    clip_scale: float  # α (inf for b = 0)
    clip_c: float  # c (0 for b = 0)


def theorem_parameters(radius: float, b: float, k: int) -> TheoremParameters:
    """The Theorem's (η_k, λ, α, c) for the constraint radius D₂ and regularization b."""
    if not (math.isfinite(radius) and radius > 0):
        raise ValueError(f"radius must be finite and > 0, got {radius!r}")
    if not (math.isfinite(b) and b >= 0):
        raise ValueError(f"b must be finite and >= 0, got {b!r}")
    lam = 1.0 / radius
    gamma = 2.0 / (k + 2)
    alpha = lam / b if b > 0 else math.inf
    return TheoremParameters(lr=gamma / lam, weight_decay=lam, clip_scale=alpha, clip_c=b * radius)


def composite_step(
    X: Tensor, M: Tensor, radius: float, b: float, k: int, form: StepForm = "clip"
) -> Tensor:
    """Step k of the method with the Theorem's parameters, in either form.

    ``form="clip"`` runs eq. (SGDM-spectral-clipping) (its b → 0 limit when b = 0, see the
    module docstring); ``form="fw"`` runs the Frank–Wolfe form. The two agree exactly.
    """
    if form == "fw":
        return frank_wolfe_step(X, M, radius=radius, b=b, gamma=2.0 / (k + 2))
    if form != "clip":
        raise ValueError(f"unknown form {form!r}; expected 'clip' or 'fw'")
    p = theorem_parameters(radius, b, k)
    if b == 0:
        # The b → 0 limit: λη = γ_k and αη = γ_k·D₂ with α = λD₂ = 1, around orth.
        post, scale = SpectralOp("orthogonalize", method="svd"), 1.0
    else:
        post, scale = SpectralOp("hard_clip", p.clip_c, method="svd"), p.clip_scale
    return post_clip_step(X, M, lr=p.lr, weight_decay=p.weight_decay, clip_scale=scale, post=post)


# --------------------------------------------------------------------------- the run


def composite_objective(problem: LogisticProblem, X: Tensor, b: float) -> Tensor:
    """``F(X) = f(X) + (b/2)‖X‖_F²``."""
    return problem.loss(X) + 0.5 * b * X.square().sum((-2, -1))


@dataclass(frozen=True)
class RunHistory:
    """Metrics of X₀, …, X_K (index k is the iterate X_k); leading dim = independent runs."""

    objective: Tensor  # F(X_k) on the training set, (runs, K+1)
    test_loss: Tensor  # f_test(X_k), (runs, K+1)
    spectral_norm: Tensor  # ‖X_k‖₂
    frobenius_norm: Tensor  # ‖X_k‖_F
    final: Tensor  # X_K, (runs, m, p)


def _minibatch_grad(problem: LogisticProblem, X: Tensor, idx: Tensor) -> Tensor:
    """Per-run minibatch gradients: ``X`` is (runs, m, p), ``idx`` is (runs, B)."""
    A, y = problem.A[idx], problem.y[idx]  # (runs, B, D), (runs, B)
    z = torch.einsum("rd,rbd->rb", X.reshape(X.shape[0], -1), A) * y
    coef = -y * torch.sigmoid(-z) / idx.shape[1]
    return torch.einsum("rb,rbd->rd", coef, A).reshape(X.shape)


@dataclass(frozen=True)
class RunSchedule:
    """How one call of :func:`run_post_clipping` samples: the number of steps (``iters``), the
    minibatch size (``batch_size``; ``None``: full batch), the number of independent runs
    (``runs``) and the ``seed`` of their minibatch draws."""

    iters: int
    batch_size: int | None = None
    runs: int = 1
    seed: int = 0


def run_post_clipping(
    train: LogisticProblem,
    test: LogisticProblem | None,
    radius: float,
    b: float,
    schedule: RunSchedule,
    *,
    form: StepForm = "clip",
    X0: Tensor | None = None,
) -> RunHistory:
    """Run SGD-M with post-spectral clipping under the Theorem's parameters.

    Full batch (``schedule.batch_size=None``) uses β_k = 1; otherwise each of
    ``schedule.runs`` independent runs draws minibatches of ``batch_size`` samples without
    replacement and uses β_k = (k+1)^{-2/3} with M₀ = g(X₀). ``X0`` defaults to 0.
    """
    iters, batch_size, runs = schedule.iters, schedule.batch_size, schedule.runs
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if batch_size is not None and not (1 <= batch_size <= train.n):
        raise ValueError(f"batch_size must be in [1, {train.n}], got {batch_size}")
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    gen = torch.Generator().manual_seed(schedule.seed)
    X = torch.zeros(runs, *train.shape, dtype=DTYPE) if X0 is None else X0.expand(runs, -1, -1)
    X = X.clone()

    def gradient(X: Tensor) -> Tensor:
        if batch_size is None:
            return train.loss_and_grad(X)[1]
        idx = torch.rand(runs, train.n, generator=gen).argsort(-1)[:, :batch_size]
        return _minibatch_grad(train, X, idx)

    metrics = torch.empty(4, runs, iters + 1, dtype=DTYPE)

    def record(k: int, X: Tensor) -> None:
        metrics[0, :, k] = composite_objective(train, X, b)
        metrics[1, :, k] = test.loss(X) if test is not None else math.nan
        metrics[2, :, k] = torch.linalg.matrix_norm(X, ord=2)
        metrics[3, :, k] = torch.linalg.matrix_norm(X)

    record(0, X)
    M = gradient(X)
    for k in range(iters):
        X = composite_step(X, M, radius, b, k, form)
        record(k + 1, X)
        if k + 1 < iters:
            beta = 1.0 if batch_size is None else (k + 1) ** (-2.0 / 3.0)
            M = gradient(X) if beta == 1.0 else (1.0 - beta) * M + beta * gradient(X)
    return RunHistory(*metrics, final=X)


# --------------------------------------------------------------------------- reference solver


def project_spectral_ball(X: Tensor, radius: float) -> Tensor:
    """Euclidean projection onto ``{‖X‖₂ ≤ D₂}``: clamp the singular values at D₂ (float64 SVD)."""
    U, S, Vh = torch.linalg.svd(X, full_matrices=False)
    return (U * S.clamp(max=radius).unsqueeze(-2)) @ Vh


def frank_wolfe_gap(problem: LogisticProblem, X: Tensor, radius: float, b: float) -> float:
    """``max_{‖V‖₂≤D₂} ⟨∇F(X), X − V⟩ = ⟨∇F(X), X⟩ + D₂‖∇F(X)‖_*``.

    For convex F and feasible X this bounds ``F(X) − F*`` from above (a certificate).
    """
    G = problem.loss_and_grad(X)[1] + b * X
    nuclear = torch.linalg.matrix_norm(G, ord="nuc")
    return float((G * X).sum() + radius * nuclear)


@dataclass(frozen=True)
class ConstrainedSolution:
    X: Tensor
    value: float  # F(X), an upper bound on F*
    gap: float  # Frank–Wolfe gap at X: F(X) − F* ≤ gap
    iters: int


def solve_constrained(
    problem: LogisticProblem,
    radius: float,
    b: float,
    *,
    tol: float = 1e-11,
    max_iter: int = 100_000,
    X0: Tensor | None = None,
) -> ConstrainedSolution:
    """``min_{‖X‖₂ ≤ D₂} f(X) + (b/2)‖X‖_F²`` by accelerated projected gradient (FISTA).

    Exact projection onto the spectral ball; the step 1/L is found by backtracking that may
    also grow the step (Scheinberg, Goldfarb & Bai, 2014), with L accepted once
    ``⟨∇F(X⁺) − ∇F(Y), X⁺ − Y⟩ ≤ L‖X⁺ − Y‖²`` (a round-off-safe local Lipschitz test) and never
    above the global bound σ_max(Ã)²/(4n) + b; momentum uses the gradient restart of
    O'Donoghue & Candès (2015). Stops once the Frank–Wolfe gap, an upper bound on
    F(X) − F* that does not depend on how X was found, is below ``tol``.
    """
    L_max = problem.smoothness() + b

    def value_grad(Z: Tensor) -> tuple[float, Tensor]:
        f, g = problem.loss_and_grad(Z)
        return float(f) + 0.5 * b * float(Z.square().sum()), g + b * Z

    X = project_spectral_ball(
        torch.zeros(problem.shape, dtype=DTYPE) if X0 is None else X0.to(DTYPE), radius
    )
    Y, t, L = X.clone(), 1.0, L_max
    it = 0
    for it in range(1, max_iter + 1):
        G = value_grad(Y)[1]
        L_new = 0.5 * L
        while True:
            X_new = project_spectral_ball(Y - G / L_new, radius)
            D = X_new - Y
            if L_new >= L_max or float(((value_grad(X_new)[1] - G) * D).sum()) <= L_new * float(
                D.square().sum()
            ):
                break
            L_new = min(2.0 * L_new, L_max)
        if float(((Y - X_new) * (X_new - X)).sum()) > 0:  # momentum points uphill: restart
            t = 1.0
            Y = X_new
        else:
            t_new = 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * t * t * L_new / L))
            Y = X_new + ((t - 1.0) / t_new) * (X_new - X)
            t = t_new
        X, L = X_new, L_new
        if it % 25 == 0 and frank_wolfe_gap(problem, X, radius, b) < tol:
            break
    value = float(composite_objective(problem, X, b))
    return ConstrainedSolution(X, value, frank_wolfe_gap(problem, X, radius, b), it)
