"""Host synchronisations of an optimizer step, and torch.compile of the model and the step.

On a GPU every read of a device tensor on the host (``.item()``, ``.tolist()``, ``bool(t)``,
``float(t)``, ``int(t)``) waits for the queue to drain. The matmul-only soft clip (``"polar"``,
the CUDA default, and ``"mixed"``) must read α on the host; the step reads every operator's α
and the finite checks together, once. These tests count the reads of one step on the CPU,
where the same code runs with ``spectra.optim.plan.READ_ONCE_ON_CPU`` (the step counters are
CPU tensors on every device, as in torch's optimizers, and are not counted).
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch import nn

import spectra.optim as so

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")
SHAPES = [(48, 32), (48, 32), (32, 96), (96, 32), (64, 64), (32,), (4, 8, 3)]


@contextlib.contextmanager
def counted_reads(skip: set[int]):
    """Count host reads of tensors, except those whose id is in ``skip``."""
    seen: list[str] = []
    real = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(name):
        def read(self, *args, **kwargs):
            if id(self) not in skip:
                seen.append(f"{name} of {tuple(self.shape)} {self.dtype}")
            return real[name](self, *args, **kwargs)

        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, wrap(name))
        yield seen
    finally:
        for name, fn in real.items():
            setattr(torch.Tensor, name, fn)


def step_counters(opt) -> set[int]:
    states = list(opt.state.values()) + list(getattr(opt, "base", opt).state.values())
    return {id(st["step"]) for st in states if torch.is_tensor(st.get("step"))}


@pytest.fixture(autouse=True)
def gpu_path(monkeypatch):
    # the path every device but the CPU takes (there a read costs nothing)
    from spectra.optim import plan

    monkeypatch.setattr(plan, "READ_ONCE_ON_CPU", True)


def reads_of_one_step(make, **kw) -> list[str]:
    torch.manual_seed(0)
    ps = [torch.randn(s, requires_grad=True) for s in SHAPES]
    opt = make(ps, **kw)
    for k in range(2):
        for p in ps:
            p.grad = torch.randn_like(p)
        if k == 0:
            opt.step()  # creates the state
            continue
        with counted_reads(step_counters(opt)) as seen:
            opt.step()
    return seen


NATIVE = {
    "AdamW": lambda ps, **kw: so.AdamW(ps, lr=1e-2, **kw),
    "Signum": lambda ps, **kw: so.Signum(ps, lr=1e-2, **kw),
    "AdEMAMix": lambda ps, **kw: so.AdEMAMix(ps, lr=1e-2, **kw),
    "MARS": lambda ps, **kw: so.MARS(ps, lr=1e-2, **kw),
    "SGDM": lambda ps, **kw: so.SGDM(ps, lr=1e-2, **kw),
}


@pytest.mark.parametrize("name", list(NATIVE))
@pytest.mark.parametrize("method", ["polar", "mixed"])
def test_a_step_on_the_matmul_only_route_reads_the_device_once(name, method):
    # six matrices in five operator batches (one per shape: the step has fewer elements than
    # a matmul-only batch's floor, MATMUL_MIN_BATCH), and the gradients' and directions'
    # finite checks: one read of 1 + 5 × (α, finite, in range)
    seen = reads_of_one_step(NATIVE[name], clip_c=0.5, clip_method=method)
    assert seen == ["tolist of (16,) torch.float64"], seen


def test_the_wrapper_reads_the_device_once_per_chunk():
    # The wrapper hands its base an eighth of the parameters at a time (chunk_elements), and
    # each chunk is clipped and applied before the next is formed: one read per chunk, one in
    # all with a single chunk. torch's own AdamW reads only its CPU step counters.
    def make(ps, **kw):
        return so.Spectra(torch.optim.AdamW(ps, lr=1e-2, foreach=True), **kw)

    seen = reads_of_one_step(make, clip_c=0.5, clip_method="polar")
    assert 1 < len(seen) <= 8 and all(s.startswith("tolist of") for s in seen), seen
    seen = reads_of_one_step(make, clip_c=0.5, clip_method="polar", chunk_elements=10**9)
    assert seen == ["tolist of (19,) torch.float64"], seen


def test_skip_policy_and_pre_clipping_add_the_gradient_check_read():
    # nonfinite="skip" keeps the state on a non-finite gradient, so it checks before the state
    # changes; pre-clipping needs finite gradients before its operators run.
    for kw in ({"nonfinite": "skip"}, {"pre_clip_c": 2.0}):
        seen = reads_of_one_step(NATIVE["AdamW"], clip_c=0.5, clip_method="polar", **kw)
        assert seen[0] == "__bool__ of () torch.bool", seen
        assert seen[-1].startswith("tolist of"), seen
        assert len(seen) == (2 if "nonfinite" in kw else 3), seen  # pre-clip: its own read


# --------------------------------------------------------------------------- torch.compile


def train_three_steps(compiled: bool, method: str) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 48), nn.GELU(), nn.Linear(48, 8))
    opt = so.AdamW(model.parameters(), lr=1e-2, clip_c=0.5, clip_method=method)
    forward = torch.compile(model) if compiled else model
    step = torch.compile(opt.step) if compiled else opt.step
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(32, 16, generator=gen)
        y = torch.randn(32, 8, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(forward(x), y).backward()
        step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("method", ["auto", "polar"])
def test_compiled_model_and_step_match_eager_on_the_cpu(method):
    torch._dynamo.reset()
    eager = train_three_steps(False, method)
    compiled = train_three_steps(True, method)
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_compiling_a_step_warns_of_no_cache_wrapper(monkeypatch):
    # torch.compile traces through a functools.cache wrapper and warns of "potential silent
    # incorrectness" once per process; the bf16 probe that picks the method is a constant.
    from torch._dynamo import utils

    if hasattr(utils, "warn_once_cache"):  # warned earlier in this process: warn again
        monkeypatch.setattr(utils, "warn_once_cache", set())
    torch._dynamo.reset()
    ps = [torch.randn(6, 4, requires_grad=True)]
    opt = so.AdamW(ps, lr=1e-2, clip_c=0.5)  # the "auto" method asks the probe
    ps[0].grad = torch.randn(6, 4)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.compile(opt.step, backend="eager")()
    assert not [w for w in seen if "lru_cache" in str(w.message)], [str(w.message) for w in seen]
    assert opt.state[ps[0]]["step"] == 1
