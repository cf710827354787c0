"""LR schedules, the clipping-threshold schedule, and how the clip follows an LR scheduler."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import spectra.optim as so

pytestmark = pytest.mark.usefixtures("one_thread")


def test_wsd_schedule_warms_up_holds_and_decays_by_sqrt_to_zero():
    f = so.wsd_schedule(warmup_steps=10, total_steps=100, decay_fraction=0.2)
    assert [f(k) for k in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert f(9) == 1.0
    assert all(f(k) == 1.0 for k in range(10, 81))
    assert f(85) == pytest.approx(1 - math.sqrt(5 / 20))
    assert f(100) == 0.0
    assert f(150) == 0.0
    decay = [f(k) for k in range(80, 101)]
    assert all(a > b for a, b in itertools.pairwise(decay))


def test_cosine_schedule_reaches_final_ratio():
    f = so.cosine_schedule(warmup_steps=4, total_steps=24, final_ratio=0.1)
    assert f(0) == pytest.approx(0.25)
    assert f(4) == pytest.approx(1.0)
    assert f(14) == pytest.approx(0.1 + 0.9 * 0.5)
    assert f(24) == pytest.approx(0.1)
    assert f(30) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: so.wsd_schedule(-1, 10), "-1"),
        (lambda: so.wsd_schedule(5, 0), "total_steps"),
        (lambda: so.wsd_schedule(9, 10, decay_fraction=0.5), "overlaps"),
        (lambda: so.wsd_schedule(1, 10, decay_fraction=1.5), "1.5"),
        (lambda: so.cosine_schedule(2, 10, final_ratio=-0.2), "-0.2"),
        (lambda: so.ClipSchedule("exp"), "exp"),
        (lambda: so.ClipSchedule("sqrt"), "total_steps"),
        (lambda: so.ClipSchedule("linear", total_steps=10, final_ratio=0.0), "final_ratio"),
        (lambda: so.standard_clip_schedule(3.0, 5), "callable"),
        (lambda: so.standard_clip_schedule(so.wsd_schedule(2, 10), -1), "-1"),
    ],
)
def test_schedule_validation(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()


def test_clip_schedule_factors():
    # The "standard" rule c_k = c·η/η_k during warmup, from the LR factor S: 1/S(k).
    lr_fn = so.wsd_schedule(5, 20)
    std = so.standard_clip_schedule(lr_fn, 5)
    assert std(0) == pytest.approx(5.0)  # S(0) = 1/5
    assert std(3) == pytest.approx(5 / 4)
    assert std(5) == 1.0
    assert so.standard_clip_schedule(lambda k: 0.0, 5)(0) == math.inf
    assert so.ClipSchedule("constant")(0) == 1.0
    r = 1e-3  # cosine from 10 to 0.01 over the whole run, as in the pre-clipping ablation
    cos = so.ClipSchedule("cosine", total_steps=100, final_ratio=r)
    assert cos(0) == pytest.approx(1.0)
    assert cos(50) == pytest.approx(r + (1 - r) * 0.5)
    assert 10 * cos(100) == pytest.approx(0.01)
    lin = so.ClipSchedule("linear", total_steps=100, decay_fraction=0.2, final_ratio=0.5)
    assert lin(80) == 1.0
    assert lin(90) == pytest.approx(0.75)
    sq = so.ClipSchedule("sqrt", total_steps=100, decay_fraction=0.5, final_ratio=0.5)
    assert sq(75) == pytest.approx(1 - 0.5 * math.sqrt(0.5))


def soft_ref(X, c):
    U, S, Vh = torch.linalg.svd(X, full_matrices=False)
    return (U * (S / torch.sqrt(1 + (S / c) ** 2))) @ Vh


def _sgd_clip_run(opt, X, grads, sched, expected_c):
    """Plain SGD (β = 1) with the clip: X ← (1−λη)X − αη·H_{c_k}(g); check every step."""
    for k, g in enumerate(grads):
        group = opt.param_groups[0]
        lr, lam = group["lr"], group["weight_decay"]
        expected = (1 - lam * lr) * X.detach() - lr * soft_ref(g, expected_c(k, lr))
        X.grad = g.clone()
        opt.step()
        torch.testing.assert_close(X.detach(), expected, rtol=1e-12, atol=1e-12)
        sched.step()


def test_lambda_lr_moves_the_lr_and_the_standard_clip_schedule_follows():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(6, 6, generator=g, dtype=torch.float64, requires_grad=True)
    grads = [10 * torch.randn(6, 6, generator=g, dtype=torch.float64) for _ in range(8)]
    c, peak, warmup = 0.3, 0.2, 4
    lr_fn = so.wsd_schedule(warmup, 8, 0.5)
    clip_schedule = so.standard_clip_schedule(lr_fn, warmup)
    opt = so.SGDM(
        [X], lr=peak, momentum=0.0, weight_decay=0.1, clip_c=c, clip_schedule=clip_schedule
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_fn)
    lrs = []

    def expected_c(k, lr):
        lrs.append(lr)
        return c * peak / lr if k < warmup else c

    _sgd_clip_run(opt, X, grads, sched, expected_c)
    assert lrs[:4] == pytest.approx([0.05, 0.1, 0.15, 0.2])
    assert lrs[5] < peak
    # c_k is observable: the threshold of the step about to be taken, or of any step.
    assert opt.clip_threshold() == c
    assert opt.clip_threshold(step=0) == pytest.approx(c * 4)


def test_any_callable_is_a_clip_schedule_for_example_with_one_cycle_lr():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(5, 7, generator=g, dtype=torch.float64, requires_grad=True)
    grads = [10 * torch.randn(5, 7, generator=g, dtype=torch.float64) for _ in range(10)]
    c, max_lr, warmup = 0.5, 0.4, 3
    holder = {}

    def one_cycle_standard(k):
        return max_lr / holder["sched"].get_last_lr()[0] if k < warmup else 1.0

    opt = so.SGDM(
        [X], lr=0.1, momentum=0.0, weight_decay=0.05, clip_c=c, clip_schedule=one_cycle_standard
    )
    holder["sched"] = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=max_lr, total_steps=10, pct_start=0.3, cycle_momentum=False
    )
    assert opt.param_groups[0]["lr"] == pytest.approx(max_lr / 25)
    _sgd_clip_run(
        opt, X, grads, holder["sched"], lambda k, lr: c * max_lr / lr if k < warmup else c
    )


def test_one_cycle_lr_with_cycled_betas_matches_torch_adamw():
    g = torch.Generator().manual_seed(4)
    X0 = torch.randn(4, 5, generator=g, dtype=torch.float64)
    grads = [torch.randn(4, 5, generator=g, dtype=torch.float64) for _ in range(12)]
    runs = []
    for make in (
        lambda ps: so.AdamW(ps, clip_c=None),
        lambda ps: torch.optim.AdamW(ps, weight_decay=0.1),
    ):
        X = X0.clone().requires_grad_()
        opt = make([X])
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=12)
        betas = []
        for grad in grads:
            X.grad = grad.clone()
            opt.step()
            sched.step()
            betas.append(opt.param_groups[0]["betas"][0])
        runs.append((X.detach(), betas))
    assert len(set(runs[0][1])) > 3  # beta1 really cycles
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=1e-12, atol=1e-14)


def test_pre_clip_cosine_schedule_decays_the_threshold():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    c_pre, total = 10.0, 6
    sched_cfg = so.ClipSchedule("cosine", total_steps=total, final_ratio=1e-3)
    opt = so.SGDM(
        [X],
        lr=0.1,
        momentum=0.0,
        weight_decay=0.0,
        clip_c=None,
        pre_clip_c=c_pre,
        pre_clip_schedule=sched_cfg,
    )
    assert opt.param_groups[0]["pre_clip_schedule"] is sched_cfg
    for k in range(total):
        grad = 20 * torch.randn(6, 4, generator=g, dtype=torch.float64)
        c_k = c_pre * sched_cfg(k)
        expected = X.detach() - 0.1 * soft_ref(grad, c_k)
        X.grad = grad
        opt.step()
        torch.testing.assert_close(X.detach(), expected, rtol=1e-12, atol=1e-12)
        assert X.grad is grad  # pre-clipping leaves .grad alone


def test_clip_schedule_decay_for_post_clip():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(5, 5, generator=g, dtype=torch.float64, requires_grad=True)
    cfg = so.ClipSchedule("linear", total_steps=4, final_ratio=0.25)
    opt = so.SGDM([X], lr=0.1, momentum=0.0, weight_decay=0.0, clip_c=1.0, clip_schedule=cfg)
    for k in range(4):
        grad = 10 * torch.randn(5, 5, generator=g, dtype=torch.float64)
        expected = X.detach() - 0.1 * soft_ref(grad, 1.0 - 0.75 * k / 4)
        X.grad = grad
        opt.step()
        torch.testing.assert_close(X.detach(), expected, rtol=1e-12, atol=1e-12)
