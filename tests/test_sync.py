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
    """Count host reads of tensors, except those whose id is in ``skip`` and those of the step
    counters, which :func:`spectra.optim.base.read_counts` reads (CPU tensors on every device
    without ``capturable``, as in torch's optimizers)."""
    from spectra.optim import base

    seen: list[str] = []
    real = {name: getattr(torch.Tensor, name) for name in READS}
    real_counts = base.read_counts
    counting = [False]

    def wrap(name):
        def read(self, *args, **kwargs):
            if id(self) not in skip and not counting[0]:
                seen.append(f"{name} of {tuple(self.shape)} {self.dtype}")
            return real[name](self, *args, **kwargs)

        return read

    def read_counts(counters):
        assert all(t.device.type == "cpu" for t in counters)
        counting[0] = True
        try:
            return real_counts(counters)
        finally:
            counting[0] = False

    try:
        for name in READS:
            setattr(torch.Tensor, name, wrap(name))
        base.read_counts = read_counts
        yield seen
    finally:
        for name, fn in real.items():
            setattr(torch.Tensor, name, fn)
        base.read_counts = real_counts


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
    # "auto" is "mixed" on a CPU with bf16 units: inductor fuses its bf16 steps, which then
    # round in another order than eager's (5.5e-5 apart after three steps, measured)
    from spectra.ops import soft_clip_method

    bf16_steps = soft_clip_method(method, torch.device("cpu")) == "mixed"
    torch._dynamo.reset()
    eager = train_three_steps(False, method)
    compiled = train_three_steps(True, method)
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=2e-4 if bf16_steps else 1e-5)


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


# --------------------------------------------------------------------------- capturable

CAPTURABLE = {
    **NATIVE,
    # with its warmups, whose schedules then run on the device's step counts
    "AdEMAMix": lambda ps, **kw: so.AdEMAMix(ps, lr=1e-2, alpha_warmup=3, beta3_warmup=3, **kw),
}


def ref_soft_clip(X: torch.Tensor, c: float) -> torch.Tensor:
    U, S, Vh = torch.linalg.svd(X.double(), full_matrices=False)
    return (U * (S / torch.sqrt(1 + S**2 / c**2)).unsqueeze(-2)) @ Vh


def spiked(r: float, seed: int = 0) -> torch.Tensor:
    """A 48×96 bulk of σ ≲ 1.5 plus one direction of σ = r, four matrices."""
    g = torch.Generator().manual_seed(seed)
    u, v = torch.randn(4, 48, 1, generator=g), torch.randn(4, 1, 96, generator=g)
    spike = u @ v / (u.norm(dim=1, keepdim=True) * v.norm(dim=2, keepdim=True))
    return torch.randn(4, 48, 96, generator=g) / 10 + r * spike


@pytest.mark.parametrize(
    "method, r, bound",
    [
        ("polar", 0.5, 1e-4),
        ("polar", 10.0, 1e-3),
        ("polar", 1e3, 1e-2),
        ("mixed", 0.5, 1e-2),
        ("mixed", 10.0, 1e-2),
        ("mixed", 1e3, 1e-2),
    ],
)
def test_a_capturable_soft_clip_matches_the_float64_svd(method, r, bound):
    # No α read: "polar"/"mixed" run the schedule for the largest α float32 resolves (1e6,
    # σ_max/c ≤ 1e3), which brings every smaller α within tol too; beyond, the float32 Gram
    # matrix cannot resolve the bulk (docs/operators.md).
    from spectra.ops import soft_clip

    X = spiked(r)
    ref = ref_soft_clip(X, 1.0)
    Y = soft_clip(X, 1.0, method=method, capturable=True)
    assert ((Y.double() - ref).norm() / ref.norm()).item() <= bound
    assert Y.dtype == X.dtype and Y.shape == X.shape


def test_the_papers_algorithm_reads_nothing_anyway():
    from spectra.ops import soft_clip

    X = spiked(10.0)
    Y = soft_clip(X, 1.0, method="paper", capturable=True)
    assert torch.equal(Y, soft_clip(X, 1.0, method="paper"))


def test_capturable_ops_refuse_the_methods_that_need_the_host():
    from spectra.ops import hard_clip, orthogonalize, soft_clip

    X = torch.randn(8, 12)
    with pytest.raises(ValueError, match="soft_clip method 'eigh' cannot run without a host read"):
        soft_clip(X, 1.0, method="eigh", capturable=True)
    with pytest.raises(ValueError, match=r"orthogonalize method 'svd'.*muon, polar_express"):
        orthogonalize(X, method="svd", capturable=True)
    with pytest.raises(TypeError):
        hard_clip(X, 1.0, capturable=True)  # no method of it can
    nan = X.clone()
    nan[0, 0] = float("nan")
    assert soft_clip(nan, 1.0, capturable=True).isnan().any()  # passed through, not read


@pytest.mark.parametrize("name", list(CAPTURABLE))
@pytest.mark.parametrize(
    "kw",
    [
        {"clip_c": 0.5},
        {"clip_c": 0.5, "clip_method": "mixed", "pre_clip_c": 2.0, "chunk_elements": 3000},
        {"post": "orthogonalize", "clip_method": "muon"},
    ],
)
def test_a_capturable_step_reads_nothing_on_the_host(name, kw, monkeypatch):
    seen = reads_of_one_step(CAPTURABLE[name], capturable=True, **kw)
    assert seen == [], seen


def train(make, steps: int = 4, compile_backend: str | None = None, lr_values=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 8))
    opt = make(model.parameters())
    step = opt.step
    if compile_backend is not None:
        step = so.compile_step(opt, backend=compile_backend)
    gen = torch.Generator().manual_seed(1)
    for k in range(steps):
        if lr_values is not None:
            opt.param_groups[0]["lr"].fill_(lr_values[k])
        x = torch.randn(32, 16, generator=gen)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        step()
    return [p.detach().clone() for p in model.parameters()], opt


#: A compiled step against the eager one: the 1e-5 the step is held to (torch 2.13's trace
#: agrees to 1e-6 here, torch 2.11's differs by up to 1.4e-6 in float32)
COMPILED_ATOL = 1e-5


def assert_params_close(a, b, atol):
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(y, x, rtol=0, atol=atol)


def check_compiles_whole(name: str) -> None:
    """``CAPTURABLE[name]``'s capturable step compiled with ``fullgraph=True`` (which raises at
    the first graph break; the eager backend keeps the math as is) matches the eager one."""
    torch._dynamo.reset()
    make = lambda ps: CAPTURABLE[name](ps, clip_c=0.5, capturable=True)  # noqa: E731
    eager, _ = train(make)
    compiled, opt = train(make, compile_backend="eager")
    assert_params_close(eager, compiled, COMPILED_ATOL)
    assert int(opt.num_skipped_steps) == 0


@pytest.mark.parametrize("name", list(CAPTURABLE))
def test_a_capturable_step_compiles_whole_and_matches_eager(name):
    check_compiles_whole(name)


@pytest.mark.parametrize("name", ["AdamW", "MARS"])
def test_a_capturable_step_on_the_gpus_path_compiles_whole_and_matches_eager(name, monkeypatch):
    # the GPU's multi-tensor finite check and foreach Adam (with its bias corrections from the
    # device counts) trace whole too
    from spectra.optim import adamw, chain

    monkeypatch.setattr(chain, "PER_TENSOR_CHECK_DEVICES", ())
    monkeypatch.setattr(adamw, "PER_TENSOR_DEVICES", ())
    check_compiles_whole(name)


def test_a_capturable_adamw_step_compiled_by_inductor_matches_eager():
    # float32 "polar": bf16 steps ("mixed", this CPU's default) round differently once fused
    torch._dynamo.reset()
    make = lambda ps: so.AdamW(ps, lr=1e-2, clip_c=0.5, clip_method="polar", capturable=True)  # noqa: E731
    eager, _ = train(make)
    compiled, _ = train(make, compile_backend="inductor")
    assert_params_close(eager, compiled, 1e-5)


@pytest.mark.parametrize(
    ("version", "options"),
    [
        ("2.10.1", {"loop_ordering_after_fusion": False}),
        ("2.11.0+cu130", {"loop_ordering_after_fusion": False}),
        ("2.12.0", {}),
        ("2.13.0+cpu", {}),
    ],
)
def test_inductor_loop_reordering_is_off_before_torch_2_12(version, options):
    # torch 2.11 asserts in FusedSchedulerNode.reorder_loops_by_dep_pair on fused foreach nodes
    assert so.inductor_options(version) == options


def test_compile_step_passes_the_options_to_inductor_alone(monkeypatch):
    seen = []
    monkeypatch.setattr(
        so.compiled, "inductor_options", lambda: {"loop_ordering_after_fusion": False}
    )
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    opt = so.AdamW([nn.Parameter(torch.ones(3, 2))], lr=1e-2, capturable=True)
    so.compile_step(opt)
    so.compile_step(opt, backend="eager")
    assert seen == [
        {"fullgraph": True, "options": {"loop_ordering_after_fusion": False}},
        {"fullgraph": True, "backend": "eager"},
    ]


def test_a_compiled_step_under_an_lr_scheduler_matches_eager_without_a_warning():
    lrs = [1e-2 * 0.5**k for k in range(4)]

    def run(compiled):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 8))
        opt = so.AdamW(model.parameters(), lr=torch.tensor(1e-2), clip_c=0.5, capturable=True)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5**k)
        step = so.compile_step(opt, backend="eager") if compiled else opt.step
        gen = torch.Generator().manual_seed(1)
        for k in range(4):
            assert float(opt.param_groups[0]["lr"]) == pytest.approx(lrs[k])
            opt.zero_grad()
            model(torch.randn(32, 16, generator=gen)).pow(2).mean().backward()
            step()
            sched.step()
        return [p.detach().clone() for p in model.parameters()]

    eager = run(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()" among them
        compiled = run(True)
    assert_params_close(eager, compiled, COMPILED_ATOL)


@pytest.mark.parametrize("name", list(CAPTURABLE))
def test_a_capturable_step_equals_the_step_that_reads(name):
    # the same chain: only the clip's schedule differs (the longest one, against the one read)
    common = {"clip_c": 0.5, "clip_method": "polar"}
    reads, _ = train(lambda ps: CAPTURABLE[name](ps, **common))
    capturable, _ = train(lambda ps: CAPTURABLE[name](ps, capturable=True, **common))
    assert_params_close(reads, capturable, 1e-5)


def test_a_tensor_lr_is_read_live_by_one_compiled_graph():
    # a warm-up step creates the state; then one graph serves every lr
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    lrs = [1e-2, 5e-3, 2e-2, 1e-3, 1e-2]
    torch._dynamo.reset()

    def make(ps):
        return so.AdamW(ps, lr=torch.tensor(lrs[0]), clip_c=0.5, capturable=True)

    eager, _ = train(make, steps=5, lr_values=lrs)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 8))
    opt = make(model.parameters())
    step = torch.compile(opt.step, fullgraph=True, backend=backend)
    gen = torch.Generator().manual_seed(1)
    for k, lr in enumerate(lrs):
        opt.param_groups[0]["lr"].fill_(lr)
        x = torch.randn(32, 16, generator=gen)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        (opt.step if k == 0 else step)()
    assert len(graphs) == 1
    assert_params_close(eager, [p.detach() for p in model.parameters()], COMPILED_ATOL)


def test_a_capturable_step_skips_a_nonfinite_gradient_on_the_device():
    torch.manual_seed(0)
    ps = [torch.randn(6, 8, requires_grad=True), torch.randn(8, requires_grad=True)]
    opt = so.AdamW(ps, lr=1e-2, clip_c=0.5, capturable=True)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    before = [p.detach().clone() for p in ps]
    ps[0].grad[2, 3] = float("nan")
    opt.step()  # no error, no warning: nothing is read
    assert all(torch.equal(a, p) for a, p in zip(before, ps, strict=True))
    assert torch.is_tensor(opt.num_skipped_steps) and int(opt.num_skipped_steps) == 1
    assert float(opt.state[ps[1]]["step"]) == 2  # the state took the step, as documented


def test_a_capturable_run_resumes_from_its_state_dict():
    make = lambda ps: so.AdamW(ps, lr=1e-2, clip_c=0.5, capturable=True)  # noqa: E731
    whole, _ = train(make, steps=4)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 8))
    opt = make(model.parameters())
    gen = torch.Generator().manual_seed(1)
    for k in range(4):
        if k == 2:  # a new optimizer from the saved state, as a resumed run builds it
            saved = opt.state_dict()
            opt = make(model.parameters())
            opt.load_state_dict(saved)
            assert opt.state[next(iter(model.parameters()))]["step"].dtype == torch.float32
        x = torch.randn(32, 16, generator=gen)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    assert_params_close(whole, [p.detach() for p in model.parameters()], 0.0)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"nonfinite": "raise"}, "nonfinite='raise' needs a host read"),
        ({"clip_schedule": lambda k: 1.0}, "clip_schedule=.* a function of the step count"),
        ({"pre_clip_kappa": 2.0}, "pre_clip_kappa=2.0 .* reads each gradient's scale"),
        ({"post": "hard_clip"}, "hard_clip method 'auto' cannot run without a host read"),
        ({"clip_method": "eigh"}, "soft_clip method 'eigh' cannot run without a host read"),
        ({"capturable": "yes"}, "capturable"),
    ],
)
def test_capturable_refuses_what_needs_the_host_at_construction(kw, match):
    kw = {"capturable": True, **kw}
    with pytest.raises(ValueError, match=match):
        so.AdamW([torch.randn(4, 4, requires_grad=True)], **kw)


def test_a_capturable_tensor_lr_must_be_where_the_parameters_are():
    # (parameters on the meta device stand in for a GPU's)
    meta = torch.empty(4, 4, device="meta", requires_grad=True)
    with pytest.raises(ValueError, match=r"on the parameters' device .*\(meta\), got one on cpu"):
        so.AdamW([meta], lr=torch.tensor(1e-3), capturable=True)
    p = torch.randn(4, 4, requires_grad=True)
    so.AdamW([p], lr=torch.tensor(1e-3), capturable=True)  # the same device: fine


def test_capturable_is_one_setting_for_the_whole_optimizer():
    a, b = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    with pytest.raises(ValueError, match="capturable=False in a param group"):
        so.AdamW([{"params": [a]}, {"params": [b], "capturable": False}], capturable=True)
    with pytest.raises(ValueError, match="Spectra has no capturable step"):
        so.Spectra(torch.optim.AdamW([a]), capturable=True)


def test_deferred_batches_read_in_waves_of_bounded_pending_state(monkeypatch):
    # off the CPU the Gram matrices of every deferred batch wait for the read; a call bounds
    # them (PENDING_FRACTION of its elements) with one read per wave, and the result is the
    # same whatever the waves: each batch reads its own α
    from spectra.ops import batched
    from spectra.optim.plan import SpectralOp

    op = SpectralOp("soft_clip", 0.5, "polar")
    gen = torch.Generator().manual_seed(0)
    shapes = [(64, 64)] * 4 + [(32, 96)] * 4
    mats = [torch.randn(s, generator=gen) for s in shapes]

    def run(**kw):
        out = [m.clone() for m in mats]
        with counted_reads(set()) as seen:
            batched.batched_apply_all_([(op, out)], max_elements=2 * 64 * 64, **kw)
        return out, seen

    one, seen = run()
    assert len(seen) == 1  # below PENDING_MIN: one read
    # 4 batches (two of 64², two of 32×96), of 2·64²·2 and 2·32²·2 pending elements
    waves, seen = run(max_pending=2 * 64 * 64 * 2)
    assert len(seen) == 3, seen  # [64²], [64²], [32×96, 32×96]
    for a, b in zip(one, waves, strict=True):
        assert torch.equal(a, b)
    monkeypatch.setattr(batched, "PENDING_MIN", 1)
    total = sum(m.numel() for m in mats)
    _, seen = run()  # the default: total / PENDING_FRACTION = 1792 elements a wave, below
    # every batch's pending state: a wave a batch
    assert total // batched.PENDING_FRACTION == 1792 and len(seen) == 4, seen


def test_a_capturable_step_with_expert_stacks_and_fused_blocks_compiles_whole():
    # per-expert matrices (clip_batch_dims) and the blocks of a fused tensor (clip_split), each
    # with its own α, through the step without host reads, eager and compiled whole
    torch.manual_seed(0)
    experts, fused = torch.randn(4, 16, 8), torch.randn(24, 8)

    def run(capturable: bool, compiled: bool = False) -> list[torch.Tensor]:
        ps = [experts.clone().requires_grad_(), fused.clone().requires_grad_()]
        groups = [{"params": [ps[0]], "clip_batch_dims": 1},
                  {"params": [ps[1]], "clip_split": ((8, 16), 0)}]  # fmt: skip
        opt = so.AdamW(groups, lr=1e-2, clip_c=0.5, clip_method="polar", capturable=capturable)
        step = torch.compile(opt.step, fullgraph=True, backend="eager") if compiled else opt.step
        for k in range(3):
            gen = torch.Generator().manual_seed(k)
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen)
            step()
        return [p.detach() for p in ps]

    torch._dynamo.reset()
    reads, capturable, compiled = run(False), run(True), run(True, True)
    assert_params_close(reads, capturable, 1e-5)
    assert_params_close(capturable, compiled, COMPILED_ATOL)


@pytest.mark.parametrize(
    "kw",
    [
        {"clip_c": 0.5, "pre_clip_c": 2.0, "chunk_elements": 500},
        {"post": "orthogonalize", "clip_method": "muon"},
        {"clip_c": 0.5, "clip_method": "paper"},
        {"clip_c": 0.5, "clip_method": "mixed", "clip_ns_dtype": torch.bfloat16},
        {"clip_c": 0.5, "clip_ns_dtype": torch.bfloat16, "clip_ratio_bound": 100.0},
    ],
)
def test_capturable_settings_compile_whole_and_match_eager(kw):
    # pre-clipping, chunks, orthogonalization, the paper's algorithm and split bf16 products
    # (three parts; two under a bound on σ_max/c) through the step without host reads,
    # compiled whole
    torch._dynamo.reset()
    make = lambda ps: so.AdamW(ps, lr=1e-2, capturable=True, **kw)  # noqa: E731
    eager, _ = train(make, steps=3)
    compiled, _ = train(make, steps=3, compile_backend="eager")
    assert_params_close(eager, compiled, COMPILED_ATOL)


def test_the_trainer_compiles_a_capturable_step_alone_and_only_when_asked(monkeypatch):
    from types import SimpleNamespace

    from spectra_lab.train.trainer import compiled_step

    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)

    def make(capturable):
        p = nn.Parameter(torch.ones(4, 3))
        p.grad = torch.ones(4, 3)
        return p, so.AdamW([p], lr=torch.tensor(0.1), clip_c=0.5, capturable=capturable)

    for capturable, compile_ in ((False, True), (True, False)):
        _, opt = make(capturable)
        assert compiled_step(opt, SimpleNamespace(compile=compile_)) == opt.step
    assert seen == []
    p, opt = make(True)
    step = compiled_step(opt, SimpleNamespace(compile=True))
    assert [kw["fullgraph"] for kw in seen] == [True]
    step()
    assert not torch.equal(p.detach(), torch.ones(4, 3))
