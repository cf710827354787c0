"""Split bf16 products of three parts ("bf16x6"), and the capturable soft clips that take them:
float32's accuracy from bf16 products alone, for every α float32 resolves, with no host read."""

from __future__ import annotations

import math

import pytest
import torch

from spectra.ops import soft_clip
from spectra.ops._common import (
    _split_concat,
    split_bf16_gram,
    split_bf16_left,
    split_bf16_matmul,
    split_bf16_product,
    split_bf16_right,
)
from spectra_lab.bench.matrices import spiked
from test_ops import _ProductFlops, rel_err, soft_ref


def entrywise_error(got: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> float:
    """``max |got − AB| / (|A||B|)`` against the float64 product."""
    exact = A.double() @ B.double()
    return ((got.double() - exact).abs() / (A.double().abs() @ B.double().abs())).max().item()


def test_three_bf16_parts_hold_a_float32_matrix_to_its_last_bit():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 17, 29, generator=g) * torch.logspace(-20, 20, 29)
    parts = _split_concat(A, -1, (1, 2, 3)).double().split(29, dim=-1)
    assert (A.double() - sum(parts)).abs().le(2.0**-24 * A.double().abs()).all()
    # each part is the rounding of what the parts before it leave
    assert torch.equal(parts[0].float(), A.bfloat16().float())
    assert torch.equal(parts[1].float(), (A - parts[0].float()).bfloat16().float())


@pytest.mark.parametrize("shape", [(2, 40, 300, 50), (3, 64, 64, 64), (1, 48, 20, 200)])
def test_three_part_split_products_are_as_accurate_as_float32(shape):
    """Six bf16 products (``A₁B₁ + A₁B₂ + A₂B₁ + A₁B₃ + A₂B₂ + A₃B₁``): within a few ``2⁻²⁴``
    of ``|A||B|`` entrywise, as the float32 product is, against about ``2⁻¹⁸`` for two parts;
    the Gram matrix from four products' flops, exactly symmetric, likewise."""
    b, m, k, n = shape
    g = torch.Generator().manual_seed(1)
    A = torch.randn(b, m, k, generator=g) * torch.logspace(-3, 3, k)
    B = torch.randn(b, k, n, generator=g)
    float32 = entrywise_error(A @ B, A, B)
    three, two = (entrywise_error(split_bf16_matmul(A, B, p), A, B) for p in (3, 2))
    assert three <= max(2 * float32, 4 * 2.0**-24) and two >= 8 * three
    # the product from parts split apart from it (what the coupled steps run), unblocked
    pieces = split_bf16_product(split_bf16_left(A, 3), split_bf16_right(B, 3), 3)
    assert entrywise_error(pieces, A, B) <= max(2 * float32, 4 * 2.0**-24)
    if max(m, n) <= 4 * k:  # no blocks (SPLIT_BLOCKS)
        assert torch.equal(pieces, split_bf16_matmul(A, B, 3))
    G = split_bf16_gram(A, 3)
    assert torch.equal(G, G.mT)
    gram32 = entrywise_error(A @ A.mT, A, A.mT)
    assert entrywise_error(G, A, A.mT) <= max(2 * gram32, 4 * 2.0**-24)
    assert entrywise_error(split_bf16_gram(A), A, A.mT) >= 4 * entrywise_error(G, A, A.mT)


def test_split_parts_other_than_two_or_three_are_refused_by_value():
    A = torch.randn(4, 4)
    for bad in (1, 4):
        with pytest.raises(ValueError, match=f"parts must be 2 or 3, got {bad}"):
            split_bf16_matmul(A, A, bad)
        with pytest.raises(ValueError, match=f"parts must be 2 or 3, got {bad}"):
            split_bf16_gram(A, bad)


@pytest.mark.parametrize("method", ["mixed", "polar"])
@pytest.mark.parametrize("kind", ["adam", "sign", "gauss"])
@pytest.mark.parametrize("shape", [(48, 96), (96, 40), (3, 32, 32)])
def test_a_capturable_clip_by_split_products_is_as_accurate_as_by_float32(method, kind, shape):
    """``capturable=True`` with ``ns_dtype=torch.bfloat16``: no α is read, so every product
    takes three parts and the float32 schedule; the error against the float64 SVD is within
    1e-2, and that of the float32 capturable call, up to σ_max/c = 1e3 (α = 1e6, the most
    float32 resolves)."""
    c = 0.7
    for spike in (1.0, 30.0, 300.0, 1e3):
        X = spiked(shape, c, spike, kind=kind)
        ref = soft_ref(X, c)
        split = rel_err(
            soft_clip(X, c, method=method, ns_dtype=torch.bfloat16, capturable=True), ref
        )
        fp32 = rel_err(soft_clip(X, c, method=method, capturable=True), ref)
        assert split <= 1e-2 and split <= 1.5 * fp32 + 2e-5, (spike, split, fp32)


@pytest.mark.parametrize("shape", [(48, 96), (96, 40)])
def test_a_capturable_mixed_call_runs_the_three_part_products_it_is_counted_by(shape):
    """Along the CUDA code path every product of a capturable split call is in bf16, and their
    flops are ``mixed_split_flops(..., parts=3)`` of the float32 schedule (α up to 1e6)."""
    from spectra.ops.mixed import exact_steps
    from spectra.ops.polar import POLAR_MAX_ALPHA
    from spectra.ops.quintics import inverse_sqrt_schedule
    from spectra_lab.bench.flops import mixed_split_flops
    from spectra_lab.bench.live_bytes import gpu_code_path

    X = spiked(shape, 0.7, 10.0, kind="gauss")
    with gpu_code_path(), _ProductFlops() as counted:
        soft_clip(X, 0.7, method="mixed", ns_dtype=torch.bfloat16, capturable=True)
    ell = math.sqrt(1.0 / POLAR_MAX_ALPHA[torch.float32])
    coeffs = inverse_sqrt_schedule(ell, 1e-3)
    flops = mixed_split_flops(shape, len(coeffs), exact_steps(coeffs, ell), parts=3)
    assert counted.flops == {torch.bfloat16: flops}
    two = mixed_split_flops(shape, len(coeffs), exact_steps(coeffs, ell))
    assert 1.8 * two <= flops <= 2 * two


def test_a_capturable_split_call_holds_seven_batches_of_float32_bytes_at_most():
    """Along the CUDA code path, in units of the batch's float32 bytes: two of Z, Y and Q, with
    an exact step's split product (its operands' three parts, 1.5 each, its float32 result
    and the term being added to it); the split Gram matrix ``E² = EEᵀ`` takes its products
    from the one operand ``[E₁ E₂ E₃]``. The float32 capturable call holds four, and the
    split call that reads α six (two parts)."""
    from spectra_lab.bench.live_bytes import LiveBytes, gpu_code_path

    g = torch.Generator().manual_seed(0)
    X = torch.randn(8, 256, 256, generator=g) * (30.0 / 16)  # σ_max/c ≈ 60
    peaks = {}
    for dtype in (None, torch.bfloat16):
        with gpu_code_path(), LiveBytes() as mode:
            soft_clip(X, 1.0, method="mixed", ns_dtype=dtype, capturable=True)
        peaks[dtype] = mode.peak / (X.numel() * 4)
    assert 7 <= peaks[torch.bfloat16] < 7.01 and 4 <= peaks[None] < 4.01


@pytest.mark.parametrize("method", ["mixed", "polar"])
@pytest.mark.parametrize("kind", ["adam", "sign", "gauss"])
@pytest.mark.parametrize("shape", [(48, 96), (96, 40), (3, 32, 32)])
def test_a_ratio_bound_keeps_the_clip_within_it_and_damps_beyond_it(method, kind, shape):
    """``ratio_bound=b`` (capturable): within σ_max/c ≤ b the clip stays within 1e-2 of the
    float64 SVD, by float32 products and by split bf16 ones (two parts for b = 90); beyond it
    the result is damped, not amplified: its spectral norm stays at c."""
    c = 0.7
    for dtype in (None, torch.bfloat16):
        clip = lambda X, b, dtype=dtype: soft_clip(  # noqa: E731
            X, c, method=method, ns_dtype=dtype, capturable=True, ratio_bound=b
        )
        for spike, bound in ((1.0, 10.0), (30.0, 90.0), (90.0, 90.0), (9.0, 10.0)):
            X = spiked(shape, c, spike, kind=kind)
            assert rel_err(clip(X, bound), soft_ref(X, c)) <= 1e-2, (dtype, spike, bound)
        X = spiked(shape, c, 1e3, kind=kind)
        Y = clip(X, 10.0)
        assert torch.isfinite(Y).all()
        assert torch.linalg.matrix_norm(Y.double(), ord=2).max() <= 1.01 * c


@pytest.mark.parametrize("bound, steps", [(10.0, 4), (100.0, 5), (None, 7)])
def test_a_ratio_bound_sets_the_schedule_and_the_parts_of_a_capturable_mixed_call(bound, steps):
    """The schedule covers ``α ≤ 1 + b²`` alone, or what its precision resolves where that is
    less, and split products take two parts for ``b ≤ 100`` (three without a bound): the
    bf16 flops along the CUDA code path are ``mixed_split_flops`` of that schedule and those
    parts."""
    from spectra.ops.mixed import exact_steps
    from spectra.ops.polar import POLAR_MAX_ALPHA
    from spectra.ops.quintics import inverse_sqrt_schedule
    from spectra_lab.bench.flops import mixed_split_flops
    from spectra_lab.bench.live_bytes import gpu_code_path

    shape = (48, 96)
    X = spiked(shape, 0.7, 5.0, kind="gauss")
    with gpu_code_path(), _ProductFlops() as counted:
        soft_clip(X, 0.7, method="mixed", ns_dtype=torch.bfloat16, capturable=True,
                  ratio_bound=bound)  # fmt: skip
    # two parts resolve α ≤ 1e4 (POLAR_MAX_ALPHA), which b = 100 just passes
    top = POLAR_MAX_ALPHA[torch.float32 if bound is None else torch.bfloat16]
    alpha = top if bound is None else min(1 + bound**2, top)
    ell = math.sqrt(1.0 / alpha)
    coeffs = inverse_sqrt_schedule(ell, 1e-3)
    assert len(coeffs) == steps
    parts = 3 if bound is None else 2
    flops = mixed_split_flops(shape, steps, exact_steps(coeffs, ell), parts=parts)
    assert counted.flops == {torch.bfloat16: flops}


def test_a_bad_ratio_bound_is_refused_by_value_at_the_call_and_at_construction():
    import spectra.optim as so

    X = torch.randn(6, 4)
    bad = [
        ({"ratio_bound": 10.0}, "needs capturable=True"),
        ({"ratio_bound": 0.5, "capturable": True}, "finite number >= 1 or None, got 0.5"),
        ({"ratio_bound": float("nan"), "capturable": True}, "got nan"),
        ({"ratio_bound": True, "capturable": True}, "a number >= 1 or None, got True"),
        ({"ratio_bound": 10.0, "capturable": True, "method": "paper"}, "method 'paper'"),
    ]
    for kw, message in bad:
        with pytest.raises(ValueError, match=message):
            soft_clip(X, 1.0, **kw)
    p = torch.nn.Parameter(torch.randn(6, 4))
    lr = torch.tensor(1e-3)
    settings = [
        ({"lr": 1e-3, "clip_ratio_bound": 10.0}, "clip_ratio_bound=10.0 bounds the schedule"),
        ({"lr": lr, "capturable": True, "clip_ratio_bound": -1.0}, "clip_ratio_bound must be"),
        ({"lr": lr, "capturable": True, "clip_ratio_bound": 10.0, "post": "orthogonalize"},
         "post='orthogonalize'"),
        ({"lr": lr, "capturable": True, "clip_ratio_bound": 10.0, "clip_method": "paper"},
         "clip_method='paper' takes none"),
    ]  # fmt: skip
    for kw, message in settings:
        with pytest.raises(ValueError, match=message):
            so.AdamW([p], clip_c=1.0, **kw)
    opt = so.AdamW([p], lr=lr, clip_c=1.0, capturable=True, clip_ratio_bound=10.0)
    assert opt.param_groups[0]["clip_ratio_bound"] == 10.0
