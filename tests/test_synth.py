"""Tests of the synthetic experiments ("Enhancing LLM Training via Spectral Clipping", Sec. 6.1).

Small instances, float64, references computed independently (autograd, float64 SVD, scipy).
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from spectra.ops import global_clip, hard_clip
from spectra.optim import SpectralOp
from spectra_lab.cli import main
from spectra_lab.synth.files import torch_threads
from spectra_lab.synth.frank_wolfe import (
    RunSchedule,
    composite_objective,
    composite_step,
    frank_wolfe_gap,
    frank_wolfe_step,
    post_clip_step,
    project_spectral_ball,
    run_post_clipping,
    solve_constrained,
    theorem_parameters,
)
from spectra_lab.synth.problem import LogisticProblem, make_logistic_data
from spectra_lab.synth.spikes import (
    SpikeConfig,
    SpikeRuns,
    run_spike_method,
    spike_noise,
    stiefel_polar,
)

F64 = torch.float64


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def small_data():
    return make_logistic_data(d=6, n_train=24, n_test=50, noise_std=5.0, seed=3)


def _random(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


# --------------------------------------------------------------------------- the problem


def test_logistic_gradient_matches_autograd(small_data):
    P = small_data.train
    X = _random((3, 6, 6), 0).requires_grad_()
    # f written independently: log(1 + exp(-y <A_i, X>)) averaged over samples
    mats = P.A.reshape(P.n, 6, 6)
    z = torch.einsum("nij,bij->bn", mats, X) * P.y
    ref = torch.log1p(torch.exp(-z)).mean(-1)
    (ref_grad,) = torch.autograd.grad(ref.sum(), X)
    loss, grad = P.loss_and_grad(X.detach())
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-14)
    idx = torch.tensor([1, 5, 7])
    loss_b, grad_b = P.loss_and_grad(X.detach(), idx)
    sub = LogisticProblem(P.A[idx], P.y[idx], P.shape)
    torch.testing.assert_close(grad_b, sub.loss_and_grad(X.detach())[1])
    torch.testing.assert_close(loss_b, sub.loss(X.detach()))


def test_logistic_constants_bound_the_gradient(small_data):
    P = small_data.train
    L, M = P.smoothness(), P.gradient_bound()
    for seed in range(5):
        X, Y = 3 * _random((6, 6), seed), 3 * _random((6, 6), seed + 10)
        gX, gY = P.loss_and_grad(X)[1], P.loss_and_grad(Y)[1]
        assert torch.linalg.matrix_norm(gX, ord=2) <= M
        assert torch.linalg.matrix_norm(gX - gY) <= L * torch.linalg.matrix_norm(X - Y)


# --------------------------------------------------------------------------- the update rule


@pytest.mark.parametrize("b", [0.05, 0.3, 2.0])
@pytest.mark.parametrize("radius", [0.2, 1.0, 5.0])
def test_frank_wolfe_form_equals_post_clipping_form(radius, b):
    X = project_spectral_ball(_random((5, 7), 1), radius)
    M = _random((5, 7), 2)
    # the subproblem solved independently: V = -U min(σ/b, D2) Vᵀ
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    V_ref = -(U * torch.clamp(S / b, max=radius)) @ Vh
    for k in (0, 1, 7, 100):
        gamma = 2.0 / (k + 2)
        p = theorem_parameters(radius, b, k)
        assert p.weight_decay * p.lr == pytest.approx(gamma)
        assert p.clip_c == pytest.approx(b * radius)
        clip_form = post_clip_step(
            X, M, lr=p.lr, weight_decay=p.weight_decay, clip_scale=p.clip_scale, post=hard(p)
        )
        fw_form = frank_wolfe_step(X, M, radius=radius, b=b, gamma=gamma)
        torch.testing.assert_close(clip_form, fw_form, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(fw_form, (1 - gamma) * X + gamma * V_ref)


def hard(p):
    """The Theorem's post operator: hard clipping at c = bD₂, exact."""
    return SpectralOp("hard_clip", p.clip_c, method="svd")


def test_b_zero_is_the_limit_of_post_clipping():
    radius, k = 1.5, 3
    X, M = _random((6, 6), 4), _random((6, 6), 5)
    sigma_min = float(torch.linalg.svdvals(M).min())
    limit = composite_step(X, M, radius, 0.0, k, form="clip")
    torch.testing.assert_close(limit, composite_step(X, M, radius, 0.0, k, form="fw"))
    # any b with b·D2 below σ_min(M) gives exactly the same step
    b = 0.5 * sigma_min / radius
    p = theorem_parameters(radius, b, k)
    small_b = post_clip_step(
        X, M, lr=p.lr, weight_decay=p.weight_decay, clip_scale=p.clip_scale, post=hard(p)
    )
    torch.testing.assert_close(limit, small_b, rtol=1e-12, atol=1e-12)
    U, _, Vh = torch.linalg.svd(M)
    gamma = 2.0 / (k + 2)
    torch.testing.assert_close(limit, (1 - gamma) * X - gamma * radius * U @ Vh)


@pytest.mark.parametrize("batch_size", [None, 8])
def test_both_forms_give_the_same_trajectory(small_data, batch_size):
    kw = dict(batch_size=batch_size, runs=2 if batch_size else 1, seed=7)
    for b in (0.0, 0.5):
        a = run_post_clipping(
            small_data.train, small_data.test, 1.0, b, RunSchedule(60, **kw), form="clip"
        )
        f = run_post_clipping(
            small_data.train, small_data.test, 1.0, b, RunSchedule(60, **kw), form="fw"
        )
        torch.testing.assert_close(a.final, f.final, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(a.objective, f.objective, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- convergence


@pytest.fixture(scope="module")
def full_batch_runs(small_data):
    out = {}
    with torch_threads(1):
        for radius in (0.2, 1.0, 5.0):
            for b in (0.0, 0.1, 1.0):
                sol = solve_constrained(small_data.train, radius, b, tol=1e-11)
                hist = run_post_clipping(
                    small_data.train, small_data.test, radius, b, RunSchedule(400)
                )
                out[radius, b] = (sol, hist)
    return out


def test_iterates_stay_in_the_spectral_ball(small_data, full_batch_runs):
    for (radius, _), (_, hist) in full_batch_runs.items():
        assert float(hist.spectral_norm.max()) <= radius * (1 + 1e-12)
    stoch = run_post_clipping(
        small_data.train, None, 0.5, 0.0, RunSchedule(100, batch_size=6, runs=3, seed=1)
    )
    assert float(stoch.spectral_norm.max()) <= 0.5 * (1 + 1e-12)


def test_residual_decays_below_the_theorem_bound(small_data, full_batch_runs):
    P = small_data.train
    L = P.smoothness()
    for (radius, b), (sol, hist) in full_batch_runs.items():
        resid = hist.objective[0] - sol.value
        K = resid.numel() - 1
        k = torch.arange(1, K + 1, dtype=F64)
        D_F = 2 * radius * math.sqrt(6)  # Frobenius diameter of the ball
        # F(X_k) − F* ≤ 2 C_f/(k+1) with C_f ≤ L_F D_F² (deterministic case, σ = 0)
        assert bool((resid[1:] <= 2 * L * D_F**2 / (k + 1)).all()), (radius, b)
        assert float(resid[1:].min()) >= -1e-10  # F* really is the minimum over the ball
        assert float(resid[-1]) < 0.1 * float(resid[0]), (radius, b)
        assert float(resid[-1]) < 1e-3, (radius, b)
        if b > 0:  # F is strongly convex: the iterates reach the minimizer
            assert float(torch.linalg.matrix_norm(hist.final[0] - sol.X)) < 1e-2


def test_stochastic_residual_decreases(small_data):
    sol = solve_constrained(small_data.train, 1.0, 0.1, tol=1e-11)
    hist = run_post_clipping(
        small_data.train, small_data.test, 1.0, 0.1, RunSchedule(400, batch_size=8, runs=4, seed=2)
    )
    resid = hist.objective.mean(0) - sol.value
    assert float(resid[-1]) < 0.1 * float(resid[1])
    assert float(resid[-1]) < 0.05


def test_larger_b_gives_smaller_frobenius_norm(full_batch_runs):
    for radius in (1.0, 5.0):
        norms = [float(full_batch_runs[radius, b][1].frobenius_norm[0, -1]) for b in (0, 0.1, 1)]
        assert norms[0] > norms[1] > norms[2], (radius, norms)


# --------------------------------------------------------------------------- the reference F*


def test_solver_matches_scipy_when_the_constraint_is_inactive(small_data):
    P, b = small_data.train, 1.0
    sol = solve_constrained(P, 10.0, b, tol=1e-12)
    assert float(torch.linalg.matrix_norm(sol.X, ord=2)) < 10.0

    def fun(x):
        X = torch.from_numpy(x).reshape(6, 6)
        f, g = P.loss_and_grad(X)
        return float(f) + 0.5 * b * float(x @ x), (g + b * X).reshape(-1).numpy()

    ref = minimize(fun, np.zeros(36), jac=True, method="L-BFGS-B", options={"gtol": 1e-12})
    assert sol.value == pytest.approx(ref.fun, abs=1e-10)
    np.testing.assert_allclose(sol.X.reshape(-1).numpy(), ref.x, atol=1e-5)


def test_solver_matches_scipy_slsqp_on_an_active_vector_ball():
    # a d × 1 "matrix": the spectral ball is the Euclidean ball, a smooth constraint for SLSQP
    gen = torch.Generator().manual_seed(11)
    A = torch.randn(30, 8, generator=gen, dtype=F64)
    y = torch.sign(A @ torch.randn(8, generator=gen, dtype=F64))
    P, radius, b = LogisticProblem(A, y, (8, 1)), 0.7, 0.05
    sol = solve_constrained(P, radius, b, tol=1e-12)
    assert float(torch.linalg.vector_norm(sol.X)) == pytest.approx(radius, rel=1e-9)

    def fun(x):
        X = torch.from_numpy(x).reshape(8, 1)
        f, g = P.loss_and_grad(X)
        return float(f) + 0.5 * b * float(x @ x), (g + b * X).reshape(-1).numpy()

    cons = {"type": "ineq", "fun": lambda x: radius**2 - x @ x, "jac": lambda x: -2 * x}
    ref = minimize(fun, np.zeros(8), jac=True, method="SLSQP", constraints=[cons], tol=1e-14)
    assert ref.success
    assert sol.value == pytest.approx(ref.fun, abs=1e-10)


def test_solver_agrees_with_plain_projected_gradient_and_certifies(small_data):
    P, radius, b = small_data.train, 0.3, 0.0
    sol = solve_constrained(P, radius, b, tol=1e-12)
    assert sol.gap < 1e-11 and sol.gap >= -1e-14
    # plain projected gradient, fixed step 1/L, from another (random) start
    L = P.smoothness()
    X = project_spectral_ball(_random((6, 6), 9), radius)
    for _ in range(3000):
        X = project_spectral_ball(X - P.loss_and_grad(X)[1] / L, radius)
    pg_value = float(composite_objective(P, X, b))
    assert sol.value == pytest.approx(pg_value, abs=1e-9)
    assert sol.value <= pg_value + 1e-12
    # the gap upper-bounds F(X) − F* at any feasible point
    Z = project_spectral_ball(_random((6, 6), 12), radius)
    assert float(composite_objective(P, Z, b)) - sol.value <= frank_wolfe_gap(P, Z, radius, b)


# --------------------------------------------------------------------------- spikes


def test_stiefel_polar_is_the_polar_factor():
    U = stiefel_polar(7, 3, torch.Generator().manual_seed(0))
    A = torch.randn(7, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    P, _, Qh = torch.linalg.svd(A, full_matrices=False)
    torch.testing.assert_close(U, P @ Qh)
    torch.testing.assert_close(U.mT @ U, torch.eye(3, dtype=F64))


def test_stiefel_polar_is_isotropic():
    gen = torch.Generator().manual_seed(1)
    d, r, n = 6, 2, 4000
    Us = torch.stack([stiefel_polar(d, r, gen) for _ in range(n)])
    mean_proj = (Us @ Us.mT).mean(0)
    # E[UUᵀ] = (r/d) I (bounded anisotropy, κ = 1) and E[U] = 0; Monte-Carlo error ~ 1/√n
    assert float((mean_proj - (r / d) * torch.eye(d, dtype=F64)).abs().max()) < 0.03
    assert float(Us.mean(0).abs().max()) < 0.04


def test_spike_noise_has_rank_r_and_norm_ell():
    N = spike_noise((9, 12), 2, 100.0, torch.Generator().manual_seed(0))
    s = torch.linalg.svdvals(N)
    torch.testing.assert_close(s[:2], torch.full((2,), 100.0, dtype=F64))
    assert float(s[2:].max()) < 1e-10


def test_clipping_lemmas_hold_for_the_spike_generator():
    # Lemma "sp-clip-large-ell" (r = 1, q = 30 ≥ 25) and Lemma "global-clip-large-ell"
    gen = torch.Generator().manual_seed(5)
    d, ell, c = 30, 200.0, 1.0
    G = _random((d, d), 6)
    G = G / torch.linalg.matrix_norm(G, ord=2)  # ‖G‖₂ = 1 = c, ℓ ≥ 9‖G‖₂ and ≥ 3‖G‖_F
    g = torch.stack([G + spike_noise((d, d), 1, ell, gen) for _ in range(400)])
    sp, gl = hard_clip(g, c), global_clip(g, c)
    G_F2 = float(G.square().sum())
    assert float((sp * G).sum((-2, -1)).mean()) >= G_F2 / 3
    assert float(sp.square().sum((-2, -1)).mean()) <= c**2 + G_F2
    assert float((gl * G).sum((-2, -1)).mean()) <= c / ell * G_F2 * 1.05


def test_final_losses_mark_divergence():
    losses = torch.tensor(
        [[0.7, 0.5, 0.4, 0.3], [0.7, 0.9, 1.0, 2.0], [0.7, math.nan, 0.1, 0.1]], dtype=F64
    )
    runs = SpikeRuns("sgd", torch.tensor([0.1, 1.0, 10.0], dtype=F64), losses)
    final = runs.final_losses(tail=0.5)
    assert final[0] == pytest.approx(0.35)
    assert math.isinf(final[1]) and math.isinf(final[2])
    assert runs.best() == 0


@pytest.fixture(scope="module")
def spike_problem():
    return make_logistic_data(d=20, n_train=40, n_test=0, noise_std=5.0, seed=0).train


def test_spectral_clipping_converges_where_sgd_diverges(spike_problem):
    etas = [0.1, 1.0]
    with torch_threads(1):
        cfg = SpikeConfig(eta_grid=etas, iters=150)
        sgd = run_spike_method(spike_problem, "sgd", 1000.0, cfg, seed=1)
        gclip = run_spike_method(spike_problem, "sgd_global_clip", 1000.0, cfg, seed=1)
        spclip = run_spike_method(spike_problem, "sgd_spectral_clip", 1000.0, cfg, seed=1)
    assert bool(torch.isinf(sgd.final_losses()).all())
    assert bool(torch.isinf(gclip.final_losses()).all())
    assert bool((spclip.final_losses() < 0.5 * math.log(2)).all())


def test_spectral_clipping_is_inactive_below_the_threshold(spike_problem):
    # ℓ + ‖∇f‖₂ < c: nothing is clipped, so both runs see identical steps
    cfg = SpikeConfig(eta_grid=(0.1,), iters=30)
    a = run_spike_method(spike_problem, "sgd", 5.0, cfg, seed=2)
    b = run_spike_method(spike_problem, "sgd_spectral_clip", 5.0, cfg, seed=2)
    torch.testing.assert_close(a.losses, b.losses)


def test_pre_clipping_helps_momentum_under_large_spikes(spike_problem):
    etas = [1e-3, 1e-2, 0.1, 1.0]
    with torch_threads(1):
        cfg = SpikeConfig(eta_grid=etas, iters=150)
        plain = run_spike_method(spike_problem, "sgdm", 1000.0, cfg, seed=3)
        pre = run_spike_method(spike_problem, "sgdm_pre_clip", 1000.0, cfg, seed=3)
    best_plain = float(plain.final_losses().min())
    best_pre = float(pre.final_losses().min())
    assert best_pre < 0.2 * best_plain


def test_bad_arguments_are_rejected(spike_problem):
    with pytest.raises(ValueError, match="method"):
        run_spike_method(spike_problem, "adam", 1.0, SpikeConfig(eta_grid=(0.1,), iters=5))
    with pytest.raises(ValueError, match="eta0"):
        run_spike_method(spike_problem, "sgd", 1.0, SpikeConfig(eta_grid=(0.0,), iters=5))
    with pytest.raises(ValueError, match="radius"):
        theorem_parameters(-1.0, 0.1, 0)
    with pytest.raises(ValueError, match="b must"):
        theorem_parameters(1.0, -0.1, 0)
    with pytest.raises(ValueError, match="r <= d"):
        stiefel_polar(3, 4, torch.Generator())


# --------------------------------------------------------------------------- CLI


def test_cli_quick_writes_results_and_figures(tmp_path, capsys):
    out = tmp_path / "synth"
    rc = main(["synth", "all", "--out", str(out), "--quick", "--iters", "40", "--no-progress"])
    assert rc == 0
    names = {p.name for p in out.iterdir()}
    expected = {
        "fw_curves.csv",
        "fw_summary.json",
        "fw_D2_0.2.png",
        "fw_D2_1.png",
        "fw_D2_5.png",
        "fw_D2_1_stochastic.png",
        "spikes_grid.csv",
        "spikes_curves.csv",
        "spikes_summary.json",
        "spikes_sgd.png",
        "spikes_sgdm.png",
        "spikes_tuning.png",
    }
    assert names == expected  # and no temporary files left behind
    for name in expected:
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fw = json.loads((out / "fw_summary.json").read_text())
    assert len(fw["runs"]) == 12 and all(r["iters"] == 40 for r in fw["runs"])
    for r in fw["runs"]:
        assert r["max_spectral_norm"] <= r["radius"] * (1 + 1e-12)
    with open(out / "spikes_grid.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * 5 * 5
    spikes = json.loads((out / "spikes_summary.json").read_text())
    assert {c["method"] for c in spikes["chosen"]} == {
        "sgd",
        "sgd_global_clip",
        "sgd_spectral_clip",
        "sgdm",
        "sgdm_pre_clip",
    }
    assert str(out / "fw_summary.json") in capsys.readouterr().out


def test_cli_rejects_bad_iters(tmp_path, capsys):
    assert main(["synth", "fw", "--out", str(tmp_path), "--iters", "0"]) == 2
    assert "--iters" in capsys.readouterr().err


def test_tuning_figure_keeps_each_methods_colour_across_panels(tmp_path, monkeypatch):
    from matplotlib.colors import to_hex

    from spectra_lab.synth import cli as synth_cli

    figures = {}
    monkeypatch.setattr(
        synth_cli, "save_figure", lambda fig, path: figures.setdefault(path.name, fig)
    )
    argv = ["synth", "spikes", "--out", str(tmp_path), "--quick", "--iters", "20", "--no-progress"]
    assert main(argv) == 0
    fig = figures["spikes_tuning.png"]
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    colours = {}
    for ax in fig.axes:
        for line in ax.lines:
            colours.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
    assert len(colours) == 5 and all(len(c) == 1 for c in colours.values())
    assert len({c.pop() for c in colours.values()}) == 5
