"""The SPECTRA update against the paper's theory: the spectral-norm bound of one step, and the
composite Frank–Wolfe convergence of SGD-M with spectral clipping."""

from __future__ import annotations

import math

import pytest
import torch

import spectra.optim as so

pytestmark = pytest.mark.usefixtures("one_thread")


OPTIMIZERS = {
    "AdamW": lambda ps, **kw: so.AdamW(ps, lr=5e-2, **kw),
    "Signum": lambda ps, **kw: so.Signum(ps, lr=5e-2, **kw),
    "AdEMAMix": lambda ps, **kw: so.AdEMAMix(ps, lr=5e-2, **kw),
    "MARS": lambda ps, **kw: so.MARS(ps, lr=5e-2, **kw),
    "SGDM": lambda ps, **kw: so.SGDM(ps, lr=5e-2, momentum=0.5, **kw),
    "Spectra(torch AdamW)": lambda ps, **kw: so.Spectra(
        torch.optim.AdamW(ps, lr=5e-2, weight_decay=0.1), **kw
    ),
    "Spectra(torch SGD)": lambda ps, **kw: so.Spectra(
        torch.optim.SGD(ps, lr=5e-2, momentum=0.9), **kw
    ),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("post", ["soft_clip", "hard_clip"])
def test_step_spectral_norm_is_at_most_alpha_lr_c(name, post):
    # ‖X_{k+1} − (1−λη_k)X_k‖₂ ≤ α η_k c_k, checked with a float64 SVD, under an LR warmup
    # where the "standard" schedule makes c_k = c·η/η_k.
    g = torch.Generator().manual_seed(3)
    shapes = [(12, 5), (5, 12), (7, 7)]
    ps = [torch.randn(s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]
    c, warmup = 0.05, 3
    lr_fn = so.wsd_schedule(warmup, 20)
    clip_schedule = so.standard_clip_schedule(lr_fn, warmup)
    opt = OPTIMIZERS[name](ps, clip_c=c, post=post, clip_schedule=clip_schedule)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_fn)
    peak = opt.param_groups[0]["initial_lr"]
    for k in range(8):
        lr = opt.param_groups[0]["lr"]
        lam = opt.param_groups[0].get("weight_decay", 0.0)
        c_k = c * peak / lr if k < warmup else c
        before = [p.detach().clone() for p in ps]
        for p in ps:
            # Large, spiky gradients so that the clip is active.
            p.grad = 50 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.grad += 1e3 * torch.outer(
                torch.randn(p.shape[0], generator=g, dtype=torch.float64),
                torch.randn(p.shape[1], generator=g, dtype=torch.float64),
            )
        opt.step()
        for p, x in zip(ps, before, strict=True):
            m, n = p.shape
            alpha = max(1.0, math.sqrt(m / n))
            step = p.detach() - (1 - lam * lr) * x
            norm = torch.linalg.matrix_norm(step, ord=2).item()
            # The float64 Gram route of hard_clip resolves σ to ≈ ε·(σ_max/σ)²: up to ~1e-9
            # relative on these spiked gradients (σ_max/c_k ≈ 1e6), depending on the LAPACK build.
            assert norm <= alpha * lr * c_k * (1 + 1e-8)
        sched.step()


def logistic_problem(seed=0, n=60, m=8, d=6):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, m, d, generator=g, dtype=torch.float64)
    X_true = torch.randn(m, d, generator=g, dtype=torch.float64)
    noise = 2.0 * torch.randn(n, generator=g, dtype=torch.float64)
    y = torch.sign((A * X_true).sum((1, 2)) + noise)
    return A, y


def logistic_loss(X, A, y):
    return torch.nn.functional.softplus(-y * (A * X).sum((1, 2))).mean()


def logistic_grad(X, A, y):
    s = torch.sigmoid(-y * (A * X).sum((1, 2)))
    return -((y * s)[:, None, None] * A).mean(0)


def composite(X, A, y, b):
    return (logistic_loss(X, A, y) + 0.5 * b * (X**2).sum()).item()


def projected_gradient_optimum(A, y, b, D2, iters=400):
    """argmin_{‖X‖₂≤D₂} f(X) + b/2‖X‖_F² by accelerated projected gradient (FISTA) with the
    exact projection onto the spectral ball (float64 SVD, singular values clipped at D₂)."""
    n = A.shape[0]
    L = torch.linalg.matrix_norm(A.reshape(n, -1), ord=2).item() ** 2 / (4 * n) + b
    X = torch.zeros(A.shape[1:], dtype=torch.float64)
    Z, t = X.clone(), 1.0
    for _ in range(iters):
        Y = Z - (logistic_grad(Z, A, y) + b * Z) / L
        U, S, Vh = torch.linalg.svd(Y, full_matrices=False)
        X_next = (U * S.clamp(max=D2)) @ Vh
        t_next = (1 + math.sqrt(1 + 4 * t * t)) / 2
        Z = X_next + (t - 1) / t_next * (X_next - X)
        X, t = X_next, t_next
    return X


def frank_wolfe_sgdm(X: torch.Tensor, b: float, D2: float, **kw):
    """SGDM with the Frank–Wolfe theorem's settings: β = 1 (momentum 0), c = bD₂, α = λ/b,
    λη_k = 2/(k+2)."""
    lam = 1.0 / D2
    opt = so.SGDM(
        [X],
        lr=2.0 / lam,
        momentum=0.0,
        weight_decay=lam,
        clip_c=b * D2,
        clip_scale=lam / b,
        **kw,
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (k + 2))


def test_sgdm_with_spectral_clipping_is_composite_frank_wolfe():
    # Theorem (SGD-M with spectral clipping as composite Frank–Wolfe): β = 1, c = bD₂,
    # α = λ/b, λη_k = 2/(k+2) minimise F = f + b/2‖X‖_F² over the ball ‖X‖₂ ≤ D₂.
    A, y = logistic_problem()
    b, D2 = 0.1, 0.5
    X_star = projected_gradient_optimum(A, y, b, D2)
    F_star = composite(X_star, A, y, b)
    # The constraint is active: the unconstrained minimiser lies outside the ball.
    assert torch.linalg.matrix_norm(X_star, ord=2).item() == pytest.approx(D2, rel=1e-9)
    X_free = projected_gradient_optimum(A, y, b, 100.0)
    assert torch.linalg.matrix_norm(X_free, ord=2).item() > 1.5 * D2

    X = torch.zeros(A.shape[1:], dtype=torch.float64, requires_grad=True)
    opt, sched = frank_wolfe_sgdm(X, b, D2, post="hard_clip")
    residuals, norms = [], []
    for _ in range(600):
        X.grad = logistic_grad(X.detach(), A, y)
        residuals.append(composite(X.detach(), A, y, b) - F_star)
        opt.step()
        sched.step()
        norms.append(torch.linalg.matrix_norm(X.detach(), ord=2).item())

    assert max(norms) <= D2 * (1 + 1e-12)
    assert min(residuals) > -1e-12  # F* is the minimum
    assert residuals[-1] < 1e-5
    assert residuals[-1] < residuals[10] / 100
    torch.testing.assert_close(X.detach(), X_star, rtol=0, atol=1e-4)


def test_soft_clipped_sgdm_iterates_stay_in_the_spectral_ball():
    # h_c(σ) < c, so the soft clip keeps X in the ball ‖X‖₂ ≤ αc/λ as well.
    A, y = logistic_problem(seed=1)
    b, D2 = 0.1, 0.5
    X = torch.zeros(A.shape[1:], dtype=torch.float64, requires_grad=True)
    opt, sched = frank_wolfe_sgdm(X, b, D2)
    values = []
    for _ in range(300):
        opt.zero_grad()
        loss = logistic_loss(X, A, y)
        loss.backward()
        values.append(loss.item() + 0.5 * b * (X.detach() ** 2).sum().item())
        opt.step()
        sched.step()
        assert torch.linalg.matrix_norm(X.detach(), ord=2).item() <= D2 * (1 + 1e-12)
    assert values[-1] < values[1]
