"""A relative threshold, ``clip_kappa=κ``: each matrix of the direction clipped at κ·‖U‖_F of
its own, against a float64 SVD of the same map; its limits (SGD-M for a large κ, κŝ·orth for
a small one); experts each with their own scale; a capturable step; bad settings refused. And
D-Muon's soft orthogonalization (``soft_kappa``), the same clip normalized to Muon's size."""

from __future__ import annotations

import pytest
import torch

import spectra.optim as so

STEPS = 3
LR, MU = 0.05, 0.9


def _svd_clip(M: torch.Tensor, c: torch.Tensor, post: str) -> torch.Tensor:
    U, S, Vh = torch.linalg.svd(M, full_matrices=False)
    phi = torch.minimum(S, c) if post == "hard_clip" else S / torch.sqrt(1 + (S / c) ** 2)
    return U @ torch.diag_embed(phi) @ Vh


def _reference(W0, grads, kappa, post, batch_dims=0):
    """SGD-M (``M ← μM + (1−μ)g``, ``M₀ = g``) with ``X ← X − αη·H_{κ‖M_i‖_F}(M_i)`` per matrix."""
    W, M = W0.clone(), None
    for k, g in enumerate(grads):
        M = g.clone() if k == 0 else MU * M + (1 - MU) * g
        mats = M.reshape(-1, *M.shape[-2:]) if batch_dims else M.unsqueeze(0)
        H = torch.stack([_svd_clip(X, kappa * X.norm(), post) for X in mats]).reshape(M.shape)
        m, n = M.shape[-2:]
        W = W - LR * max(1.0, (m / n) ** 0.5) * H
    return W


def _run(W0, grads, **settings):
    W = torch.nn.Parameter(W0.clone())
    opt = so.SGDM([W], lr=LR, momentum=MU, weight_decay=0.0, **settings)
    for g in grads:
        W.grad = g.clone()
        opt.step()
    return W.detach()


def _grads(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(STEPS)]


@pytest.mark.parametrize("post", ["soft_clip", "hard_clip"])
@pytest.mark.parametrize("kappa", [0.03, 0.3, 3.0])
@pytest.mark.parametrize("shape", [(8, 5), (5, 8)])
def test_each_step_clips_the_momentum_at_kappa_times_its_own_norm(post, kappa, shape):
    W0 = torch.randn(shape, dtype=torch.float64)
    grads = _grads(shape)
    got = _run(W0, grads, clip_kappa=kappa, post=post, clip_method="eigh")
    torch.testing.assert_close(got, _reference(W0, grads, kappa, post), rtol=1e-10, atol=1e-12)


def test_the_family_runs_from_muon_to_sgdm():
    W0 = torch.zeros(8, 5, dtype=torch.float64)
    g = _grads((8, 5))[:1]
    alpha = (8 / 5) ** 0.5
    # κ small: the update is κŝ·orth(M) (Muon's direction, scaled by κ‖M‖_F)
    small = -_run(W0, g, clip_kappa=1e-4, clip_method="eigh") / (LR * alpha)
    U, _, Vh = torch.linalg.svd(g[0], full_matrices=False)
    orth = 1e-4 * g[0].norm() * (U @ Vh)
    assert ((small - orth).norm() / orth.norm()).item() < 1e-6
    # κ large: the update is M itself (SGD-M)
    large = -_run(W0, g, clip_kappa=1e4, clip_method="eigh") / (LR * alpha)
    assert ((large - g[0]).norm() / g[0].norm()).item() < 1e-8


def test_each_expert_takes_its_own_scale():
    shape = (3, 6, 4)
    W0 = torch.randn(shape, dtype=torch.float64)
    grads = _grads(shape, seed=1)
    grads = [g * torch.tensor([1.0, 10.0, 0.1], dtype=torch.float64)[:, None, None] for g in grads]
    got = _run(W0, grads, clip_kappa=0.3, clip_batch_dims=1, clip_method="eigh")
    want = _reference(W0, grads, 0.3, "soft_clip", batch_dims=1)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_capturable_step_is_as_accurate_as_its_method():
    # capturable: the scale stays on the device, with the iteration's fixed schedule; both
    # steps against the exact map, within "mixed"'s accuracy (1e-2)
    W0 = torch.randn(8, 5, dtype=torch.float64)
    grads = _grads((8, 5), seed=2)
    want = _reference(W0, grads, 0.3, "soft_clip") - W0
    for capturable in (False, True):
        got = _run(W0.float(), [g.float() for g in grads], clip_kappa=0.3, clip_method="mixed",
                   capturable=capturable).double() - W0  # fmt: skip
        assert ((got - want).norm() / want.norm()).item() < 1e-2, capturable


def test_a_zero_direction_stays_zero():
    W0 = torch.randn(4, 4, dtype=torch.float64)
    got = _run(W0, [torch.zeros(4, 4, dtype=torch.float64)], clip_kappa=0.3)
    torch.testing.assert_close(got, W0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"clip_kappa": 0.0}, r"clip_kappa must be .*got 0\.0"),
        ({"clip_kappa": -1}, r"clip_kappa must be .*got -1"),
        ({"clip_kappa": "x"}, r"clip_kappa must be .*got 'x'"),
        ({"clip_kappa": 0.3, "post": "orthogonalize"}, r"clip_kappa=0\.3 sets a threshold"),
    ],
)
def test_bad_settings_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        so.SGDM([torch.nn.Parameter(torch.randn(4, 4))], lr=0.1, **settings)


# --------------------------------------------------------------------------- D-Muon, soft


def _dmuon_reference(W0, grads, kappa, lr=0.01, mu=0.95, wd=0.1):
    """D-Muon (Nesterov) with ``O = √r·H_1(Y)/‖H_1(Y)‖_F``, ``Y = U/(κ‖U‖_F)``, by a float64 SVD;
    ``kappa=None``: the exact ``orth(U)``; ``kappa=inf``: ``√r·U/‖U‖_F``."""
    W, B = W0.clone(), torch.zeros_like(W0)
    m, n = W0.shape
    for g in grads:
        B = MU_D * B + (1 - MU_D) * g
        U = (1 - MU_D) * g + MU_D * B
        u, S, vh = torch.linalg.svd(U, full_matrices=False)
        if kappa is None:
            v = torch.ones_like(S)
        elif kappa == float("inf"):
            v = S
        else:
            t = S / (kappa * U.norm())
            v = t / torch.sqrt(1 + t * t)
        O = u @ torch.diag(v * min(m, n) ** 0.5 / v.norm()) @ vh
        W = (1 - lr * wd) * W - lr * 0.2 * max(m, n) ** 0.5 * O
    return W


MU_D = 0.95


def _dmuon(W0, grads, **settings):
    W = torch.nn.Parameter(W0.clone())
    opt = so.DMuon([{"params": [W], "use_muon": True}], lr=0.01, **settings)
    for g in grads:
        W.grad = g.clone()
        opt.step()
    return W.detach()


@pytest.mark.parametrize("kappa", [0.03, 0.3, 3.0])
def test_dmuon_soft_orthogonalization_is_the_normalized_soft_clip(kappa):
    W0 = torch.randn(8, 5, dtype=torch.float64)
    grads = _grads((8, 5), seed=3)
    got = _dmuon(W0, grads, soft_kappa=kappa)
    torch.testing.assert_close(got, _dmuon_reference(W0, grads, kappa), rtol=1e-10, atol=1e-12)


def test_dmuon_soft_runs_from_muon_to_normalized_sgdm():
    W0 = torch.randn(8, 5, dtype=torch.float64)
    grads = _grads((8, 5), seed=4)
    # κ → 0: Muon's step with the exact orth(U) (D-Muon itself uses NS₅, ≈ orth)
    muon = _dmuon(W0, grads, soft_kappa=1e-7)
    torch.testing.assert_close(muon, _dmuon_reference(W0, grads, None), rtol=1e-10, atol=1e-12)
    # κ → ∞: the momentum's own direction at Muon's size
    sgdm = _dmuon(W0, grads, soft_kappa=1e7)
    want = _dmuon_reference(W0, grads, float("inf"))
    torch.testing.assert_close(sgdm, want, rtol=1e-8, atol=1e-10)


def test_dmuon_refuses_a_bad_soft_kappa():
    with pytest.raises(ValueError, match=r"soft_kappa must be .*got 0"):
        so.DMuon([torch.nn.Parameter(torch.randn(4, 4))], soft_kappa=0)
