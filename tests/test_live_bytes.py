"""The CPU model of the GPU step's peak memory (``spectra_lab.bench.live_bytes``): the counter
against closed forms, and the step's peak along the CUDA code path."""

from __future__ import annotations

import pytest
import torch

import spectra.ops.batched as batched
import spectra.optim as so
from spectra_lab.bench.live_bytes import LiveBytes, gpu_path_peak, step_peak
from spectra_lab.bench.optim import llama_shapes

MB = 4 * 10**6  # a float32 1000 × 1000


def test_the_counter_follows_storages_from_creation_to_free():
    with LiveBytes() as mode:
        a = torch.randn(1000, 1000)
        b = a * 2  # two alive
        del a
        c = b + 1  # two alive again
        view = c[1:]  # a view: no storage
        c.mul_(3)  # in place: none
        torch.add(b, 1, out=c)  # out=: none
        del b
        assert mode.live == MB and mode.peak == 2 * MB
        del c, view
        assert mode.live == 0
    # storages made before the mode are not counted
    x = torch.ones(1000, 1000)
    with LiveBytes() as mode:
        x.add_(1)
        y = x.sum()
    assert mode.peak == y.untyped_storage().nbytes() == 4


def test_torch_adamw_foreach_holds_one_temporary_of_the_parameters():
    # its foreach step's largest temporary is the list of √v (one float32 per parameter)
    shapes = [(64, 32), (32,), (48, 48)]
    peak, held = step_peak(lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True), shapes)
    params = sum(torch.Size(s).numel() for s in shapes)
    # parameters, gradients, m and v, and a 0-d float32 step count a parameter
    assert held == 4 * 4 * params + 4 * len(shapes)
    assert 4 * params <= peak <= 2 * 4 * params


def test_split_products_on_the_gpu_code_path_allocate_their_float32_result_alone():
    """Along the CUDA code path a split product's bf16 operands meet in one product with a
    float32 result (``out_dtype``, as on CUDA), the float32 copies of the CPU's emulation
    hidden; the CUDA rule of ``mixed`` (split products for large matrices) holds there."""
    from spectra.ops import _common, mixed
    from spectra_lab.bench.live_bytes import gpu_code_path

    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(3, 500, 700, generator=g), torch.randn(3, 700, 400, generator=g)
    a, b = A.bfloat16(), B.bfloat16()
    with gpu_code_path():
        assert mixed.SPLIT_DEVICES == ("cuda", "cpu")
        with LiveBytes() as mode:
            out = _common.bf16_products_fp32(a, b)
    assert out.dtype == torch.float32 and mode.peak == out.numel() * 4
    assert torch.equal(out, a.float() @ b.float())
    assert mixed.SPLIT_DEVICES == ("cuda",)
    assert _common.bf16_products_fp32 is not _common._float32_output_products


@pytest.mark.parametrize("capturable", [False, True])
def test_the_batch_and_wave_fractions_bound_the_gpu_steps_peak(capturable, monkeypatch):
    # the matrices of a small Llama: the fractions' floors hold here, so the ratio is above the
    # 124M shapes' (experiments/gpu_step_memory_model.py), but within the GPU step's 1.10x bar,
    # the capturable step's too (1.118x while the coupled steps held the first step, M̂ and
    # the last Q through the later steps); the old fractions held more (by less since a
    # batch holds no Gram matrix through its steps: 0.047 then)
    shapes = llama_shapes(layers=12, dim=384, hidden=1024, vocab=8192)

    def make(ps):
        return so.AdamW(ps, lr=1e-3, clip_c=10.0, clip_method="mixed", capturable=capturable)

    now = gpu_path_peak(make, shapes)
    assert now <= 1.10, now
    if not capturable:  # (the capturable step reads nothing, so it holds no waves)
        monkeypatch.setattr(batched, "MATMUL_BATCH_FRACTION", 8)
        monkeypatch.setattr(batched, "PENDING_FRACTION", 4)
        before = gpu_path_peak(make, shapes)
        assert before - now >= 0.04, (now, before)


@pytest.mark.parametrize(
    ("method", "ns_dtype", "units"),
    [
        # Z, Y, the step's polynomial Q and the product being formed: no G or G² through the
        # steps (M̂ and the first step are formed in their storage and freed once used)
        ("mixed", None, 4),
        # two of Z, Y and Q, the split operands of a product (1.5 units each: three bf16
        # halves) and its float32 result: the operand a product replaces (Z in QZ, Y in YQ)
        # goes once split
        ("mixed", torch.bfloat16, 6),
        # its caller holds M̂ and M̂² through the steps, which hold Z, Y, E and a product
        ("polar", None, 6),
    ],
)
def test_a_soft_clip_call_holds_the_working_set_of_its_steps_alone(method, ns_dtype, units):
    """Along the CUDA code path, a call's peak over a batch of square matrices, in units of
    the batch's float32 bytes: the working set of its coupled steps, nothing held beside it."""
    from spectra.ops import soft_clip
    from spectra.ops.polar import polar_steps
    from spectra_lab.bench.live_bytes import gpu_code_path

    g = torch.Generator().manual_seed(0)
    X = torch.randn(8, 256, 256, generator=g) * (30.0 / 16)  # σ_max/c ≈ 60: α ≈ 3600
    with gpu_code_path():
        assert polar_steps(X, 1.0)[0] >= 4  # steps enough for the working set to show
        with LiveBytes() as mode:
            Y = soft_clip(X, 1.0, method=method, ns_dtype=ns_dtype)
    batch = X.numel() * 4
    assert units * batch <= mode.peak < (units + 0.01) * batch  # (and per-matrix scalars)
    assert Y.shape == X.shape and torch.isfinite(Y).all()
