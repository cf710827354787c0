"""Adaptive, layer-wise pre-clipping: ``c_k = κ·factor(k)·m̂_{k−1}`` per matrix, against a
float64-SVD reference of the recurrence (spectra.optim.settings)."""

from __future__ import annotations

import io
import math

import pytest
import torch

import spectra.optim as so
from spectra.ops import soft_clip, soft_clip_with_norm

SHAPES = [(6, 4), (6, 4), (3, 8), (5,)]


def svd_sigma(X: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(X.to(torch.float64))


def soft_ref(X: torch.Tensor, c: float) -> torch.Tensor:
    U, S, Vh = torch.linalg.svd(X.to(torch.float64), full_matrices=False)
    return (U * (S / torch.sqrt(1 + (S / c) ** 2)).unsqueeze(-2)) @ Vh


# --------------------------------------------------------------------------- the operator


@pytest.mark.parametrize("method", ["eigh", "svd", "polar", "mixed", "paper"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_soft_clip_with_norm_returns_the_clip_and_the_scale_of_its_gram_matrix(method, dtype):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 12, 30, generator=g, dtype=dtype)
    X[1] *= 40.0
    X[2, :, 0] += 200.0  # a spike: one direction dominates
    Y, sigma_hat = soft_clip_with_norm(X, 5.0, method=method)
    # the clip is exactly soft_clip's
    assert torch.equal(Y, soft_clip(X, 5.0, method=method))
    assert sigma_hat.shape == (3,) and sigma_hat.dtype == torch.float64
    sigma = svd_sigma(X)
    top, rank = sigma[:, 0], (sigma > 0).sum(-1).to(torch.float64)
    ratio = sigma_hat / top
    if method in ("eigh", "svd"):
        torch.testing.assert_close(ratio, torch.ones(3, dtype=torch.float64), rtol=1e-6, atol=0)
    else:
        power = 0.25 if method in ("polar", "mixed") else 0.5
        assert (ratio >= 1 - 1e-6).all() and (ratio <= rank**power * (1 + 1e-6)).all()
        # the spiked matrix's bound is close to σ_max
        assert ratio[2] < 1.01


def test_soft_clip_with_norm_of_vectors_tall_and_empty_inputs():
    x = torch.tensor([3.0, 4.0])
    y, r = soft_clip_with_norm(x, 5.0)
    assert float(r) == 5.0 and torch.equal(y, soft_clip(x, 5.0))
    X = torch.randn(2, 30, 7, dtype=torch.float64)  # tall: the Gram matrix is 7×7
    _, s = soft_clip_with_norm(X, 1.0, method="eigh")
    torch.testing.assert_close(s, svd_sigma(X)[:, 0], rtol=1e-12, atol=0)
    Y, s = soft_clip_with_norm(torch.zeros(2, 0, 3), 1.0)
    assert Y.shape == (2, 0, 3) and torch.equal(s, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="nan"):
        soft_clip_with_norm(torch.full((3, 3), math.nan), 1.0)


# --------------------------------------------------------------------------- the optimizer


def reference_run(grads_per_step, kappa, beta, lr, schedule=None):
    """X ← X − η·H_{c_k}(g) for SGD without momentum, with the recurrence written out:
    c_k = κ·factor(k)·m_{k−1}/(1 − β^{k−1}) (none at the first step),
    m_k = β m + (1−β) min(σ, c)."""
    X = [torch.zeros(s, dtype=torch.float64) for s in SHAPES]
    m = [0.0] * len(SHAPES)
    cs = []
    for k, grads in enumerate(grads_per_step):
        step_cs = []
        for i, gr in enumerate(grads):
            if gr.dim() < 2:
                X[i] -= lr * gr
                continue
            factor = 1.0 if schedule is None else schedule(k)
            c = math.inf if k == 0 else kappa * factor * m[i] / (1 - beta**k)
            sigma = float(svd_sigma(gr)[0])
            X[i] -= lr * (gr if math.isinf(c) else soft_ref(gr, c))
            m[i] = beta * m[i] + (1 - beta) * min(sigma, c)
            step_cs.append(c)
        cs.append(step_cs)
    return X, cs


def gradients(steps: int, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for k in range(steps):
        scale = 5.0 * (0.8**k)  # a decaying scale, with a spike at step 4
        grads = [scale * torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]
        if k == 4:
            grads[2] = grads[2] * 50.0
        out.append(grads)
    return out


def sgd(params, **kw):
    return so.SGDM(params, lr=0.1, momentum=0.0, weight_decay=0.0, clip_c=None, **kw)


@pytest.mark.parametrize("wrapper", [False, True])
def test_adaptive_pre_clip_follows_the_recurrence(wrapper):
    steps, kappa, beta = 8, 1.5, 0.7
    schedule = so.ClipSchedule("cosine", total_steps=steps, final_ratio=0.5)
    params = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in SHAPES]
    kw = {"pre_clip_kappa": kappa, "pre_clip_beta": beta, "pre_clip_schedule": schedule}
    if wrapper:
        opt = so.Spectra(torch.optim.SGD(params, lr=0.1), clip_c=None, **kw)
    else:
        opt = sgd(params, **kw)
    grads_per_step = gradients(steps)
    want, cs = reference_run(grads_per_step, kappa, beta, 0.1, schedule)
    for k, grads in enumerate(grads_per_step):
        if k > 0:
            planned = [opt.param_plan(opt.param_groups[0], p, k).pre.c for p in params[:3]]
            torch.testing.assert_close(planned, cs[k], rtol=1e-12, atol=0)
        for p, gr in zip(params, grads, strict=True):
            p.grad = gr.clone()
        opt.step()
        assert torch.equal(params[0].grad, grads[0])  # .grad is left alone
    for p, w in zip(params, want, strict=True):
        torch.testing.assert_close(p.detach(), w, rtol=1e-10, atol=1e-12)
    # the spike of step 4 was clipped to a threshold set by the steps before it
    sigma_spike = float(svd_sigma(grads_per_step[4][2])[0])
    assert cs[4][2] < sigma_spike / 10


def test_threshold_tracks_a_known_sigma_max():
    g = torch.Generator().manual_seed(3)
    W = torch.zeros(16, 24, dtype=torch.float64, requires_grad=True)
    opt = sgd([W], pre_clip_kappa=2.0, pre_clip_beta=0.9)
    s = 3.0
    for _ in range(120):
        G = torch.randn(16, 24, generator=g, dtype=torch.float64)
        W.grad = G * (s / float(svd_sigma(G)[0]))  # σ_max = 3 at every step
        opt.step()
    assert abs(opt.state[W]["pre_clip_ema"] - s) < 1e-5  # bias: 0.9**120
    c = opt.param_plan(opt.param_groups[0], W, 120).pre.c
    assert c == pytest.approx(2.0 * s, rel=1e-12)


def test_a_large_kappa_changes_nothing():
    params_a = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in SHAPES]
    params_b = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in SHAPES]
    opt_a = so.AdamW(params_a, lr=1e-2, pre_clip_kappa=1e9)
    opt_b = so.AdamW(params_b, lr=1e-2)
    for grads in gradients(6):
        for pa, pb, gr in zip(params_a, params_b, grads, strict=True):
            pa.grad, pb.grad = gr.clone(), gr.clone()
        opt_a.step()
        opt_b.step()
    for pa, pb in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("method", ["polar", "mixed"])
def test_matmul_methods_follow_their_own_bound(method):
    g = torch.Generator().manual_seed(5)
    W = torch.zeros(8, 20, requires_grad=True)
    opt = sgd([W], pre_clip_kappa=1.0, pre_clip_beta=0.5, clip_method=method)
    G = torch.randn(8, 20, generator=g)
    W.grad = G
    opt.step()
    bound = float(soft_clip_with_norm(G, 1.0, method=method)[1])
    assert opt.state[W]["pre_clip_ema"] == pytest.approx(0.5 * bound, rel=1e-12)


def test_state_dict_round_trip_resumes_exactly():
    grads_per_step = gradients(8, seed=1)

    def make(params):
        return so.AdamW(params, lr=1e-2, pre_clip_kappa=1.2, pre_clip_beta=0.8)

    full = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in SHAPES]
    opt = make(full)
    for grads in grads_per_step:
        for p, gr in zip(full, grads, strict=True):
            p.grad = gr.clone()
        opt.step()
    part = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in SHAPES]
    opt = make(part)
    for grads in grads_per_step[:4]:
        for p, gr in zip(part, grads, strict=True):
            p.grad = gr.clone()
        opt.step()
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "params": [p.detach() for p in part]}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    assert isinstance(saved["opt"]["state"][0]["pre_clip_ema"], float)
    assert "pre_clip_ema" not in saved["opt"]["state"].get(3, {})  # the vector: no pre-clip
    resumed = [p.clone().requires_grad_() for p in saved["params"]]
    opt = make(resumed)
    opt.load_state_dict(saved["opt"])
    for grads in grads_per_step[4:]:
        for p, gr in zip(resumed, grads, strict=True):
            p.grad = gr.clone()
        opt.step()
    for a, b in zip(resumed, full, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"pre_clip_kappa": 0.0}, "pre_clip_kappa"),
        ({"pre_clip_kappa": math.inf}, "pre_clip_kappa"),
        ({"pre_clip_kappa": "2"}, "pre_clip_kappa"),
        ({"pre_clip_kappa": 2.0, "pre_clip_beta": 1.0}, "pre_clip_beta"),
        ({"pre_clip_kappa": 2.0, "pre_clip_beta": -0.1}, "pre_clip_beta"),
        ({"pre_clip_kappa": 2.0, "pre_clip_c": 1.0}, "pre_clip_kappa=2.0"),
    ],
)
def test_bad_settings_are_refused_by_name(kw, named):
    W = torch.zeros(3, 3, requires_grad=True)
    with pytest.raises(ValueError, match=named):
        so.AdamW([W], **kw)
    with pytest.raises(ValueError, match=named):
        so.Spectra(torch.optim.SGD([W], lr=0.1), **kw)


def test_every_operator_returns_an_empty_batch_as_it_is():
    from spectra.ops import hard_clip, orthogonalize

    for X in (torch.zeros(2, 0, 3), torch.zeros(2, 3, 0), torch.zeros(0, 3, 3)):
        outs = [soft_clip(X, 1.0, method=m) for m in ("eigh", "svd", "polar", "mixed", "paper")]
        outs += [hard_clip(X, 1.0, method=m) for m in ("eigh", "svd")]
        outs += [orthogonalize(X, method=m) for m in ("svd", "muon", "polar_express")]
        assert all(Y.shape == X.shape for Y in outs)
