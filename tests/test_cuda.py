"""Every operator and optimizer on a CUDA GPU, against float64 references computed on the CPU.

Marked ``cuda``: the default run deselects them (``-m 'not cuda'`` in pyproject.toml) and
``make gpu-check`` runs them (``pytest -m cuda``). Without a GPU each fails with one line.

* Operators: float32 and bf16 inputs, single and batched, against the float64 SVD of the same
  (dtype-rounded) input.
* Optimizers: every entry of the conformance suite, three steps in float32 and in bf16 from the
  same gradients, against the float64 run on the CPU: the CUDA run must be as close to it as the
  CPU run in the same dtype is, or within 1e-2 of it (the CUDA default route for float32 and
  bf16 is the matmul-only ``mixed``, within 1e-2 of the float64 SVD; the CPU's is ``mixed``
  or the exact ``eigh``, as its bf16 units say).
* bf16 autocast in the trainer, ``torch.compile`` of ``optimizer.step``, and NCCL with world
  size 1 through the FSDP2 path and the trainer.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

import spectra.optim as so
from spectra.ops import (
    coordinate_clip,
    global_clip,
    hard_clip,
    orthogonalize,
    soft_clip,
    soft_clip_method,
)
from spectra_lab.runs.records import read_jsonl
from spectra_lab.train import train
from test_conformance import ENTRIES, feed, params
from test_distributed import BASELINES, OPTIMIZERS, _net_run
from test_train import VOCAB, small_config, write_dataset

pytestmark = pytest.mark.cuda
C = 1.0


@pytest.fixture(autouse=True)
def gpu():
    """Fail (not skip) without a GPU; full float32 matmuls (no TF32) while a test runs."""
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: the cuda tests need one (make gpu-check runs them)")
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield torch.device("cuda")
    torch.set_float32_matmul_precision(precision)


# --------------------------------------------------------------------------- operators


def spread_matrix(shape: tuple[int, ...], top: float, seed: int = 0) -> torch.Tensor:
    """A float64 matrix (batch) with singular values log-spaced from ``top`` down to 1e-3·c."""
    g = torch.Generator().manual_seed(seed)
    *batch, m, n = shape
    k = min(m, n)
    U, _ = torch.linalg.qr(torch.randn(*batch, m, k, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(*batch, n, k, generator=g, dtype=torch.float64))
    s = torch.logspace(math.log10(top), -3, k, dtype=torch.float64) * C
    return U @ torch.diag_embed(s.expand(*batch, k)) @ V.mT


def svd_map(X: torch.Tensor, phi) -> torch.Tensor:
    U, s, Vh = torch.linalg.svd(X.double(), full_matrices=False)
    return U @ torch.diag_embed(phi(s)) @ Vh


SOFT = lambda s: s / torch.sqrt(1 + (s / C) ** 2)  # noqa: E731
HARD = lambda s: s.clamp(max=C)  # noqa: E731
ORTH = lambda s: (s > s.amax(-1, keepdim=True) * 1e-12).double()  # noqa: E731
#: name -> (operator on the device, its float64 reference, bound on the error in float32)
OPERATORS = {
    "soft_clip/auto": (lambda X: soft_clip(X, C), SOFT, 1e-2),  # "mixed" on CUDA
    "soft_clip/polar": (lambda X: soft_clip(X, C, method="polar"), SOFT, 2e-3),
    "soft_clip/polar-bf16": (
        lambda X: soft_clip(X, C, method="polar", ns_dtype=torch.bfloat16),
        SOFT,
        1e-2,
    ),
    "soft_clip/mixed": (lambda X: soft_clip(X, C, method="mixed"), SOFT, 1e-2),
    "soft_clip/eigh": (lambda X: soft_clip(X, C, method="eigh"), SOFT, 1e-4),
    "soft_clip/svd": (lambda X: soft_clip(X, C, method="svd"), SOFT, 1e-4),
    "hard_clip/auto": (lambda X: hard_clip(X, C), HARD, 1e-4),
    "hard_clip/svd": (lambda X: hard_clip(X, C, method="svd"), HARD, 1e-4),
    "orthogonalize/svd": (lambda X: orthogonalize(X), ORTH, 1e-4),
}
SHAPES = [(96, 48), (48, 96), (3, 40, 72)]


def rel_error(Y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((Y.double().cpu() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", OPERATORS)
def test_operator_on_cuda_matches_the_float64_svd(name, shape, dtype, gpu):
    op, phi, bound = OPERATORS[name]
    X = spread_matrix(shape, top=30.0).to(dtype)  # σ_max/c = 30, as in training
    Y = op(X.to(gpu))
    assert Y.device.type == "cuda" and Y.dtype == dtype and Y.shape == X.shape
    # bf16 output: its own rounding (≈ 2e-3 of the Frobenius norm) comes on top
    assert rel_error(Y, svd_map(X, phi)) <= (bound if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_mixed_on_cuda_takes_split_bf16_products_for_large_matrices(dtype, gpu):
    """At a smaller side of MIXED_SPLIT_FROM or more the default ``mixed`` call is the
    bf16-first one, within 1e-2 of the float64 SVD; below it, the float32 one."""
    from spectra.ops.mixed import MIXED_SPLIT_FROM

    X = spread_matrix((MIXED_SPLIT_FROM, MIXED_SPLIT_FROM + 256), top=30.0).to(dtype)
    Y = soft_clip(X.to(gpu), C, method="mixed")
    assert torch.equal(Y, soft_clip(X.to(gpu), C, method="mixed", ns_dtype=torch.bfloat16))
    assert rel_error(Y, svd_map(X, SOFT)) <= 1e-2
    small = X[: MIXED_SPLIT_FROM - 1].to(gpu)
    plain = soft_clip(small, C, method="mixed", ns_dtype=torch.float32)
    assert torch.equal(soft_clip(small, C, method="mixed"), plain)


#: kind of ``spectra bench products`` -> its error bound relative to ``|A||B|`` (CUDA sums)
PRODUCT_TOL = {"fp32": 1e-5, "bf16": 8e-3, "bf16-fp32": 1e-5, "split": 4e-5, "split-gram": 4e-5}


@pytest.mark.parametrize("kind", PRODUCT_TOL)
def test_each_product_of_bench_products_on_cuda_is_the_product_it_names(kind, gpu):
    """The forms the clip's products take on CUDA (``bf16-fp32``: one bf16 product with a
    float32 result, ``out_dtype``), against the float64 product of the same operands (of
    their bf16 copies for the bf16 kinds)."""
    from spectra_lab.bench import products

    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(2, 96, 160, generator=g), torch.randn(2, 160, 64, generator=g)
    out = products.operations(A.to(gpu), B.to(gpu))[kind]().cpu()
    if kind.startswith("bf16"):
        A, B = A.bfloat16(), B.bfloat16()
    A64, B64 = A.double(), (A.mT if kind == "split-gram" else B).double()
    scale = A64.abs() @ B64.abs()
    assert out.dtype == (torch.bfloat16 if kind == "bf16" else torch.float32)
    assert ((out.double() - A64 @ B64).abs() <= PRODUCT_TOL[kind] * scale).all()


#: method -> (steps, σ/‖X‖_F kept, band of the kept singular values): orthogonalize's docstring
BANDS = {"polar_express": (6, 1e-3, (0.9986, 1.0014)), "muon": (5, 1e-2, (0.68, 1.14))}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("method", BANDS)
def test_iterative_orthogonalization_on_cuda_lands_in_its_documented_band(method, dtype, gpu):
    steps, floor, (lo, hi) = BANDS[method]
    slack = 1e-3 if dtype == torch.float32 else 2e-2  # the output's own rounding
    X = spread_matrix((96, 48), top=30.0).to(dtype)
    Y = orthogonalize(X.to(gpu), method=method, ns_steps=steps)
    # the polynomial maps each singular direction of X to itself: read its gain there
    U, sx, Vh = torch.linalg.svd(X.double(), full_matrices=False)
    gain = torch.diagonal(U.mT @ Y.double().cpu() @ Vh.mT)
    kept = gain[sx >= floor * X.double().norm()]
    assert Y.dtype == dtype and lo - slack <= kept.min() and kept.max() <= hi + slack, kept


@pytest.mark.parametrize("op", [global_clip, coordinate_clip], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_elementwise_clips_on_cuda_match_the_cpu(op, dtype, gpu):
    X = spread_matrix((3, 40, 72), top=30.0).to(dtype)
    ref = op(X.double(), 0.05)
    assert rel_error(op(X.to(gpu), 0.05), ref) <= (1e-6 if dtype == torch.float32 else 5e-3)


# --------------------------------------------------------------------------- optimizers


def displacement(entry, dtype: torch.dtype, device: str, lr: float) -> list[torch.Tensor]:
    """``p₃ − p₀`` in float64 on the CPU after three steps of ``entry`` from the same grads."""
    ps = [p.detach().to(device).requires_grad_() for p in params(dtype)]
    start = [p.detach().double().cpu().clone() for p in ps]
    opt = entry(ps) if entry.name.startswith("Spectra(SGD)") else entry(ps, lr=lr)
    for k in range(3):
        feed(ps, k)
        opt.step()
    for p in ps:
        for key, value in opt.state[p].items():
            if torch.is_tensor(value) and value.dim() > 0 and key != "step":
                assert value.device == p.device, key
    return [p.detach().double().cpu() - s for p, s in zip(ps, start, strict=True)]


def distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = sum(float((x - y).square().sum()) for x, y in zip(a, b, strict=True))
    return math.sqrt(num / sum(float(y.square().sum()) for y in b))


@pytest.mark.parametrize(
    ("dtype", "lr", "floor"),
    [(torch.float32, 1e-3, 1e-2), (torch.bfloat16, 1e-1, 2e-2)],
    ids=["fp32", "bf16"],
)
@pytest.mark.parametrize("entry", ENTRIES, ids=repr)
def test_optimizer_on_cuda_is_as_close_to_float64_as_on_the_cpu(entry, dtype, lr, floor, gpu):
    # bf16 weights hold an update only where it exceeds their rounding: lr 0.1 makes it visible
    ref = displacement(entry, torch.float64, "cpu", lr)
    cpu = distance(displacement(entry, dtype, "cpu", lr), ref)
    cuda = distance(displacement(entry, dtype, "cuda", lr), ref)
    assert cuda <= max(3 * cpu, floor), (cuda, cpu)


@pytest.mark.parametrize("method", ["auto", "mixed"])
def test_compiled_optimizer_step_on_cuda_matches_eager(method, gpu):
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        ps = [torch.randn(s, device=gpu, requires_grad=True) for s in ((64, 32), (32,))]
        opt = so.AdamW(ps, lr=1e-2, clip_c=0.5, clip_method=method)
        step = torch.compile(opt.step) if compiled else opt.step
        for k in range(3):
            g = torch.Generator(device=gpu).manual_seed(k)
            for p in ps:
                p.grad = 3 * torch.randn(p.shape, generator=g, device=gpu)
            step()
        runs.append([p.detach() for p in ps])
    # inductor fuses "mixed"'s bf16 steps ("auto" picks it on CUDA), which then round in
    # another order than eager's
    mixed = soft_clip_method(method, torch.device(gpu), torch.float32) == "mixed"
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-4 if mixed else 1e-5)


@pytest.mark.parametrize("method", ["polar", "mixed"])
def test_a_capturable_step_compiled_whole_on_cuda_matches_eager(method, gpu):
    # inductor's CUDA code generation of the whole step (torch 2.11 failed here with loop
    # reordering after fusion on; spectra.optim.compile_step turns it off there)
    lrs = [1e-2, 5e-3, 2e-2, 1e-3]
    runs = []
    for compiled in (False, True):
        torch._dynamo.reset()
        torch.manual_seed(0)
        ps = [torch.randn(s, device=gpu, requires_grad=True) for s in ((64, 32), (32, 96), (48,))]
        lr = torch.tensor(lrs[0], device=gpu)
        opt = so.AdamW(ps, lr=lr, clip_c=0.5, clip_method=method, capturable=True)
        step = so.compile_step(opt) if compiled else opt.step
        for k, value in enumerate(lrs):
            lr.fill_(value)
            for p, g in zip(ps, cuda_grads(ps, k, gpu), strict=True):
                p.grad = g
            step()
        runs.append([p.detach().clone() for p in ps])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=2e-4 if method == "mixed" else 1e-5)


def cuda_grads(ps, k, gpu):
    g = torch.Generator(device=gpu).manual_seed(k)
    return [3 * torch.randn(p.shape, generator=g, device=gpu) for p in ps]


@pytest.mark.parametrize(
    "method, ns_dtype, bound",
    [("auto", None, None), ("mixed", None, None), ("mixed", torch.bfloat16, None),
     ("mixed", torch.bfloat16, 100.0)],
)  # fmt: skip
def test_a_captured_capturable_step_replays_as_eager_with_a_changing_lr(
    method, ns_dtype, bound, gpu
):
    # torch's recipe: warm-up steps on a side stream, capture one step, then per step copy the
    # gradients and the lr into the captured tensors and replay; bf16: split products of three
    # parts, or of two under a ratio bound
    shapes = ((64, 32), (64, 32), (32, 96), (48,))
    lrs = [1e-2, 5e-3, 2e-2, 1e-3, 7e-3, 1e-2]
    runs = []
    for captured in (False, True):
        torch.manual_seed(0)
        ps = [torch.randn(s, device=gpu, requires_grad=True) for s in shapes]
        lr = torch.tensor(lrs[0], device=gpu)
        opt = so.AdamW(ps, lr=lr, clip_c=0.5, clip_method=method, clip_ns_dtype=ns_dtype,
                       clip_ratio_bound=bound, capturable=True)  # fmt: skip
        for p, g in zip(ps, cuda_grads(ps, 0, gpu), strict=True):
            p.grad = g
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            opt.step()  # the state is created here, outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if captured:
            with torch.cuda.graph(graph):
                opt.step()
        for k, value in enumerate(lrs[1:], start=1):
            lr.fill_(value)
            for p, g in zip(ps, cuda_grads(ps, k, gpu), strict=True):
                p.grad.copy_(g)
            graph.replay() if captured else opt.step()
        torch.cuda.synchronize()
        runs.append([p.detach().clone() for p in ps])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def syncs_of_a_second_step(opt, ps) -> list[str]:
    """The host synchronisations CUDA reports during ``opt.step()`` after a first step (which
    creates the state), with fresh gradients."""
    import warnings

    for _ in range(2):
        for p in ps:
            p.grad = torch.randn_like(p)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                opt.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    return [str(w.message) for w in seen if "synchroniz" in str(w.message).lower()]


def test_a_capturable_step_on_cuda_never_synchronises(gpu):
    torch.manual_seed(0)
    ps = [torch.randn(s, device=gpu, requires_grad=True) for s in ((64, 32), (32, 96), (48,))]
    opt = so.AdamW(ps, lr=torch.tensor(1e-2, device=gpu), clip_c=0.5, capturable=True)
    assert syncs_of_a_second_step(opt, ps) == []


@pytest.mark.parametrize("method", ["auto", "mixed"])
def test_a_default_step_on_cuda_synchronises_once(method, gpu):
    # the gradients' and directions' finite checks and every batch's α in one read
    torch.manual_seed(0)
    shapes = ((64, 32), (64, 32), (32, 96), (48,), (4, 8, 3))
    ps = [torch.randn(s, device=gpu, requires_grad=True) for s in shapes]
    opt = so.AdamW(ps, lr=1e-2, clip_c=0.5, clip_method=method)
    syncs = syncs_of_a_second_step(opt, ps)
    assert len(syncs) == 1, syncs


# --------------------------------------------------------------------------- trainer


@pytest.fixture(scope="module")
def train_dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data") / "markov")


def final_val_loss(cfg) -> float:
    train(cfg)
    evals = [r for r in read_jsonl(cfg.out_dir + "/metrics.jsonl") if r["kind"] == "eval"]
    return evals[-1]["val_loss"]


def test_bf16_autocast_training_on_cuda_follows_the_float32_run(train_dataset, tmp_path, gpu):
    losses = {}
    for autocast in ("bf16", "none"):
        cfg = small_config(train_dataset, tmp_path / autocast, device="cuda", steps=10,
                           optimizer="spectra-adamw", autocast=autocast)  # fmt: skip
        losses[autocast] = final_val_loss(cfg)
    assert math.isfinite(losses["bf16"]) and losses["bf16"] < math.log(VOCAB)
    assert losses["bf16"] == pytest.approx(losses["none"], rel=2e-2)


# --------------------------------------------------------------------------- NCCL, world size 1


def test_nccl_world_size_one_fsdp2_equals_the_unsharded_run(gpu):
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for name in [*OPTIMIZERS, *BASELINES]:
            got = _net_run(name, sharded=True, device="cuda", world=1)
            for key, value in _net_run(name, sharded=False, device="cuda").items():
                torch.testing.assert_close(got[key], value, rtol=1e-10, atol=1e-12)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("parallel", ["fsdp2", "tp"])
def test_trainer_sharded_on_nccl_equals_the_plain_run(train_dataset, tmp_path, parallel, gpu):
    losses = []
    for mode in ("ddp", parallel):
        cfg = small_config(train_dataset, tmp_path / mode, device="cuda", steps=6,
                           optimizer="spectra-adamw", parallel=mode)  # fmt: skip
        losses.append(final_val_loss(cfg))
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)


def test_nccl_world_size_one_gram_route_equals_the_operator(gpu):
    """The Gram route's code on CUDA and NCCL: with one rank nothing is split, so it is called
    directly with a route that treats the rank's part as the long side's share; it gives the
    float64 SVD's clip."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from spectra.optim import distributed as spectra_dist
    from spectra.optim.plan import SpectralOp

    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cuda", (1,))
        g = torch.Generator(device="cuda").manual_seed(0)
        for shape, dtype in (((96, 24), torch.float64), ((24, 96), torch.float32)):
            full = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
            p = distribute_tensor(full, mesh, [Shard(0)])
            route = spectra_dist.Route(True, shape[0] > shape[1], (0,), (), 0.0)
            ops = (
                (SpectralOp("soft_clip", 0.5), lambda s: s / torch.sqrt(1 + (s / 0.5) ** 2)),
                (SpectralOp("orthogonalize", None), ORTH),
            )
            for op, phi in ops:
                u = p.to_local().clone()
                spectra_dist.apply_gram([(op, u, p, shape, route)])
                # against the float64 SVD: float64 takes the exact weights from the float64
                # eigh of G; a float32 soft clip takes "mixed" (CUDA's default), within 1e-2
                want = svd_map(full, phi).to(dtype)
                tol = 1e-10 if dtype == torch.float64 else 1e-2 if op.kind == "soft_clip" else 1e-4
                torch.testing.assert_close(u, want, rtol=tol, atol=tol)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("capturable", [False, True])
def test_the_124m_step_peak_memory_is_within_ten_percent_of_torch_adamw(capturable, gpu):
    # the default step reads in waves of bounded pending state; the capturable one holds one
    # batch at a time
    from spectra_lab.bench.optim import llama_shapes

    def peak(make) -> int:
        torch.manual_seed(0)
        ps = [torch.randn(s, device=gpu, requires_grad=True) for s in llama_shapes()]
        for p in ps:
            p.grad = 1e-3 * torch.randn_like(p)
        opt = make(ps)
        opt.step()  # the state exists from here on
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        torch.cuda.synchronize()
        out = torch.cuda.max_memory_allocated()
        del opt, ps
        torch.cuda.empty_cache()
        return out

    ref = peak(lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True))
    mine = peak(lambda ps: so.AdamW(ps, lr=1e-3, clip_c=10.0, capturable=capturable))
    assert mine <= 1.10 * ref, (mine / ref, mine, ref)
