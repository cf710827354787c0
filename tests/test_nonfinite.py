"""Non-finite gradients under ``nonfinite="raise"`` where the directions' check covers them.

Optimizers whose ``_directions_keep_nonfinite`` is true leave the gradients' own finite check
out of an unchunked single-process step: their direction link turns every non-finite gradient
entry into a non-finite direction entry, which the directions' check finds. These tests check
that property of each such link, for inf, -inf and nan and for the extreme settings of its
hyperparameters, and that the step still raises the gradient's error and moves nothing. The
last tests read the exact messages of a step that meets inf or nan.
"""

from __future__ import annotations

import pickle

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


# --------------------------------------------------------------------------- the messages

#: Every optimizer that raises the error: the native ones and the wrapper.
RAISING = {
    "AdamW": lambda ps, **kw: so.AdamW(ps, lr=1e-2, **kw),
    "AdEMAMix": lambda ps, **kw: so.AdEMAMix(ps, lr=1e-2, **kw),
    "MARS": lambda ps, **kw: so.MARS(ps, lr=1e-2, **kw),
    "SGDM": lambda ps, **kw: so.SGDM(ps, lr=1e-2, **kw),
    "Signum": lambda ps, **kw: so.Signum(ps, lr=1e-2, **kw),
    "Spectra": lambda ps, **kw: so.Spectra(torch.optim.AdamW(ps, lr=1e-2), **kw),
}
SKIP = "; pass nonfinite='skip' to skip such steps instead of raising"


def inf_at_step_3(opt, ps):
    for k in range(2):
        feed(ps, k)
        opt.step()
    feed(ps, 2)
    ps[2].grad[1, 1] = float("inf")


@pytest.mark.parametrize("name", list(RAISING))
def test_a_nonfinite_gradient_is_one_sentence_naming_the_step(name):
    ps = make_params()
    opt = RAISING[name](ps)
    inf_at_step_3(opt, ps)
    fact = (
        f"{name}.step() at step 3: a gradient contains inf or nan; no parameter was changed, "
        "but the optimizer state was updated with it"
    )
    with pytest.raises(so.NonFiniteError) as caught:
        opt.step()
    assert str(caught.value) == fact + SKIP
    assert caught.value.fact == fact and caught.value.step == 3
    assert isinstance(caught.value, FloatingPointError)


@pytest.mark.parametrize("name", list(RAISING))
def test_a_gradient_checked_before_the_state_says_nothing_changed(name):
    # Pre-clipping checks the gradients before the state changes; nonfinite="skip" warns.
    for kw in ({"pre_clip_c": 2.0}, {"nonfinite": "skip"}):
        ps = make_params()
        opt = RAISING[name](ps, **kw)
        inf_at_step_3(opt, ps)
        fact = f"{name}.step() at step 3: a gradient contains inf or nan"
        changed = "no parameter or optimizer state was changed"
        if "nonfinite" in kw:
            with pytest.warns(RuntimeWarning) as seen:
                opt.step()
            assert [str(w.message) for w in seen] == [f"{fact}; step skipped: {changed}"]
        else:
            with pytest.raises(so.NonFiniteError) as caught:
                opt.step()
            assert str(caught.value) == f"{fact}; {changed}{SKIP}"


def float16_overflow(n_good: int) -> list[torch.Tensor]:
    """float16 parameters whose Adam direction overflows in the last one (ε underflows)."""
    ps = [torch.full((8, 6), 0.5, dtype=torch.float16, requires_grad=True) for _ in range(3)]
    for p in ps[:n_good]:
        p.grad = torch.full_like(p, 0.5)
    for p in ps[n_good:]:
        p.grad = torch.full_like(p, 1e-4)
    return ps


@pytest.mark.parametrize(
    ("name", "kw", "changed"),
    [
        ("AdamW", {}, "no parameter was changed, but"),
        ("AdamW", {"chunk_elements": 48}, "the parameters of the earlier chunks were changed and"),
        # the wrapper always runs in chunks (about an eighth of the parameters each)
        ("Spectra", {}, "the parameters of the earlier chunks were changed and"),
    ],
)
def test_a_nonfinite_direction_names_it_and_what_moved(name, kw, changed):
    ps = float16_overflow(2)
    before = [p.detach().clone() for p in ps]
    opt = RAISING[name](ps, clip_c=1.0, **kw)
    with pytest.raises(so.NonFiniteError) as caught:
        opt.step()
    assert str(caught.value) == (
        f"{name}.step() at step 1: an update direction (from finite gradients) contains inf or "
        f"nan; {changed} the optimizer state was updated{SKIP}"
    )
    moved = [not torch.equal(a, b) for a, b in zip(ps, before, strict=True)]
    assert moved == ([False] * 3 if changed.startswith("no") else [True, True, False])


def test_the_error_survives_pickling():
    err = pickle.loads(pickle.dumps(so.NonFiniteError("AdamW.step() at step 4: x", 4)))
    assert (err.fact, err.step, str(err)) == ("AdamW.step() at step 4: x", 4, f"{err.fact}{SKIP}")
