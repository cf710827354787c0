"""The host's share of a GPU step: the operations it dispatches, and the multi-tensor finite check.

A GPU step of many small matrices is bound by its host, which dispatches every operation (a
kernel launch each on CUDA). These tests count the operations of a step on the GPU's code path
(:func:`spectra_lab.bench.live_bytes.gpu_path_host_ops`), run on the CPU.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from spectra.optim import AdamW, chain
from spectra.optim.base import read_counts
from spectra_lab.bench.live_bytes import HostOps, gpu_path_host_ops
from spectra_lab.bench.optim import llama_shapes


def _step_dispatches(layers: int, method: str) -> tuple[Counter[str], int]:
    shapes = llama_shapes(layers, 16, 32, 64)
    make = lambda ps: AdamW(ps, lr=1e-3, clip_method=method)  # noqa: E731
    return gpu_path_host_ops(make, shapes).kinds, len(shapes)


@pytest.mark.parametrize("method", ["mixed", "polar"])
def test_a_gpu_step_dispatches_at_most_one_operation_and_one_view_per_parameter(method):
    # Twice the layers: the same batches of the clip (larger), 108 more parameters. Their
    # step counts, directions and finite check are multi-tensor operations; a parameter adds
    # its direction's buffer (an allocation, no kernel) and the view of its matrix.
    small, n_small = _step_dispatches(12, method)
    large, n_large = _step_dispatches(24, method)
    added = n_large - n_small
    assert added == 108
    assert large["compute"] - small["compute"] <= added
    assert large["view"] - small["view"] <= added
    assert large["read"] == small["read"] == 0  # no step count is read tensor by tensor


def test_the_multi_tensor_finite_check_agrees_with_isfinite():
    big32 = torch.tensor([3.0e38, -3.0e38])  # finite, though their squares overflow
    big64 = torch.tensor([1e300, -1e300], dtype=torch.float64)
    cases = {
        "finite": [torch.randn(5, 3), big32, big64, torch.randn(4, dtype=torch.bfloat16)],
        "inf": [torch.randn(5, 3), torch.tensor([1.0, math.inf]), big64],
        "-inf": [torch.randn(2, 2), torch.tensor([-math.inf], dtype=torch.float64)],
        "nan": [torch.tensor([math.nan, 0.0], dtype=torch.bfloat16), torch.randn(3)],
        "nan among zeros": [torch.zeros(7), torch.tensor([0.0, math.nan, 0.0])],
    }
    for name, tensors in cases.items():
        expected = all(bool(t.isfinite().all()) for t in tensors)
        assert bool(chain._largest_entries_finite(tensors)) is expected, name
        assert bool(chain.finite_flag(tensors)) is expected, name  # the CPU's aminmax


def test_the_finite_check_on_the_gpu_code_path_is_one_reduction_per_dtype():
    tensors = [torch.randn(8, 8) for _ in range(40)] + [torch.randn(5, dtype=torch.float64)]
    with HostOps() as mode:
        chain._largest_entries_finite(tensors)
    # per dtype: the multi-tensor norm, a stack, isfinite (four aten operations) and all; then
    # one stack and all to join the two dtypes
    assert mode.kinds["compute"] <= 2 * 7 + 2


def test_read_counts_reads_the_step_counts_of_one_device_at_once():
    counters = [torch.tensor(float(k)) for k in (3, 1, 7)]
    assert read_counts(counters) == [3.0, 1.0, 7.0]
    with HostOps() as mode:
        read_counts(counters)
    assert mode.kinds["read"] == 0 and mode.kinds["compute"] == 1  # one stack, then tolist


def test_a_float64_step_with_directions_beyond_float32s_range_is_finite():
    # The finite check once compared every tensor's min and max in float32: a float64
    # direction of 1e300 read as inf, and the step raised
    from spectra.optim import SGDM

    p = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    p.grad = torch.full((3, 4), 1e300, dtype=torch.float64)
    opt = SGDM([p], lr=1e-300, momentum=0.0, weight_decay=0.0, clip_c=None)
    opt.step()
    torch.testing.assert_close(p.detach(), torch.full((3, 4), -1.0, dtype=torch.float64))
