"""Generic torch.optim properties, checked on every optimizer, in the manner of PyTorch's
OptimizerInfo suite (test/test_optim.py).

One list of entries: every optimizer of ``spectra.optim`` and the ``Spectra`` wrapper around
several torch optimizers, each in a few configurations. Adding an optimizer means adding an
entry.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import spectra.optim as so

pytestmark = pytest.mark.usefixtures("one_thread")


@dataclass(frozen=True)
class Entry:
    """One optimizer in one configuration: ``make(params, **kw)``."""

    name: str
    make: Callable[..., torch.optim.Optimizer]
    kwargs: dict[str, Any] = field(default_factory=dict)
    sparse: bool = False  # trains parameters with sparse gradients

    def __call__(self, params, **kw):
        return self.make(params, **{**self.kwargs, **kw})

    def __repr__(self) -> str:
        return self.name


WRAPPER_KEYS = {*so.SPECTRA_DEFAULTS, "nonfinite", "batch_elements", "chunk_elements", "split_work"}


def wrap(cls, **base_kw):
    """``make`` for ``Spectra(cls(...))``: SPECTRA keywords to the wrapper, the rest to the base."""

    def make(ps, **kw):
        mine = {k: v for k, v in kw.items() if k in WRAPPER_KEYS}
        rest = {k: v for k, v in kw.items() if k not in WRAPPER_KEYS}
        return so.Spectra(cls(ps, **{**base_kw, **rest}), **mine)

    return make


SCHEDULE = so.ClipSchedule("linear", total_steps=6, final_ratio=0.5)
ENTRIES = [
    Entry("AdamW", so.AdamW),
    Entry("AdamW-hard-pre", so.AdamW, {"post": "hard_clip", "pre_clip_c": 2.0, "clip_c": 0.5}),
    Entry("AdamW-orth-all", so.AdamW, {"post": "orthogonalize", "clip_params": "all"}),
    Entry("AdamW-noclip", so.AdamW, {"clip_c": None}),
    Entry("AdamW-schedule", so.AdamW, {"clip_c": 0.5, "clip_schedule": SCHEDULE}),
    Entry("Signum", so.Signum, {"clip_c": 0.5}),
    Entry("Signum-plain", so.Signum, {"nesterov": False, "clip_c": None}),
    Entry("AdEMAMix", so.AdEMAMix, {"alpha_warmup": 4, "beta3_warmup": 4}),
    Entry("MARS", so.MARS, {"clip_c": 0.5}),
    Entry("SGDM", so.SGDM, {"clip_c": 0.5, "pre_clip_c": 1.0}),
    Entry("DMuon", so.DMuon),
    Entry("SOAP", so.SOAP, {"precondition_frequency": 2}),
    Entry("Spectra(AdamW)", wrap(torch.optim.AdamW)),
    Entry("Spectra(AdamW)-pre", wrap(torch.optim.AdamW), {"pre_clip_c": 1.0, "clip_c": 0.5}),
    Entry("Spectra(SGD)", wrap(torch.optim.SGD, lr=0.1, momentum=0.9), sparse=True),
    Entry("Spectra(Adam)", wrap(torch.optim.Adam)),
    Entry("Spectra(RMSprop)-orth", wrap(torch.optim.RMSprop), {"post": "orthogonalize"}),
]
SHAPES = [(6, 4), (4, 6), (5,), (3, 2, 2)]


def params(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for s in SHAPES
    ]


def feed(ps, k):
    g = torch.Generator().manual_seed(100 + k)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.device, p.dtype)


def run(opt, ps, steps, start=0):
    for k in range(start, start + steps):
        feed(ps, k)
        opt.step()


parametrize = pytest.mark.parametrize("entry", ENTRIES, ids=repr)


# --------------------------------------------------------------------------- state_dict


@parametrize
def test_state_dict_save_load_save_is_identical(entry):
    ps = params()
    opt = entry(ps)
    run(opt, ps, 3)
    sd = opt.state_dict()
    opt2 = entry(params())
    opt2.load_state_dict(copy.deepcopy(sd))
    sd2 = opt2.state_dict()
    assert sd2["param_groups"] == sd["param_groups"]
    assert sorted(sd2) == sorted(sd)
    buf1, buf2 = io.BytesIO(), io.BytesIO()
    torch.save(sd, buf1)
    torch.save(sd2, buf2)
    assert buf1.getvalue() == buf2.getvalue()


@parametrize
def test_state_dict_reload_continues_bit_identically_and_loads_weights_only(entry):
    ps = params()
    opt = entry(ps)
    run(opt, ps, 2)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    snapshot = [p.detach().clone() for p in ps]
    run(opt, ps, 2, start=2)
    ps2 = [s.clone().requires_grad_() for s in snapshot]
    opt2 = entry(ps2)
    buf.seek(0)
    opt2.load_state_dict(torch.load(buf, weights_only=True))
    run(opt2, ps2, 2, start=2)
    for a, b in zip(ps, ps2, strict=True):
        assert torch.equal(a, b)


@parametrize
def test_deepcopy_and_pickle_give_an_equivalent_optimizer(entry):
    ps = params()
    opt = entry(ps)
    run(opt, ps, 2)
    for clone in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        assert clone.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
        assert type(clone) is type(opt)


@parametrize
def test_float32_state_loads_onto_float64_parameters(entry):
    p32 = params(torch.float32)
    opt32 = entry(p32)
    run(opt32, p32, 2)
    p64 = [p.detach().double().requires_grad_() for p in p32]
    opt64 = entry(p64)
    opt64.load_state_dict(opt32.state_dict())
    for p in p64:
        for key, value in opt64.state[p].items():
            if torch.is_tensor(value) and value.dim() > 0 and key != "step":
                assert value.dtype == torch.float64, key
    run(opt64, p64, 1, start=2)
    run(opt32, p32, 1, start=2)
    # One more step in float64 and in float32 from the same state: equal up to the float32
    # clip's error (SOAP's eigenbasis amplifies rounding to ~1e-3; where the CPU has bf16
    # units the float32 default clip is "mixed", at the bf16 floor of ~5e-3 per matrix, while
    # float64 parameters keep the exact "eigh").
    for a, b in zip(p64, p32, strict=True):
        assert float((a.float() - b).norm()) <= 1e-2 * float(b.norm()) + 1e-6


@parametrize
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_state_loads_across_devices(entry, device):
    ps = params()
    opt = entry(ps)
    run(opt, ps, 2)
    moved = [p.detach().to(device).requires_grad_() for p in ps]
    opt2 = entry(moved)
    opt2.load_state_dict(opt.state_dict())
    for p in moved:
        for key, value in opt2.state[p].items():
            if torch.is_tensor(value) and key != "step" and value.dim() > 0:
                assert value.device == p.device
    run(opt2, moved, 1)


# --------------------------------------------------------------------------- hyperparameters


@parametrize
@pytest.mark.parametrize("shape", [(), (1,), (1, 1)], ids=["0-d", "(1,)", "(1, 1)"])
def test_tensor_lr_gives_the_float_lr_result(entry, shape):
    # a 1-element tensor of any shape, as torch's optimizers accept it
    a, b = params(), params()
    run(entry(a, lr=1e-2), a, 3)
    run(entry(b, lr=torch.full(shape, 1e-2)), b, 3)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


@parametrize
def test_tensor_lr_of_more_than_one_element_is_refused_in_torchs_words(entry):
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
        entry(params(), lr=torch.tensor([1e-3, 1e-3]))


@parametrize
def test_zero_gradient_without_weight_decay_is_a_no_op(entry):
    ps = params()
    start = [p.detach().clone() for p in ps]
    opt = entry([{"params": ps, "weight_decay": 0.0}])
    for _ in range(3):
        for p in ps:
            p.grad = torch.zeros_like(p)
        opt.step()
    for a, b in zip(ps, start, strict=True):
        assert torch.equal(a.detach(), b)


@parametrize
def test_parameter_without_gradient_is_untouched(entry):
    ps = params()
    frozen = ps[0].detach().clone()
    opt = entry(ps)
    for k in range(3):
        feed(ps, k)
        ps[0].grad = None
        opt.step()
    assert torch.equal(ps[0].detach(), frozen)


@parametrize
def test_param_groups_carry_their_own_lr_and_weight_decay(entry):
    ps, qs = params(), params()
    opt = entry([{"params": ps[:2], "lr": 0.0}, {"params": ps[2:], "weight_decay": 0.0}])
    before = [p.detach().clone() for p in ps]
    run(opt, ps, 2)
    assert all(torch.equal(a, b) for a, b in zip(ps[:2], before[:2], strict=True))
    # the second group equals an optimizer of its own
    opt_b = entry([{"params": qs[2:], "weight_decay": 0.0}])
    for k in range(2):
        feed(qs, k)
        opt_b.step()
    for a, b in zip(ps[2:], qs[2:], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@parametrize
@pytest.mark.parametrize(
    "scheduler",
    [
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, so.wsd_schedule(1, 4)),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(
            o, max_lr=1e-2, total_steps=5, cycle_momentum=False
        ),
    ],
    ids=["StepLR", "LambdaLR-wsd", "OneCycleLR"],
)
def test_lr_schedulers_move_the_lr(entry, scheduler):
    ps = params()
    opt = entry(ps)
    sched = scheduler(opt)
    lrs = []
    for k in range(4):
        feed(ps, k)
        opt.step()
        sched.step()
        lrs.append(float(opt.param_groups[0]["lr"]))
    assert len(set(lrs)) > 1


@parametrize
def test_global_and_instance_hooks_fire_once_per_step_and_see_the_whole_optimizer(entry):
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    ps = params()
    opt = entry(ps)
    seen: list[tuple[str, Any, int]] = []

    def record(kind):
        def hook(o, args, kwargs):
            seen.append((kind, o, sum(len(g["params"]) for g in o.param_groups)))

        return hook

    handles = [
        register_optimizer_step_pre_hook(record("global-pre")),
        register_optimizer_step_post_hook(record("global-post")),
        opt.register_step_pre_hook(record("pre")),
        opt.register_step_post_hook(record("post")),
    ]
    try:
        run(opt, ps, 2)
    finally:
        for h in handles:
            h.remove()
    assert [k for k, _, _ in seen].count("global-pre") == 2
    assert [k for k, _, _ in seen].count("pre") == 2
    assert len(seen) == 8
    assert all(o is opt and n == len(ps) for _, o, n in seen)


@parametrize
def test_closure_is_called_once_and_its_loss_returned(entry):
    ps = params()
    target = [torch.randn_like(p) for p in ps]
    opt = entry(ps)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = sum(((p - t) ** 2).sum() for p, t in zip(ps, target, strict=True))
        loss.backward()
        return loss

    losses = [float(opt.step(closure).detach()) for _ in range(4)]
    assert len(calls) == 4 and losses[-1] < losses[0]


@parametrize
def test_step_counters_follow_torch_convention(entry):
    ps = params()
    opt = entry(ps)
    run(opt, ps, 3)
    # (D-Muon's Muon matrices keep only a momentum buffer, as torch's Muon does.)
    steps = [opt.state[p]["step"] for p in ps if "step" in opt.state[p]]
    assert steps
    for step in steps:
        assert torch.is_tensor(step) and step.dim() == 0 and float(step) == 3.0


# --------------------------------------------------------------------------- sparse and complex


@parametrize
def test_sparse_gradients_train_or_are_refused_by_name(entry):
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = entry(emb.parameters())
    emb(torch.tensor([1, 2, 3])).sum().backward()
    if entry.sparse:
        before = emb.weight.detach().clone()
        opt.step()
        assert not torch.equal(before, emb.weight)
        assert torch.equal(before[5], emb.weight[5].detach())  # untouched rows stay
    else:
        with pytest.raises(RuntimeError, match="sparse"):  # torch's optimizers' error type
            opt.step()


@parametrize
def test_complex_parameters_are_refused_at_construction(entry):
    p = torch.randn(3, 3, dtype=torch.complex64, requires_grad=True)
    with pytest.raises(ValueError, match="complex"):
        entry([p])


@parametrize
def test_hyperparameters_are_checked_before_params(entry):
    with pytest.raises(ValueError, match="lr"):
        entry(None, lr=torch.tensor([1e-3, 2e-3]))
