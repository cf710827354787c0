"""SpectralMonitor: its spectra against float64 SVD and closed forms, its step bound, and that it
never changes the trajectory."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import spectra
from spectra.monitor import SpectralMonitor, spike_score, stable_rank, top_singular_values
from spectra.ops import soft_clip_method

#: How far above SPECTRA's bound α·η·c a step's spectral norm may be: the default clip is exact
#: (eigh) or, for float32 on a CPU with bf16 units, "mixed", whose bf16 steps put the largest
#: singular value of these small matrices up to ~1% above c (0.3% on 192 × 512)
BOUND_SLACK = 2e-2 if soft_clip_method("auto", torch.device("cpu")) == "mixed" else 1e-6


def planted(m: int, n: int, s: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``U diag(s) Vᵀ`` with random orthonormal U, V (float64)."""
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(m, len(s), generator=g, dtype=torch.float64)).Q
    V = torch.linalg.qr(torch.randn(n, len(s), generator=g, dtype=torch.float64)).Q
    return U @ torch.diag(s) @ V.T


def separated_spectrum(r: int) -> torch.Tensor:
    """Four well-separated top values above a bulk in [0.1, 0.5]."""
    bulk = torch.linspace(0.5, 0.1, r - 4, dtype=torch.float64)
    return torch.cat([torch.tensor([10.0, 7.0, 5.0, 3.5], dtype=torch.float64), bulk])


@pytest.mark.parametrize("shape", [(64, 48), (40, 96), (8, 6, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_top_singular_values_match_float64_svd_on_planted_spectrum(shape, dtype):
    m, n = shape[0], math.prod(shape[1:])
    s = separated_spectrum(min(m, n))
    A = planted(m, n, s).reshape(shape).to(dtype)
    exact = torch.linalg.svdvals(A.reshape(m, -1).double())[:4]
    gen = torch.Generator().manual_seed(1)
    got = top_singular_values(A, k=4, iters=8, generator=gen)
    assert got.dtype == torch.float64 and got.shape == (4,)
    assert torch.allclose(exact, s[:4], rtol=1e-6)
    assert ((got - exact).abs() / exact).max() <= 1e-3
    assert torch.allclose(top_singular_values(A, k=4, method="svd"), exact, rtol=1e-6)


def test_spike_score_and_stable_rank_match_closed_forms_of_planted_spectrum():
    m, n = 64, 48
    s = separated_spectrum(n)
    A = planted(m, n, s)
    sigma = top_singular_values(A, generator=torch.Generator().manual_seed(0))
    fro = float(torch.linalg.vector_norm(A))
    rms = math.sqrt(float((s**2).sum()) / n)
    assert spike_score(float(sigma[0]), fro, (m, n)) == pytest.approx(10.0 / rms, rel=1e-6)
    assert stable_rank(float(sigma[0]), fro) == pytest.approx(float((s**2).sum()) / 100.0, rel=1e-6)
    # a flat spectrum scores 1, a rank-one matrix √min(m, n)
    assert spike_score(1.0, math.sqrt(n), (m, n)) == pytest.approx(1.0)
    assert spike_score(2.0, 2.0, (m, n)) == pytest.approx(math.sqrt(n))


def test_monitor_reports_spike_and_stable_rank_of_planted_gradient_and_update():
    m, n = 32, 24
    s = separated_spectrum(n)
    G = planted(m, n, s, seed=3).float()
    w = nn.Parameter(torch.zeros(m, n))
    opt = torch.optim.SGD([w], lr=0.5)
    mon = SpectralMonitor(optimizer=opt, params=[("w", w)], every=1)
    w.grad = G.clone()
    mon.before_step()
    opt.step()
    out = mon.after_step()
    rms = math.sqrt(float((s**2).sum()) / n)
    stable = float((s**2).sum()) / 100.0
    assert out["spectral/w/grad_sigma_max"] == pytest.approx(10.0, rel=1e-4)
    assert out["spectral/w/grad_sigma_4"] == pytest.approx(3.5, rel=1e-3)
    assert out["spectral/w/grad_spike"] == pytest.approx(10.0 / rms, rel=1e-4)
    # ΔX = −0.5 G: the same spectrum, halved
    assert out["spectral/w/update_sigma_max"] == pytest.approx(5.0, rel=1e-4)
    assert out["spectral/w/update_spike"] == pytest.approx(10.0 / rms, rel=1e-4)
    assert out["spectral/w/update_stable_rank"] == pytest.approx(stable, rel=1e-4)
    assert out["spectral/w/weight_fro"] == pytest.approx(0.5 * float(G.norm()), rel=1e-6)
    assert out["spectral/w/weight_linf"] == pytest.approx(0.5 * float(G.abs().max()), rel=1e-6)
    assert out["spectral/max_grad_spike"] == out["spectral/w/grad_spike"]
    assert "spectral/w/step_norm_over_bound" not in out  # no c_k for a torch optimizer


def test_step_norm_over_bound_at_most_one_for_adamw_soft_clip_and_c_k_is_clip_threshold():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = spectra.AdamW(
        model.parameters(),
        lr=0.05,
        weight_decay=0.1,
        clip_c=0.05,
        post="soft_clip",
        clip_schedule=lambda k: 1.0 + 0.25 * k,
    )
    mon = SpectralMonitor(model, opt, every=2)
    watched = {name for name, _ in mon.watched}
    assert watched == {"0.weight", "2.weight"}
    seen = 0
    for step in range(6):
        x, y = torch.randn(32, 12), torch.randn(32, 4)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        c_k = opt.clip_threshold()
        mon.before_step()
        opt.step()
        out = mon.after_step()
        if step % 2:
            assert out == {}
            continue
        seen += 1
        assert c_k == pytest.approx(0.05 * (1.0 + 0.25 * step))
        for name in watched:
            assert out[f"spectral/{name}/clip_c"] == c_k
            assert 0.0 < out[f"spectral/{name}/step_norm_over_bound"] <= 1 + BOUND_SLACK
            assert out[f"spectral/{name}/clip_active_topk"] == 1.0  # Adam's U ≫ c: all clipped
        assert out["spectral/max_step_norm_over_bound"] <= 1 + BOUND_SLACK
        assert out["spectral/mean_clip_active_topk"] == 1.0
    assert seen == 3


def _train(make_opt, monitor: bool, attach: bool = False) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 3))
    opt = make_opt(model.parameters())
    mon = SpectralMonitor(model, opt, every=3) if monitor else None
    if mon is not None and attach:
        mon.attach()
    for _ in range(10):
        # data from the global generator: a monitor that drew from it would shift these
        x, y = torch.randn(16, 10), torch.randn(16, 3)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        if mon is not None and not attach:
            mon.before_step()
        opt.step()
        if mon is not None and not attach:
            mon.after_step()
    if mon is not None:
        assert mon.last  # the monitor did record something
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda ps: spectra.AdamW(ps, lr=1e-2, weight_decay=0.1, clip_c=0.3),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    ],
    ids=["spectra.AdamW", "torch.optim.AdamW"],
)
@pytest.mark.parametrize("attach", [False, True], ids=["calls", "attach"])
def test_monitor_leaves_weights_bit_identical(make_opt, attach):
    plain = _train(make_opt, monitor=False)
    watched = _train(make_opt, monitor=True, attach=attach)
    for a, b in zip(plain, watched, strict=True):
        assert torch.equal(a, b)


def test_attach_fires_once_per_step_and_unmonitored_steps_return_empty():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(6, 5))
    opt = torch.optim.SGD([w], lr=0.1)
    mon = SpectralMonitor(optimizer=opt, every=2)
    logged: list[dict[str, float]] = []
    handles = mon.attach(logged.append)
    for _ in range(5):
        w.grad = torch.randn(6, 5)
        opt.step()
    assert mon.step_count == 5
    assert [d["spectral/step"] for d in logged] == [0.0, 2.0, 4.0]
    for h in handles:
        h.remove()
    opt.step()
    assert mon.step_count == 5
    assert mon.after_step() == {}  # step 5 is unmonitored


def test_default_matrices_skip_groups_that_do_not_clip_and_vectors():
    a, b, v = (
        nn.Parameter(torch.ones(4, 3)),
        nn.Parameter(torch.ones(4, 3)),
        nn.Parameter(torch.ones(3)),
    )
    opt = spectra.AdamW([{"params": [a, v]}, {"params": [b], "clip_c": None}])
    assert [p for _, p in SpectralMonitor(optimizer=opt).watched] == [a]
    opt = spectra.AdamW([{"params": [b], "clip_c": None, "post": "orthogonalize"}])
    assert [p for _, p in SpectralMonitor(optimizer=opt).watched] == [b]
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        SpectralMonitor(optimizer=opt, every=0)
