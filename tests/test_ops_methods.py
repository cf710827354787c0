"""The table of clip methods (``spectra.ops.methods.METHODS``): every entry point reads it, an
unknown method is an error everywhere, and a new method is one module plus one row."""

from __future__ import annotations

import pytest
import torch

import spectra
from spectra.ops import gram, hard_clip, methods, orthogonalize, soft_clip, soft_clip_with_norm
from spectra.ops.base import ClipMethod, Operator
from spectra.ops.eigh import exact_gram_factor, soft_weight
from spectra.ops.spectral import soft_clip_begin, soft_clip_end
from spectra.optim.plan import SpectralOp


def svd_soft(X: torch.Tensor, c: float) -> torch.Tensor:
    U, S, Vh = torch.linalg.svd(X.double(), full_matrices=False)
    return (U * (S / torch.sqrt(1 + (S / c) ** 2)).unsqueeze(-2)) @ Vh


def rel_err(Y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(Y.double() - ref) / torch.linalg.vector_norm(ref))


def test_every_operator_lists_exactly_the_methods_its_rows_offer():
    soft = ("auto", "eigh", "svd", "polar", "mixed", "chebyshev", "paper")
    assert methods.method_names("soft_clip") == soft
    assert methods.method_names("hard_clip") == ("auto", "eigh", "svd")
    assert methods.method_names("orthogonalize") == ("auto", "svd", "muon", "polar_express")
    for name, row in methods.METHODS.items():
        assert row.name == name
        offered = [k for k in methods.OPERATORS if getattr(row, k) is not None]
        assert offered, name  # a row offers at least one operator


def test_auto_resolves_to_a_row_of_the_table():
    for kind in methods.OPERATORS:
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            for device in (torch.device("cpu"), torch.device("cuda")):
                picked = methods.default_method(kind, device, dtype)
                assert picked in methods.method_names(kind)[1:]


@pytest.mark.parametrize(
    "call",
    [
        lambda m: soft_clip(torch.randn(5), 1.0, method=m),  # a vector: never reached a method
        lambda m: soft_clip(torch.randn(4, 6), 1.0, method=m),
        lambda m: soft_clip_with_norm(torch.randn(4, 6), 1.0, method=m),
        lambda m: soft_clip_begin(torch.randn(4, 6), 1.0, method=m),
        lambda m: hard_clip(torch.randn(5), 1.0, method=m),
        lambda m: orthogonalize(torch.randn(5), method=m),
        lambda m: orthogonalize(torch.zeros(0, 3), method=m),
        lambda m: gram.gram_factor(torch.eye(3), "soft_clip", 1.0, method=m),
        lambda m: gram.gram_factor(torch.eye(3), "orthogonalize", method=m),
    ],
)
def test_an_unknown_method_is_an_error_at_every_entry_point(call):
    with pytest.raises(ValueError, match=r"method 'nope'; expected one of auto"):
        call("nope")


@pytest.mark.parametrize(
    ("kind", "method"),
    [("hard_clip", "polar"), ("hard_clip", "paper"), ("orthogonalize", "eigh"),
     ("orthogonalize", "mixed"), ("soft_clip", "muon")],
)  # fmt: skip
def test_a_method_that_does_not_offer_the_operator_is_an_error_not_a_fallback(kind, method):
    # the Gram route once fell back to the exact eigh here without a word
    with pytest.raises(ValueError, match=f"unknown {kind} method {method!r}"):
        gram.gram_factor(torch.eye(3), kind, 1.0, method=method)
    with pytest.raises(ValueError, match=f"clip_method={method!r} is not valid for post={kind!r}"):
        spectra.AdamW([torch.zeros(3, 3, requires_grad=True)], clip_c=1.0, post=kind,
                      clip_method=method)  # fmt: skip


def test_the_settings_check_reads_the_methods_own_check():
    with pytest.raises(ValueError, match=r"clip_method='polar_express'.*ns_steps must be in"):
        spectra.AdamW([torch.zeros(3, 3, requires_grad=True)], post="orthogonalize",
                      clip_method="polar_express", clip_ns_steps=99)  # fmt: skip


def _scaled_apply(X: torch.Tensor, c: float, options) -> torch.Tensor:
    """A stand-in method: the exact soft clip by an SVD, as a contributor's new file would."""
    return svd_soft(X, c).to(X.dtype)


def test_a_new_method_is_one_row_and_every_entry_point_takes_it(monkeypatch):
    row = ClipMethod("plain_svd", soft_clip=Operator(_scaled_apply, exact_gram_factor(soft_weight)))
    monkeypatch.setitem(methods.METHODS, "plain_svd", row)
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(2, 6, 9, generator=gen, dtype=torch.float64)
    c = 0.5
    ref = svd_soft(X, c)
    assert "plain_svd" in methods.method_names("soft_clip")
    assert rel_err(soft_clip(X, c, method="plain_svd"), ref) < 1e-12
    Y, norm = soft_clip_with_norm(X, c, method="plain_svd")  # σ_max from an SVD
    assert rel_err(Y, ref) < 1e-12
    torch.testing.assert_close(norm, torch.linalg.matrix_norm(X, ord=2))
    pending = soft_clip_begin(X, c, method="plain_svd")  # one phase: nothing to read
    assert pending.request.numel() == 0
    assert rel_err(soft_clip_end(X, pending, []), ref) < 1e-12
    K = gram.gram_factor(X @ X.mT, "soft_clip", c, method="plain_svd")
    assert rel_err(K @ X, ref) < 1e-10
    assert not SpectralOp("soft_clip", c, "plain_svd").matmul_only(X)
    # the optimizers accept it and clip with it
    p = torch.nn.Parameter(torch.zeros(6, 9, dtype=torch.float64))
    p.grad = X[0].clone()
    opt = spectra.SGDM([p], lr=1.0, momentum=0.0, weight_decay=0.0, clip_c=c,
                       clip_method="plain_svd", clip_scale=1.0)  # fmt: skip
    opt.step()
    assert rel_err(-p.detach(), ref[0]) < 1e-12


@pytest.mark.parametrize(("kind", "method"), [
    (k, m) for k in methods.OPERATORS for m in methods.method_names(k)[1:]
])  # fmt: skip
def test_every_rows_gram_factor_gives_its_operator_from_g_alone(kind, method):
    # K(G)·X against the operator on X: the exact factor for the exact methods and for those
    # the Gram route replaces by the exact clip ("polar" within its 1e-3, "paper" as exact);
    # the iteration itself for "mixed", "muon" and "polar_express", the same polynomial for
    # "chebyshev"
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(8, 20, generator=gen) * torch.logspace(0, -1, 8)[:, None]
    c = 1.0
    K = gram.gram_factor(X @ X.mT, kind, c, method=method)
    Y = K.to(X.dtype) @ X
    if kind == "soft_clip":
        ref = svd_soft(X, c)
        bar = {"mixed": 1e-2, "polar": 1e-3, "chebyshev": 1e-3}.get(method, 1e-5)
        assert rel_err(Y, ref) < bar
        if method in ("mixed", "chebyshev", "eigh", "svd"):  # the same function of G as on X
            assert rel_err(Y, soft_clip(X, c, method=method).double()) < 1e-5
    elif kind == "hard_clip":
        assert rel_err(Y, hard_clip(X.double(), c, method="svd")) < 1e-5
    else:
        same = orthogonalize(X, method=method, ns_dtype=torch.float32)
        assert rel_err(Y, same.double()) < 1e-4


def test_the_cpu_bf16_override_reads_0_1_or_unset_and_names_any_other_value():
    from spectra.ops._common import CPU_BF16_ENV, cpu_bf16_override

    assert CPU_BF16_ENV == "SPECTRA_CPU_BF16_UNITS"
    assert cpu_bf16_override(None) is None and cpu_bf16_override("") is None
    assert cpu_bf16_override("0") is False and cpu_bf16_override("1") is True
    for bad in ("2", "yes", "false", " 0"):
        with pytest.raises(ValueError, match=f"SPECTRA_CPU_BF16_UNITS.*{bad!r}"):
            cpu_bf16_override(bad)


@pytest.mark.parametrize("value", ["0", "1"])
def test_the_cpu_bf16_override_sets_the_default_and_the_report_says_so(value):
    # a fresh process: the probe's answer is read once, at import
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[1] / "src")
    code = (
        "import torch; from spectra.ops import _common, methods; "
        "from spectra_lab.machine import cpu_bf16; "
        "print(_common.CPU_HAS_BF16_UNITS, methods.default_method('soft_clip', "
        "torch.device('cpu'), torch.float32), _common.bf16_matmul(torch.ones(2, 2, "
        "dtype=torch.bfloat16), torch.ones(2, 2, dtype=torch.bfloat16)).sum().item()); "
        "print(cpu_bf16())"
    )
    env = {**os.environ, "SPECTRA_CPU_BF16_UNITS": value, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()  # fmt: skip
    told = value == "1"
    assert out[0] == f"{told} {'mixed' if told else 'chebyshev'} 8.0"
    from spectra.ops._common import _cpu_has_bf16_units

    has = _cpu_has_bf16_units()
    if has == told:
        assert out[1] in ("emulated", "native (AMX)", "native (AVX-512 BF16)")
    else:
        assert out[1].startswith(("emulated (SPECTRA_CPU_BF16_UNITS=0; the CPU has ",
                                  "native (SPECTRA_CPU_BF16_UNITS=1; the CPU has no"))  # fmt: skip
    env["SPECTRA_CPU_BF16_UNITS"] = "maybe"
    bad = subprocess.run([sys.executable, "-c", "import spectra"], env=env, capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert bad.returncode != 0 and "SPECTRA_CPU_BF16_UNITS must be 0, 1 or unset, got 'maybe'" in (
        bad.stderr
    )


def test_cuda_takes_mixed_for_float32_and_bf16_and_polar_for_float64():
    # the H100 runs favoured "mixed" on CUDA (docs/gpu.md); float64 input keeps "polar"
    cuda = torch.device("cuda")
    for dtype in (torch.float32, torch.bfloat16):
        assert methods.default_method("soft_clip", cuda, dtype) == "mixed"
        assert methods.default_method("soft_clip", cuda, dtype, capturable=True) == "mixed"
    assert methods.default_method("soft_clip", cuda, torch.float64) == "polar"
    assert methods.default_method("hard_clip", cuda, torch.float32) == "eigh"


def test_mixed_takes_split_bf16_products_on_cuda_for_large_matrices_only(monkeypatch):
    """``mixed``'s exact part runs on split bf16 products by default on CUDA where the smaller
    side is at least MIXED_SPLIT_FROM, in float32 below it, and as asked whenever ns_dtype is
    given. The CPU takes the CUDA rule here (SPLIT_DEVICES) at a smaller threshold: the default
    call then equals the bf16-first one bit for bit, and both stay at mixed's accuracy against
    the float64 SVD."""
    from spectra.ops import mixed
    from spectra.ops.base import Options

    assert mixed.SPLIT_DEVICES == ("cuda",) and mixed.MIXED_SPLIT_FROM == 1024
    big, small = torch.empty(2, 1024, 1500, device="meta"), torch.empty(1500, 1000, device="meta")
    assert mixed.exact_precision(Options(), big) is None  # a meta tensor: not CUDA
    monkeypatch.setattr(mixed, "SPLIT_DEVICES", ("cuda", "meta"))
    assert mixed.exact_precision(Options(), big) == torch.bfloat16
    assert mixed.exact_precision(Options(), big.mT) == torch.bfloat16
    assert mixed.exact_precision(Options(), small) is None
    assert mixed.exact_precision(Options(ns_dtype=torch.float32), big) == torch.float32
    assert mixed.exact_precision(Options(capturable=True), big) is None

    g = torch.Generator().manual_seed(7)
    c = 1.0
    X = torch.randn(3, 48, 80, generator=g) * torch.logspace(0, 1.5, 48)[:, None] / 10
    X[0, 0] *= 20.0  # σ_max/c from about 5 to 40: α ≤ 1e4, where split products run
    below = soft_clip(X, c, method="mixed")
    monkeypatch.setattr(mixed, "SPLIT_DEVICES", ("cpu",))
    monkeypatch.setattr(mixed, "MIXED_SPLIT_FROM", 48)
    default = soft_clip(X, c, method="mixed")
    assert torch.equal(default, soft_clip(X, c, method="mixed", ns_dtype=torch.bfloat16))
    assert not torch.equal(default, below)
    assert torch.equal(
        soft_clip(X[:, :40, :40], c, method="mixed"),
        soft_clip(X[:, :40, :40], c, method="mixed", ns_dtype=torch.float32),
    )
    ref = svd_soft(X, c)
    assert rel_err(default, ref) < 1e-2
    assert rel_err(below, ref) < 1e-2
