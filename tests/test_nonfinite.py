"""Non-finite gradients under ``nonfinite="raise"`` where the directions' check covers them.

Optimizers whose ``_directions_keep_nonfinite`` is true leave the gradients' own finite check
out of an unchunked single-process step: their direction link turns every non-finite gradient
entry into a non-finite direction entry, which the directions' check finds. These tests check
that property of each such link, for inf, -inf and nan and for the extreme settings of its
hyperparameters, and that the step still raises the gradient's error and moves nothing.
"""

from __future__ import annotations

import pytest
import torch

import spectra.optim as so

SHAPES = [(6, 5), (5,), (3, 4)]
#: Every optimizer that declares the property, at ordinary and extreme settings.
KEEPING = {
    "AdamW": lambda ps: so.AdamW(ps, lr=1e-2),
    "AdamW beta1=0": lambda ps: so.AdamW(ps, lr=1e-2, betas=(0.0, 0.999)),
    "AdamW beta2=0": lambda ps: so.AdamW(ps, lr=1e-2, betas=(0.9, 0.0)),
    "AdEMAMix": lambda ps: so.AdEMAMix(ps, lr=1e-2, alpha_warmup=5, beta3_warmup=5),
    "AdEMAMix alpha=0": lambda ps: so.AdEMAMix(ps, lr=1e-2, alpha=0.0),
    "MARS": lambda ps: so.MARS(ps, lr=1e-2),
    "MARS gamma=0": lambda ps: so.MARS(ps, lr=1e-2, gamma=0.0),
    "SGDM": lambda ps: so.SGDM(ps, lr=1e-1, momentum=0.5),
    "SGDM momentum=0": lambda ps: so.SGDM(ps, lr=1e-1, momentum=0.0),
}


def make_params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in SHAPES]


def feed(ps: list[torch.Tensor], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


def test_the_declaring_optimizers_are_the_ones_tested():
    declared = {
        cls.__name__
        for cls in (so.AdamW, so.AdEMAMix, so.MARS, so.SGDM, so.Signum, so.Spectra)
        if cls._directions_keep_nonfinite
    }
    assert declared == {name.split()[0] for name in KEEPING}


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("name", list(KEEPING))
def test_a_nonfinite_gradient_entry_gives_a_nonfinite_direction_entry(name, value):
    ps = make_params()
    opt = KEEPING[name](ps)
    for k in range(3):  # a state that has seen a few steps
        feed(ps, k)
        opt.step()
    feed(ps, 3)
    where = [(0, (2, 3)), (1, (4,)), (2, (0, 0))]
    for i, idx in where:
        ps[i].grad[idx] = value
    work = opt._work()
    grads = [p.grad for p in ps]
    directions = opt._directions(work, list(range(len(ps))), grads)
    for (i, idx), d in zip(where, directions, strict=True):
        assert not torch.isfinite(d[idx]), (name, value, i, d[idx])


def test_signum_does_not_declare_it():
    # sign(+inf) = 1: a sign direction can be finite where the gradient is not
    ps = make_params()
    opt = so.Signum(ps, lr=1e-2, momentum=0.0)
    assert not opt._directions_keep_nonfinite
    feed(ps, 0)
    opt.step()
    feed(ps, 1)
    ps[0].grad[0, 0] = float("inf")
    directions = opt._directions(opt._work(), list(range(len(ps))), [p.grad for p in ps])
    assert bool(torch.isfinite(directions[0][0, 0]))


@pytest.mark.parametrize("name", list(KEEPING))
def test_the_step_still_raises_the_gradients_error_and_moves_nothing(name):
    ps = make_params()
    opt = KEEPING[name](ps)
    feed(ps, 0)
    opt.step()
    before = [p.detach().clone() for p in ps]
    feed(ps, 1)
    ps[2].grad[1, 1] = float("nan")
    with pytest.raises(FloatingPointError, match="a gradient contains inf or nan; no parameter"):
        opt.step()
    for a, b in zip(ps, before, strict=True):
        assert torch.equal(a, b)


def test_chunked_steps_keep_the_gradients_own_check():
    # With chunks a later chunk's gradient must stop the earlier chunks too, so its check stays.
    ps = make_params()
    opt = so.AdamW(ps, lr=1e-2, chunk_elements=8)
    feed(ps, 0)
    before = [p.detach().clone() for p in ps]
    ps[2].grad[2, 3] = float("inf")
    with pytest.raises(FloatingPointError, match="a gradient contains inf or nan; no parameter"):
        opt.step()
    for a, b in zip(ps, before, strict=True):
        assert torch.equal(a, b)
