"""Generic optimizer properties (in the manner of PyTorch's test_optim) and base-algorithm
references for the SPECTRA optimizers."""

from __future__ import annotations

import copy
import io
import math
import re

import pytest
import torch

import spectra.optim as so
from spectra.optim import chain as spectra_chain
from spectra.optim import plan as spectra_plan

pytestmark = pytest.mark.usefixtures("one_thread")


SHAPES = [(8, 6), (8, 6), (6, 8), (5,), (3, 4, 2)]


def make_params(dtype=torch.float64, seed=0, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for s in shapes
    ]


def grad_stream(shapes=SHAPES, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    while True:
        yield [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def run(opt, params, steps, grads, sched=None):
    for _ in range(steps):
        for p, gr in zip(params, next(grads), strict=True):
            p.grad = gr.to(p.dtype).clone()
        opt.step()
        if sched is not None:
            sched.step()


FACTORIES = {
    "AdamW": lambda ps, **kw: so.AdamW(ps, lr=1e-2, **kw),
    "Signum": lambda ps, **kw: so.Signum(ps, lr=1e-2, **kw),
    "AdEMAMix": lambda ps, **kw: so.AdEMAMix(ps, lr=1e-2, alpha_warmup=5, beta3_warmup=5, **kw),
    "MARS": lambda ps, **kw: so.MARS(ps, lr=1e-2, **kw),
    "SGDM": lambda ps, **kw: so.SGDM(ps, lr=1e-1, momentum=0.5, **kw),
    "Spectra(torch AdamW)": lambda ps, **kw: so.Spectra(
        torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), **kw
    ),
}
SPECTRA_KW = {
    "clip_c": 0.5,
    "pre_clip_c": 2.0,
    "clip_schedule": so.ClipSchedule("linear", total_steps=8, final_ratio=0.5),
}


def svd_map(X, phi):
    """Reference spectral map in float64: U diag(phi(S)) Vᵀ."""
    U, S, Vh = torch.linalg.svd(X.double(), full_matrices=False)
    return (U * phi(S).unsqueeze(-2)) @ Vh


def soft_ref(X, c):
    return svd_map(X, lambda s: s / torch.sqrt(1 + (s / c) ** 2))


# --------------------------------------------------------------------------- base algorithms


@pytest.mark.parametrize("per_tensor", [("cpu",), ()], ids=["per-tensor", "foreach"])
def test_adamw_without_clip_matches_torch_adamw_over_100_steps_float32(monkeypatch, per_tensor):
    # both forms of the direction: tensor by tensor (the CPU's) and multi-tensor (elsewhere)
    from spectra.optim import adamw

    monkeypatch.setattr(adamw, "PER_TENSOR_DEVICES", per_tensor)
    p1, p2 = make_params(torch.float32), make_params(torch.float32)
    o1 = so.AdamW(p1, lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, clip_c=None)
    o2 = torch.optim.AdamW(p2, lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, foreach=True)
    g1, g2 = grad_stream(dtype=torch.float32), grad_stream(dtype=torch.float32)
    run(o1, p1, 100, g1)
    run(o2, p2, 100, g2)
    for a, b in zip(p1, p2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(p1, p2, strict=True):
        torch.testing.assert_close(o1.state[a]["exp_avg_sq"], o2.state[b]["exp_avg_sq"])


def test_torch_adamw_checkpoint_loads_and_continues_identically():
    p1, p2 = make_params(), make_params()
    o1 = torch.optim.AdamW(p1, lr=1e-2, weight_decay=0.1)
    grads = grad_stream()
    run(o1, p1, 3, grads)
    with torch.no_grad():
        for a, b in zip(p1, p2, strict=True):
            b.copy_(a)
    o2 = so.AdamW(p2, lr=1e-2, weight_decay=0.1, clip_c=None)
    o2.load_state_dict(copy.deepcopy(o1.state_dict()))
    future = [next(grads) for _ in range(3)]
    run(o1, p1, 3, iter(future))
    run(o2, p2, 3, iter(future))
    for a, b in zip(p1, p2, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def _reference_run(update, params, steps, grads):
    """Run a per-tensor reference ``update(i, p, g, t)`` (in place) for ``steps`` steps."""
    for t in range(1, steps + 1):
        for i, (p, g) in enumerate(zip(params, next(grads), strict=True)):
            update(i, p, g, t)


def test_signum_matches_sgd_nesterov_sign_reference():
    # Reference: the sign of torch-style Nesterov SGD (buf ← βbuf + g, u = g + βbuf), λ decoupled.
    lr, beta, wd = 1e-2, 0.9, 0.1
    ps = make_params()
    opt = so.Signum(ps, lr=lr, momentum=beta, weight_decay=wd, clip_c=None)
    run(opt, ps, 12, grad_stream())
    ref = [p.detach().clone() for p in make_params()]
    bufs = [torch.zeros_like(p) for p in ref]

    def update(i, p, g, t):
        bufs[i].mul_(beta).add_(g)
        u = g + beta * bufs[i]
        p.mul_(1 - lr * wd).add_(u.sign(), alpha=-lr)

    _reference_run(update, ref, 12, grad_stream())
    for a, b in zip(ps, ref, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=1e-14)


def test_ademamix_matches_reference_with_half_life_warmups():
    lr, (b1, b2, b3), alpha, eps, wd, T = 1e-2, (0.9, 0.99, 0.999), 5.0, 1e-8, 0.1, 7
    ps = make_params()
    opt = so.AdEMAMix(
        ps,
        lr=lr,
        betas=(b1, b2, b3),
        alpha=alpha,
        alpha_warmup=T,
        beta3_warmup=T,
        eps=eps,
        weight_decay=wd,
        clip_c=None,
    )
    run(opt, ps, 10, grad_stream())

    def half_life(beta):
        return math.log(0.5) / math.log(beta) - 1

    def beta3_at(t):  # linear in the half-life, as in the AdEMAMix reference code
        if t >= T:
            return b3
        a = t / T
        return 0.5 ** (1 / ((1 - a) * half_life(b1) + a * half_life(b3) + 1))

    ref = [p.detach().clone() for p in make_params()]
    st = [[torch.zeros_like(p) for _ in range(3)] for p in ref]

    def update(i, p, g, t):
        m1, m2, v = st[i]
        a_t = alpha * min(t / T, 1.0)
        m1.mul_(b1).add_(g, alpha=1 - b1)
        m2.mul_(beta3_at(t)).add_(g, alpha=1 - beta3_at(t))
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v / (1 - b2**t)).sqrt() + eps
        p.add_(-lr * ((m1 / (1 - b1**t) + a_t * m2) / denom + wd * p))

    _reference_run(update, ref, 10, grad_stream())
    for a, b in zip(ps, ref, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=1e-12, atol=1e-12)


def test_mars_matches_reference_code_formulas():
    lr, (b1, b2), gamma, eps, wd, f1d, (a1, a2) = (
        3e-3,
        (0.95, 0.99),
        0.025,
        1e-8,
        0.1,
        0.5,
        (0.8, 0.999),
    )
    ps = make_params()
    opt = so.MARS(
        ps,
        lr=lr,
        betas=(b1, b2),
        gamma=gamma,
        eps=eps,
        weight_decay=wd,
        lr_1d_factor=f1d,
        betas_1d=(a1, a2),
        clip_c=None,
    )
    run(opt, ps, 10, grad_stream())
    ref = [p.detach().clone() for p in make_params()]
    st = [[torch.zeros_like(p) for _ in range(3)] for p in ref]

    def update(i, p, g, t):
        m, v, last = st[i]
        if p.dim() >= 2:
            c = g + gamma * b1 / (1 - b1) * (g - last)
            if c.norm() > 1:
                c = c / c.norm()
            m.mul_(b1).add_(c, alpha=1 - b1)
            v.mul_(b2).addcmul_(c, c, value=1 - b2)
            denom = (v.sqrt() / math.sqrt(1 - b2**t) + eps) * (1 - b1**t)
            p.add_(-lr * (wd * p + m / denom))
            last.copy_(g)
        else:
            m.mul_(a1).add_(g, alpha=1 - a1)
            v.mul_(a2).addcmul_(g, g, value=1 - a2)
            denom = (v.sqrt() / math.sqrt(1 - a2**t) + eps) * (1 - a1**t)
            p.add_(-lr * f1d * (wd * p + m / denom))

    _reference_run(update, ref, 10, grad_stream())
    for a, b in zip(ps, ref, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=1e-12, atol=1e-12)
    assert "last_grad" not in opt.state[ps[3]]  # gradient history only for matrices


def test_sgdm_polyak_momentum_starts_from_first_gradient():
    lr, beta, wd = 0.1, 0.3, 0.05
    ps = make_params()
    opt = so.SGDM(ps, lr=lr, momentum=1 - beta, weight_decay=wd, clip_c=None)
    run(opt, ps, 6, grad_stream())
    ref = [p.detach().clone() for p in make_params()]
    bufs = [None] * len(ref)

    def update(i, p, g, t):
        bufs[i] = g.clone() if t == 1 else (1 - beta) * bufs[i] + beta * g
        p.mul_(1 - lr * wd).add_(bufs[i], alpha=-lr)

    _reference_run(update, ref, 6, grad_stream())
    for a, b in zip(ps, ref, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("post", ["soft_clip", "hard_clip", "orthogonalize"])
def test_adamw_post_operator_matches_float64_svd_reference(post):
    lr, wd, c = 1e-2, 0.1, 0.3
    ps = make_params()
    opt = so.AdamW(ps, lr=lr, weight_decay=wd, clip_c=c, post=post)
    run(opt, ps, 5, grad_stream())
    ref = [p.detach().clone() for p in make_params()]
    st = [[torch.zeros_like(p), torch.zeros_like(p)] for p in ref]
    ops = {
        "soft_clip": lambda X: soft_ref(X, c),
        "hard_clip": lambda X: svd_map(X, lambda s: s.clamp(max=c)),
        "orthogonalize": lambda X: svd_map(X, torch.ones_like),
    }

    def update(i, p, g, t):
        m, v = st[i]
        m.mul_(0.9).add_(g, alpha=0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        U = (m / 0.1 / (1 - 0.9**t)) * 0.1 / ((v / (1 - 0.999**t)).sqrt() + 1e-8)
        p.mul_(1 - lr * wd)
        if p.dim() >= 2:
            M = U.reshape(p.shape[0], -1)
            alpha = max(1.0, math.sqrt(M.shape[0] / M.shape[1]))
            p.add_(ops[post](M).reshape(p.shape), alpha=-alpha * lr)
        else:
            p.add_(U, alpha=-lr)

    _reference_run(update, ref, 5, grad_stream())
    for a, b in zip(ps, ref, strict=True):
        torch.testing.assert_close(a.detach(), b, rtol=1e-10, atol=1e-10)


def test_tensor_with_more_than_two_dims_is_clipped_as_d0_by_rest_matrix():
    lr, c = 0.5, 0.2
    p = torch.randn(4, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    x0 = p.detach().clone()
    g = torch.randn(4, 3, 2, 2, dtype=torch.float64)
    opt = so.SGDM([p], lr=lr, momentum=0.0, weight_decay=0.0, clip_c=c)
    p.grad = g
    opt.step()
    expected = x0 - lr * soft_ref(g.reshape(4, 12), c).reshape(4, 3, 2, 2)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-12, atol=1e-12)


def test_clip_params_all_applies_the_vector_rule_to_1d_params():
    lr, c = 0.5, 0.7
    p = torch.randn(10, dtype=torch.float64, requires_grad=True)
    x0 = p.detach().clone()
    g = 3 * torch.randn(10, dtype=torch.float64)
    opt = so.SGDM(
        [p],
        lr=lr,
        momentum=0.0,
        weight_decay=0.0,
        clip_c=c,
        clip_params="all",
    )
    p.grad = g
    opt.step()
    r = g.norm()
    expected = x0 - lr * g * (1 / torch.sqrt(1 + (r / c) ** 2))
    torch.testing.assert_close(p.detach(), expected, rtol=1e-12, atol=1e-12)
    # With the default "matrices", a 1-D parameter takes the plain base step.
    q = x0.clone().requires_grad_()
    opt2 = so.SGDM([q], lr=lr, momentum=0.0, weight_decay=0.0, clip_c=c)
    q.grad = g
    opt2.step()
    torch.testing.assert_close(q.detach(), x0 - lr * g, rtol=1e-14, atol=1e-14)


def test_same_shaped_matrices_are_clipped_in_one_batched_call(monkeypatch):
    calls = []
    real = spectra_plan.soft_clip

    def counting(X, c, **kw):
        calls.append(tuple(X.shape))
        return real(X, c, **kw)

    ps = make_params(shapes=[(8, 6)] * 3 + [(6, 8), (7,)])
    opt = so.AdamW(ps, clip_c=0.1, batch_elements=10_000)
    monkeypatch.setattr(spectra_plan, "soft_clip", counting)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    assert sorted(calls) == [(1, 6, 8), (3, 8, 6)]
    # Same-shaped matrices beyond batch_elements are split into batches within that cap.
    qs = make_params(shapes=[(8, 6)] * 6)
    opt = so.AdamW(qs, clip_c=0.1, batch_elements=100)
    calls.clear()
    for q in qs:
        q.grad = torch.randn_like(q)
    opt.step()
    assert calls == [(2, 8, 6)] * 3


def test_operator_batch_size_does_not_change_the_result():
    results = []
    for cap in (1, 50, None):
        ps = make_params()
        opt = so.AdEMAMix(ps, lr=1e-2, batch_elements=cap, **SPECTRA_KW)
        run(opt, ps, 4, grad_stream())
        results.append([p.detach().clone() for p in ps])
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


# --------------------------------------------------------------------------- generic properties


@pytest.mark.parametrize("name", list(FACTORIES))
def test_state_dict_round_trip_gives_bit_identical_continuation(name):
    make = FACTORIES[name]
    ps = make_params()
    opt = make(ps, **SPECTRA_KW)
    grads = grad_stream()
    run(opt, ps, 3, grads)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    snapshot = [p.detach().clone() for p in ps]
    future = [next(grads) for _ in range(3)]
    run(opt, ps, 3, iter(future))

    ps2 = [s.clone().requires_grad_() for s in snapshot]
    opt2 = make(ps2, **SPECTRA_KW)
    buf.seek(0)
    opt2.load_state_dict(torch.load(buf, weights_only=True))
    run(opt2, ps2, 3, iter(future))
    for a, b in zip(ps, ps2, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_param_groups_carry_their_own_lr_weight_decay_and_clip_settings(name):
    make = FACTORIES[name]
    ps = make_params()
    own = [
        {"params": ps[:2], "lr": 3e-2, "weight_decay": 0.0, "clip_c": 0.2},
        {"params": ps[2:], "weight_decay": 0.3, "clip_c": None, "pre_clip_c": 1.0},
    ]
    opt = make(own)
    run(opt, ps, 3, grad_stream())
    # The same thing as two separate optimizers, one per group.
    qs = make_params()
    opt_a = make([{"params": qs[:2], "lr": 3e-2, "weight_decay": 0.0, "clip_c": 0.2}])
    opt_b = make([{"params": qs[2:], "weight_decay": 0.3, "clip_c": None, "pre_clip_c": 1.0}])
    grads = grad_stream()
    for _ in range(3):
        for q, g in zip(qs, next(grads), strict=True):
            q.grad = g.clone()
        opt_a.step()
        opt_b.step()
    for a, b in zip(ps, qs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14)
    # And the groups really differ from the defaults.
    rs = make_params()
    run(make(rs), rs, 3, grad_stream())
    assert not torch.allclose(ps[0], rs[0])


@pytest.mark.parametrize("name", list(FACTORIES))
def test_param_without_grad_is_untouched_and_has_no_state(name):
    ps = make_params()
    frozen = ps[1].detach().clone()
    opt = FACTORIES[name](ps, **SPECTRA_KW)
    for _ in range(2):
        for i, p in enumerate(ps):
            p.grad = None if i == 1 else torch.randn_like(p)
        opt.step()
    assert torch.equal(ps[1], frozen)
    assert len(opt.state[ps[1]]) == 0


@pytest.mark.parametrize("name", list(FACTORIES))
def test_zero_grad_without_weight_decay_is_a_no_op(name):
    ps = make_params()
    start = [p.detach().clone() for p in ps]
    opt = FACTORIES[name]([{"params": ps, "weight_decay": 0.0}], **SPECTRA_KW)
    for _ in range(3):
        for p in ps:
            p.grad = torch.zeros_like(p)
        opt.step()
    for a, b in zip(ps, start, strict=True):
        assert torch.equal(a.detach(), b)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_float32_agrees_with_float64(name):
    p64 = make_params(torch.float64)
    p32 = make_params(torch.float32)
    # one clip method for both (auto picks "mixed", at the bf16 floor, for float32 on a CPU
    # with bf16 units, and the exact "eigh" for float64)
    kw = {**SPECTRA_KW, "clip_method": "eigh"}
    run(FACTORIES[name](p64, **kw), p64, 5, grad_stream())
    run(FACTORIES[name](p32, **kw), p32, 5, grad_stream())
    for a, b in zip(p64, p32, strict=True):
        # Signum's sign() can flip on entries that are ~0; everything else agrees closely.
        tol = 2e-2 if name == "Signum" else 1e-4
        torch.testing.assert_close(b.double(), a, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_closure_is_evaluated_once_and_its_loss_returned(name):
    ps = make_params()
    target = [torch.randn_like(p) for p in ps]
    opt = FACTORIES[name](ps, **SPECTRA_KW)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = sum(((p - t) ** 2).sum() for p, t in zip(ps, target, strict=True))
        loss.backward()
        return loss

    losses = [float(opt.step(closure).detach()) for _ in range(5)]
    assert len(calls) == 5
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", list(FACTORIES))
def test_nonfinite_gradient_raises_and_moves_no_parameter(name):
    # The gradients' check is read with the step's one host read, after the state took the
    # step (nonfinite="skip" keeps the state too, at the cost of a read of its own).
    ps = make_params()
    opt = FACTORIES[name](ps, **SPECTRA_KW)
    run(opt, ps, 1, grad_stream())
    before = [p.detach().clone() for p in ps]
    for p in ps:
        p.grad = torch.randn_like(p)
    ps[2].grad[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="a gradient contains inf or nan; no parameter"):
        opt.step()
    for a, b in zip(ps, before, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_nonfinite_gradient_is_skipped_when_asked(name):
    ps = make_params()
    opt = FACTORIES[name](ps, nonfinite="skip", **SPECTRA_KW)
    before = [p.detach().clone() for p in ps]
    for p in ps:
        p.grad = torch.randn_like(p)
    ps[0].grad[1, 1] = float("inf")
    with pytest.warns(RuntimeWarning, match="skipped"):
        opt.step()
    assert opt.num_skipped_steps == 1
    for a, b in zip(ps, before, strict=True):
        assert torch.equal(a, b)
    ps[0].grad[1, 1] = 0.0
    opt.step()
    assert not torch.equal(ps[0], before[0])


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"lr": -0.5}, "-0.5"),
        ({"weight_decay": -1.0}, "-1.0"),
        ({"betas": (1.5, 0.9)}, "1.5"),
        ({"eps": float("nan")}, "nan"),
        ({"clip_c": -3.0}, "-3.0"),
        ({"clip_c": 0.0}, "clip_c"),
        ({"clip_scale": "big"}, "big"),
        ({"clip_method": "magic"}, "magic"),
        ({"clip_schedule": "cosine"}, "callable"),
        ({"pre_clip_schedule": 3.0}, "3.0"),
        ({"clip_params": "vectors"}, "vectors"),
        ({"post": "lmo"}, "lmo"),
        ({"pre_clip_c": -2.0}, "-2.0"),
        ({"nonfinite": "ignore"}, "ignore"),
        ({"batch_elements": 0}, "batch_elements"),
        ({"chunk_elements": -5}, "-5"),
        ({"warmup_steps": 4}, "warmup_steps"),
        ({"bogus_setting": 1}, "bogus_setting"),
    ],
)
def test_invalid_hyperparameters_raise_value_error_naming_the_value(kwargs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        so.AdamW(make_params(), **kwargs)


def test_invalid_base_specific_hyperparameters_raise():
    with pytest.raises(ValueError, match=re.escape("1.2")):
        so.Signum(make_params(), momentum=1.2)
    with pytest.raises(ValueError, match="momentum"):
        so.SGDM(make_params(), momentum=1.0)
    with pytest.raises(ValueError, match="triple"):
        so.AdEMAMix(make_params(), betas=(0.9, 0.99))
    with pytest.raises(ValueError, match=re.escape("-0.1")):
        so.MARS(make_params(), gamma=-0.1)
    with pytest.raises(ValueError, match="-7"):
        so.AdamW([{"params": make_params(), "clip_c": -7.0}])
    with pytest.raises(ValueError, match="hard_clip"):
        so.AdamW(make_params(), post="hard_clip", clip_method="paper")


# --------------------------------------------------------------------------- the chain


def test_float16_adam_direction_that_overflows_raises_before_any_parameter_changes():
    # Adam in float16: ε = 1e-8 and v ≈ (1−β₂)g² underflow to 0, so U = m̂/(√v̂ + ε) = inf
    # although every gradient is finite.
    ps = [torch.full((8, 6), 0.5, dtype=torch.float16, requires_grad=True) for _ in range(3)]
    before = [p.detach().clone() for p in ps]
    opt = so.AdamW(ps, lr=1e-2, clip_c=1.0)
    for p in ps:
        p.grad = torch.full_like(p, 1e-4)
    with pytest.raises(FloatingPointError, match=r"update direction \(from finite gradients\)"):
        opt.step()
    for a, b in zip(ps, before, strict=True):
        assert torch.equal(a, b)
    skip = so.AdamW(ps, lr=1e-2, clip_c=1.0, nonfinite="skip")
    with pytest.warns(RuntimeWarning, match="skipped"):
        skip.step()
    assert skip.num_skipped_steps == 1
    for a, b in zip(ps, before, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("make", [
    lambda ps, **kw: so.AdamW(ps, lr=1e-2, **kw),
    lambda ps, **kw: so.Signum(ps, lr=1e-2, **kw),
    lambda ps, **kw: so.Spectra(torch.optim.AdamW(ps, lr=1e-2), **kw),
])  # fmt: skip
def test_chunk_elements_gives_the_all_at_once_step(make):
    g = torch.Generator().manual_seed(3)
    shapes = [(12, 8), (12, 8), (8, 20), (7,), (16, 16)]
    X0 = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    G = [[torch.randn(s, generator=g, dtype=torch.float64) for s in shapes] for _ in range(3)]
    results = []
    for chunk in (None, 1, 200):
        ps = [x.clone().requires_grad_() for x in X0]
        opt = make(ps, clip_c=0.5, chunk_elements=chunk)
        for grads in G:
            for p, gr in zip(ps, grads, strict=True):
                p.grad = gr.clone()
            opt.step()
        results.append([p.detach() for p in ps])
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_chunk_elements_stops_before_the_nonfinite_chunk_and_says_so():
    # float16 Adam whose direction overflows (see above) in the last parameter only: with one
    # parameter per chunk, the first two move and the third does not.
    ps = [torch.full((8, 6), 0.5, dtype=torch.float16, requires_grad=True) for _ in range(3)]
    before = [p.detach().clone() for p in ps]
    opt = so.AdamW(ps, lr=1e-2, clip_c=1.0, chunk_elements=48)
    for p in ps[:2]:
        p.grad = torch.full_like(p, 0.5)
    ps[2].grad = torch.full_like(ps[2], 1e-4)
    with pytest.raises(FloatingPointError, match="parameters of the earlier chunks were changed"):
        opt.step()
    assert not torch.equal(ps[0], before[0]) and not torch.equal(ps[1], before[1])
    assert torch.equal(ps[2], before[2])


def test_spectra_step_in_chunks_equals_all_at_once_and_float64_reference():
    g = torch.Generator().manual_seed(5)
    shapes = [(6, 4), (6, 4), (4, 6), (5,), (3, 2, 2)]
    X0 = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    G = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    plans = []
    for i, x in enumerate(X0):
        shape = spectra_chain.matrix_shape(x)
        post = so.SpectralOp("soft_clip", 0.3) if shape else None
        pre = so.SpectralOp("soft_clip", 2.0) if shape else None
        plans.append(so.ParamPlan(0.1 * (i + 1), 0.2, shape, pre, post, 1.5 if shape else 1.0))
    results = []
    for chunk in (None, 1, 30):
        X = [x.clone() for x in X0]
        assert so.spectra_step(
            X, G, plans, lambda idx, gs: [2.0 * t for t in gs], chunk_elements=chunk
        )
        results.append(X)
    for x0, gr, pl, *outs in zip(X0, G, plans, *results, strict=True):
        if pl.shape is None:
            expected = (1 - 0.2 * pl.lr) * x0 - pl.lr * 2.0 * gr
        else:
            M = gr.reshape(pl.shape)
            U = 2.0 * soft_ref(M, 2.0)
            expected = (1 - 0.2 * pl.lr) * x0 - 1.5 * pl.lr * soft_ref(U, 0.3).reshape(x0.shape)
        for out in outs:
            torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_batched_apply_equals_the_operator_on_each_matrix():
    from spectra.ops import batched_apply_, soft_clip

    g = torch.Generator().manual_seed(6)
    mats = [
        torch.randn(s, generator=g, dtype=torch.float64)
        for s in [(5, 3)] * 5 + [(3, 5)] * 2 + [(4, 4)]
    ]
    expected = [soft_ref(m, 0.7) for m in mats]
    calls = []

    def op(X):
        calls.append(tuple(X.shape))
        return soft_clip(X, 0.7)

    batched_apply_(op, mats, max_elements=30)
    for m, e in zip(mats, expected, strict=True):
        torch.testing.assert_close(m, e, rtol=1e-12, atol=1e-12)
    assert sorted(calls) == sorted([(2, 5, 3), (2, 5, 3), (1, 5, 3), (2, 3, 5), (1, 4, 4)])
    with pytest.raises(ValueError, match="2-D"):
        batched_apply_(op, [torch.ones(2, 2, 2)])


def test_batched_apply_runs_cpu_batches_on_threads_of_one_intra_op_thread_each():
    import threading

    from spectra.ops import batched_apply_, soft_clip

    g = torch.Generator().manual_seed(7)
    mats = [torch.randn(s, generator=g) for s in [(48, 32)] * 4 + [(32, 64)] * 3]
    expected = [soft_ref(m.double(), 2.0).float() for m in mats]
    seen = []

    def op(X):
        seen.append((threading.get_ident(), torch.get_num_threads(), torch.is_grad_enabled()))
        return soft_clip(X, 2.0, method="eigh")

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            batched_apply_(op, mats, max_elements=2 * 32 * 64)  # T = 2: a matrix per batch
        assert torch.get_num_threads() == 2  # restored
        for m, e in zip(mats, expected, strict=True):
            torch.testing.assert_close(m, e, rtol=1e-5, atol=1e-5)
        # one call per matrix, none on the calling thread, each single-threaded, grad mode kept
        assert len(seen) == 7
        assert threading.get_ident() not in {s[0] for s in seen}
        assert {s[1:] for s in seen} == {(1, False)}

        def failing(X):
            raise RuntimeError(f"bad batch {tuple(X.shape)}")

        with pytest.raises(RuntimeError, match="bad batch"):
            batched_apply_(failing, mats)
        assert torch.get_num_threads() == 2
        # a single batch keeps the caller's thread and its intra-op threads
        seen.clear()
        batched_apply_(op, mats[:1])
        assert seen == [(threading.get_ident(), 2, True)]
        # a matrix above max_elements / T runs alone, first, on the caller's thread with its
        # threads (at most one such matrix in flight); the rest side by side on the workers
        big = torch.randn(64, 64, generator=g)
        big_expected = soft_ref(big.double(), 2.0).float()
        seen.clear()
        batched_apply_(op, [*mats, big], max_elements=2 * 32 * 64)
        torch.testing.assert_close(big, big_expected, rtol=1e-5, atol=1e-5)
        assert seen[0] == (threading.get_ident(), 2, True)
        assert threading.get_ident() not in {s[0] for s in seen[1:]} and len(seen) == 8
        # under the profiler, and with one thread, everything runs on the caller's thread
        seen.clear()
        with torch.profiler.profile():
            batched_apply_(op, mats)
        torch.set_num_threads(1)
        batched_apply_(op, mats)
        assert {s[0] for s in seen} == {threading.get_ident()}
    finally:
        torch.set_num_threads(threads)


def test_the_exact_clip_of_small_matrices_runs_side_by_side_within_1e_2_of_float64_svd(
    monkeypatch,
):
    # The main job's shapes by the exact method on a CPU without bf16 units (where "auto" is
    # "chebyshev", which hands a matrix to "eigh" beyond σ_max ≈ 5c): with the batch floor the
    # 192-row Gram matrices run in batches of three on the two threads instead of one at a time
    # on the caller's, and every result stays at the exact method's error on the stress inputs
    # (Adam-like, sign and Gaussian directions, spikes to 1e3·c)
    import threading

    from spectra.ops import _common, batched_apply_, methods, soft_clip
    from spectra_lab.bench.matrices import spiked

    monkeypatch.setattr(_common, "CPU_HAS_BF16_UNITS", False)
    assert methods.default_method("soft_clip", torch.device("cpu"), torch.float32) == "chebyshev"
    c = 0.5
    cases = [
        ((192, 192), "adam", 1.0),
        ((192, 192), "sign", 30.0),
        ((192, 192), "gauss", 1e3),
        ((192, 192), "adam", 30.0),
        ((192, 192), "sign", 1.0),
        ((192, 192), "gauss", 3.0),
        ((512, 192), "adam", 1e3),
        ((512, 192), "sign", 10.0),
        ((512, 192), "gauss", 1.0),
        ((192, 512), "adam", 30.0),
        ((192, 512), "sign", 1e3),
        ((192, 512), "gauss", 0.5),
    ]
    mats = [spiked(shape, c, spike, kind=kind, seed=i)
            for i, (shape, kind, spike) in enumerate(cases)]  # fmt: skip
    refs = [soft_ref(m.double(), c) for m in mats]
    seen = []

    def op(X):
        seen.append((threading.get_ident(), torch.get_num_threads(), X.shape[0]))
        return soft_clip(X, c, method="eigh")

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        batched_apply_(op, mats)
    finally:
        torch.set_num_threads(threads)
    assert sorted(s[2] for s in seen) == [1] * 6 + [3, 3]
    assert threading.get_ident() not in {s[0] for s in seen} and {s[1] for s in seen} == {1}
    errors = [float(torch.linalg.vector_norm(m.double() - r) / torch.linalg.vector_norm(r))
              for m, r in zip(mats, refs, strict=True)]  # fmt: skip
    assert max(errors) <= 1e-2, errors


def test_batched_apply_runs_matmul_only_batches_of_an_eighth_on_the_calling_thread(monkeypatch):
    import threading

    import spectra.ops.batched as batched
    from spectra.ops import batched_apply_, soft_clip
    from spectra.ops.batched import BATCH_FRACTION, MATMUL_BATCH_FRACTION

    g = torch.Generator().manual_seed(3)
    mats = [torch.randn(s, generator=g) for s in [(16, 32)] * 16 + [(24, 24)] * 8]
    expected = [soft_ref(m.double(), 2.0).float() for m in mats]
    total = sum(m.numel() for m in mats)

    class Op:
        def __init__(self, matmul_only: bool):
            self.only, self.seen = matmul_only, []

        def matmul_only(self, X):
            return self.only

        def __call__(self, X):
            self.seen.append((threading.get_ident(), torch.get_num_threads(), X.shape[0]))
            return soft_clip(X, 2.0, method="polar")

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        products = Op(True)
        # at most MATMUL_MIN_BATCH elements in all: one batch per shape
        batched_apply_(products, [m.clone() for m in mats])
        assert sorted(s[2] for s in products.seen) == [8, 16]
        products.seen.clear()
        monkeypatch.setattr(batched, "MATMUL_MIN_BATCH", 0)
        batched_apply_(products, [m.clone() for m in mats])
        # batches of total/8 elements, one after another on the caller's two threads
        assert {(s[0], s[1]) for s in products.seen} == {(threading.get_ident(), 2)}
        sizes = []
        for count, numel in ((16, 16 * 32), (8, 24 * 24)):
            per = max(1, -(-total // MATMUL_BATCH_FRACTION) // numel)
            sizes += [per] * (count // per) + ([count % per] if count % per else [])
        assert sorted(s[2] for s in products.seen) == sorted(sizes)
        # any other op: total/32 (400 elements here, under every matrix: one matrix a batch)
        other = Op(False)
        monkeypatch.setattr(batched, "MIN_BATCH", 0)
        batched_apply_(other, [m.clone() for m in mats])
        assert total // BATCH_FRACTION < 512 and [s[2] for s in other.seen] == [1] * 24
        # ...but at least MIN_BATCH elements: one batch per shape here, the two side by side
        # on the workers with one intra-op thread each
        monkeypatch.setattr(batched, "MIN_BATCH", 2 * total)
        other.seen.clear()
        out = [m.clone() for m in mats]
        batched_apply_(other, out)
        assert sorted(s[2] for s in other.seen) == [8, 16]
        assert {s[1] for s in other.seen} == {1}
        assert threading.get_ident() not in {s[0] for s in other.seen}
        for m, e in zip(out, expected, strict=True):
            torch.testing.assert_close(m, e, rtol=2e-3, atol=2e-4)
        out = [m.clone() for m in mats]
        batched_apply_(products, out)
        for m, e in zip(out, expected, strict=True):
            torch.testing.assert_close(m, e, rtol=2e-3, atol=2e-4)
    finally:
        torch.set_num_threads(threads)


def test_optimizer_state_dict_saves_schedules_as_text_and_keeps_the_built_ones():
    ps = make_params()
    sched = so.standard_clip_schedule(so.wsd_schedule(2, 10), 2)
    opt = so.AdamW(ps, clip_schedule=sched)
    run(opt, ps, 2, grad_stream())
    sd = opt.state_dict()
    assert sd["param_groups"][0]["clip_schedule"] == repr(sched)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    opt.load_state_dict(torch.load(buf, weights_only=True))
    assert opt.param_groups[0]["clip_schedule"] is sched
    assert opt.state_dict()["param_groups"][0]["clip_schedule"] == repr(sched)


@pytest.mark.parametrize(
    "make",
    [lambda ps: so.AdamW(ps, clip_c=0.1), lambda ps: so.Spectra(torch.optim.AdamW(ps), clip_c=0.1)],
)
def test_channels_last_kernels_are_clipped_like_contiguous_ones(make):
    g = torch.Generator().manual_seed(7)
    w = torch.randn(4, 3, 2, 2, generator=g, dtype=torch.float64)
    grads = [torch.randn(4, 3, 2, 2, generator=g, dtype=torch.float64) for _ in range(3)]
    a = w.clone().requires_grad_()
    b = w.clone().to(memory_format=torch.channels_last).requires_grad_()
    assert not b.is_contiguous()
    for p in (a, b):
        opt = make([p])
        for gr in grads:
            p.grad = gr.clone().to(memory_format=torch.preserve_format)
            opt.step()
    torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-12, atol=1e-12)


def test_clip_ns_settings_reach_the_paper_operator():
    """clip_method="paper" with clip_ns_steps/clip_ns_dtype runs soft_clip_paper with them."""
    from spectra.ops import soft_clip_paper

    torch.manual_seed(0)
    X0 = torch.randn(24, 16)
    g = torch.randn(24, 16)
    p = torch.nn.Parameter(X0.clone())
    opt = so.SGDM([p], lr=0.1, momentum=0.0, weight_decay=0.0, clip_c=1.0,
                       clip_method="paper", clip_ns_steps=3, clip_ns_dtype="float64")  # fmt: skip
    p.grad = g.clone()
    opt.step()
    scale = max(1.0, math.sqrt(24 / 16))
    expected = X0 - 0.1 * scale * soft_clip_paper(g, 1.0, ns_steps=3, dtype=torch.float64)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=1e-7)
    # clip_method="polar" with clip_ns_dtype=bf16: split bf16 products (~1e-4 of the update)
    p2 = torch.nn.Parameter(X0.clone())
    opt = so.SGDM([p2], lr=0.1, momentum=0.0, weight_decay=0.0, clip_c=1.0,
                  clip_method="polar", clip_ns_dtype="bfloat16")  # fmt: skip
    p2.grad = 10.0 * g
    opt.step()
    expected = X0 - 0.1 * scale * soft_ref(10.0 * g.double(), 1.0).float()
    torch.testing.assert_close(p2.detach(), expected, rtol=0, atol=5e-5)
    for bad, match in (({"clip_ns_dtype": "float16"}, "clip_ns_dtype"),
                       ({"clip_ns_steps": -1}, "clip_ns_steps"),
                       ({"post": "hard_clip", "clip_ns_steps": 3}, "clip_ns_steps")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            so.AdamW([torch.nn.Parameter(X0.clone())], **bad)


def test_chunked_step_batches_with_the_whole_steps_budget(monkeypatch):
    # A chunk's own 1/32 would fall below one matrix and serialise the clip's batches.
    from spectra.optim import chain

    seen = []
    real = chain.batched_apply_all_

    def spy(jobs, **kw):
        seen.append(kw["max_elements"])
        return real(jobs, **kw)

    monkeypatch.setattr(chain, "batched_apply_all_", spy)
    ps = [torch.randn(32, 32, requires_grad=True) for _ in range(8)]
    for p in ps:
        p.grad = torch.randn_like(p)
    so.AdamW(ps, lr=1e-3, clip_c=1.0, chunk_elements=2 * 32 * 32).step()
    assert seen == [-(-8 * 32 * 32 // 32)] * 4  # four chunks, the budget of all eight matrices
