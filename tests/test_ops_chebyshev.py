"""The soft clip as one Chebyshev polynomial of the Gram matrix (``method="chebyshev"``),
against the float64 SVD, the closed form of its interpolant and the exact method."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from spectra.ops import chebyshev, gram, methods, soft_clip, soft_clip_with_norm
from spectra.optim.plan import SpectralOp
from spectra_lab.bench.matrices import spiked


def soft_ref(X: torch.Tensor, c: float) -> torch.Tensor:
    U, S, Vh = torch.linalg.svd(X.to(torch.float64), full_matrices=False)
    return (U * (S / torch.sqrt(1.0 + (S / c) ** 2)).unsqueeze(-2)) @ Vh


def rel_err(Y: torch.Tensor, ref: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(Y.double() - ref) / torch.linalg.vector_norm(ref))


def horner(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    p = torch.zeros_like(t)
    for coeff in a.flip(0):
        p = p * t + coeff
    return p


def test_the_interpolant_meets_the_weights_at_the_chebyshev_points():
    for L in (0.3, 4.0, 20.0):
        for d in (1, 5, 12, 16):
            a = chebyshev.interpolant(torch.tensor([L], dtype=torch.float64), d)[0]
            t = torch.cos(math.pi * (torch.arange(d + 1, dtype=torch.float64) + 0.5) / (d + 1))
            g = 1.0 / torch.sqrt(1.0 + L * (t + 1.0) / 2.0)  # (1 + λ/c²)^(-1/2), λ/c² = L(t+1)/2
            assert torch.allclose(horner(a, t), g, rtol=0, atol=1e-12)


def test_each_degree_limit_is_the_largest_l_that_meets_the_tolerance():
    for tol in (1e-3, 1e-2):
        limits = chebyshev.degree_limits(tol)
        assert len(limits) == chebyshev.CHEB_MAX_DEGREE + 1
        assert all(a < b for a, b in itertools.pairwise(limits))
        for d, top in enumerate(limits):
            assert chebyshev.relative_error(top, d) <= tol
            assert chebyshev.relative_error(top * 1.01, d) > tol
    # the error falls like ρ^-d, ρ = 1 + 2/L + 2√((1 + 1/L)/L) (Trefethen, ATAP Thm. 8.2): the
    # highest degree reaches L ≈ 25 at 1e-3 (σ_max ≈ 5c), where ρ^-16 ≈ 2e-3 (within the
    # theorem's constant)
    top = chebyshev.degree_limits(1e-3)[-1]
    assert 20 < top < 32
    rho = 1 + 2 / top + 2 * math.sqrt((1 + 1 / top) / top)
    assert 1e-4 < rho**-16 < 1e-2


def test_degrees_are_the_least_that_meet_the_tolerance_and_none_beyond_the_highest():
    tol = 1e-3
    Ls = [0.0, 1e-4, 0.5, 3.0, 10.0, 24.0, 40.0, 1e4]
    found = chebyshev.degrees(Ls, tol)
    for L, d in zip(Ls, found, strict=True):
        if d is None:
            assert chebyshev.relative_error(L, chebyshev.CHEB_MAX_DEGREE) > tol
            continue
        assert chebyshev.relative_error(L, d) <= tol
        if d > 0:
            assert chebyshev.relative_error(L, d - 1) > tol
    assert found[-1] is None and found[0] == 0


def test_the_block_size_takes_the_fewest_products():
    for d in range(0, chebyshev.CHEB_MAX_DEGREE + 1):
        s = chebyshev.block_size(d)
        costs = {k: max(k - 2, 0) + math.ceil((d + 1) / k) - 1 for k in range(2, max(d, 2) + 1)}
        assert costs[s] == min(costs.values())


def test_the_matrix_polynomial_is_the_scalar_one_on_the_eigenvalues():
    # float64: G = Q diag(λ) Qᵀ, so p(T) = Q diag(p(2λ/u − 1)) Qᵀ
    gen = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(3, 9, 9, generator=gen, dtype=torch.float64))
    lam = torch.rand(3, 9, generator=gen, dtype=torch.float64) * 5.0
    G = (Q * lam.unsqueeze(-2)) @ Q.mT
    u = lam.amax(-1) * 1.3
    for d in (0, 1, 2, 3, 7, 12, 16):
        a = torch.randn(3, d + 1, generator=gen, dtype=torch.float64)
        K = chebyshev.polynomial(G.clone(), G @ G, u, a)  # it overwrites its G and G²
        t = 2.0 * lam / u[:, None] - 1.0
        p = torch.stack([horner(a[i], t[i]) for i in range(3)])
        assert torch.allclose(K, (Q * p.unsqueeze(-2)) @ Q.mT, atol=1e-10), d


@pytest.mark.parametrize("kind", ["adam", "sign", "gauss"])
@pytest.mark.parametrize("spike", [0.3, 1.0, 3.0, 4.5])
@pytest.mark.parametrize("shape", [(48, 96), (96, 40), (3, 32, 32), (1, 64)])
def test_the_polynomial_meets_its_tolerance_while_sigma_max_is_below_five_c(kind, spike, shape):
    c = 0.7
    X = spiked(shape, c, spike, kind=kind)
    ref = soft_ref(X, c)
    # the weights within 1e-3 of w(σ) in every direction, plus float32 rounding
    assert rel_err(soft_clip(X, c, method="chebyshev"), ref) <= 1.1e-3
    assert rel_err(soft_clip(X, c, method="chebyshev", tol=1e-5), ref) <= 2e-5
    Xb = X.to(torch.bfloat16)
    assert rel_err(soft_clip(Xb, c, method="chebyshev"), soft_ref(Xb, c)) <= 1e-2
    assert rel_err(soft_clip(X.double(), c, method="chebyshev"), ref) <= 1.001e-3


@pytest.mark.parametrize("spike", [10.0, 1e3, 1e5])
def test_beyond_the_highest_degree_the_exact_weights_are_used(spike):
    c = 0.7
    X = spiked((48, 96), c, spike, kind="adam")
    Y = soft_clip(X, c, method="chebyshev")
    assert torch.equal(Y, soft_clip(X, c, method="eigh"))
    assert rel_err(Y, soft_ref(X, c)) <= 1e-2  # eigh's float32 K·X at a spike of 1e5: 4e-3


def _baddbmm_flops(inp, a, b, *args, out_shape=None, **kwargs) -> int:
    """``C + A·B`` of shapes ``(B, m, k)·(B, k, n)``: ``2·B·m·k·n`` (torch's count of baddbmm)."""
    return 2 * a[0] * a[1] * a[2] * b[2]


def flops(fn) -> int:
    """The products' flops of ``fn()`` on one thread (the counter sees the calling thread's).
    The in-place ``baddbmm_`` of Horner's rule counts as torch's counter counts ``baddbmm``
    (it leaves the in-place variant out)."""
    from torch.utils.flop_counter import FlopCounterMode

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    mapping = {torch.ops.aten.baddbmm_: _baddbmm_flops}
    try:
        with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            fn()
    finally:
        torch.set_num_threads(threads)
    return counter.get_total_flops()


@pytest.mark.parametrize("threads", [2, 3])
def test_the_exact_matrices_run_side_by_side_as_they_run_alone(threads):
    # eigh's weights on T threads, a slice of the batch each, against one thread; the float64
    # SVD for a spike that sends a slice's eigh to float64 (σ_max/c = 1e3)
    c = 0.7
    # σ_max/c ≤ 50 keeps every eigh in float32, whichever matrices share a slice
    X = torch.stack([spiked((24, 40), c, s, seed=i) for i, s in enumerate([9.0, 50.0, 2.0, 20.0,
                                                                            30.0])])  # fmt: skip
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = soft_clip_with_norm(X, c, method="chebyshev")
        torch.set_num_threads(threads)
        side = soft_clip_with_norm(X, c, method="chebyshev")
        assert torch.get_num_threads() == threads  # restored after the side-by-side part
    finally:
        torch.set_num_threads(old)
    assert torch.allclose(side[0], alone[0], rtol=0, atol=1e-6)
    assert torch.equal(side[1], alone[1])
    for i in (0, 1, 3, 4):  # the exact ones
        assert rel_err(side[0][i], soft_ref(X[i], c)) <= 1e-2
    X[4] = spiked((24, 40), c, 1e3, seed=4)
    torch.set_num_threads(threads)
    try:
        Y = soft_clip(X, c, method="chebyshev")
    finally:
        torch.set_num_threads(old)
    assert max(rel_err(Y[i], soft_ref(X[i], c)) for i in range(5)) <= 1e-2


def test_a_matrix_beyond_the_highest_degree_costs_its_gram_matrix_once():
    # products only (the eigendecomposition is not counted): G = XXᵀ, then eigh's
    # K = Q diag(w) Qᵀ and K·X; G² only where the lower bound of u from G alone,
    # min(Gershgorin, (Σ_i ‖G_i‖⁴)^¼), does not already rule the polynomial out
    B, m, n = 3, 64, 96
    top = chebyshev.degree_limits(1e-3)[-1]

    def low(G: torch.Tensor) -> float:
        g = G.abs().sum(-1).amax()
        return float(torch.minimum(g, G.norm(dim=-1).pow(4).sum().pow(0.25)))

    c = 0.7
    X = spiked((B, m, n), c, 50.0, kind="adam")
    assert all(low(G) / c**2 > top for G in X @ X.mT)
    assert torch.equal(soft_clip(X, c, method="chebyshev"), soft_clip(X, c, method="eigh"))
    gram_and_apply = 2 * (2 * m * m * n) + 2 * m**3
    assert flops(lambda: soft_clip(X, c, method="chebyshev")) == B * gram_and_apply
    # a sign matrix at σ_max = 5.5c (the Adam direction of a random gradient): ruled out by G
    S = torch.sign(torch.randn(m, n, generator=torch.Generator().manual_seed(0)))
    c = float(torch.linalg.matrix_norm(S, ord=2)) / 5.5
    assert low(S @ S.mT) / c**2 > top
    assert flops(lambda: soft_clip(S, c, method="chebyshev")) == gram_and_apply
    # rank one with a flat left vector: the bound is √m away from u = σ², so G² decides
    v = torch.randn(n, generator=torch.Generator().manual_seed(1))
    R = torch.outer(torch.ones(m), v / v.norm()) * (6.0 * c / m**0.5)  # σ_max = 6c
    assert low(R @ R.mT) / c**2 < top < 36.0 * (1 - 1e-5)
    assert torch.equal(soft_clip(R, c, method="chebyshev"), soft_clip(R, c, method="eigh"))
    assert flops(lambda: soft_clip(R, c, method="chebyshev")) == gram_and_apply + 2 * m**3


@pytest.mark.parametrize("spike, dtypes", [(50.0, [torch.float32]), (1e3, [torch.float64])])
def test_the_exact_matrices_take_the_eigendecomposition_eigh_takes(spike, dtypes, monkeypatch):
    # σ_max/c = 1e3 > 100: float64 at once (G's largest row norm shows it), no float32 eigh first
    from spectra.ops import eigh

    seen, real = [], eigh._eigh
    monkeypatch.setattr(eigh, "_eigh", lambda G, s: seen.append(G.dtype) or real(G, s))
    c = 0.7
    X = spiked((48, 96), c, spike, kind="adam")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # one slice
    Y = soft_clip(X, c, method="chebyshev")
    assert seen == dtypes
    assert rel_err(Y, soft_ref(X, c)) <= 1e-2


def test_a_batch_mixing_both_routes_clips_each_matrix_as_alone():
    c = 0.7
    X = torch.stack([spiked((24, 40), c, s, seed=i) for i, s in enumerate([2.0, 50.0, 0.5])])
    Y, norm = soft_clip_with_norm(X, c, method="chebyshev")
    for i in range(3):
        alone, _ = soft_clip_with_norm(X[i], c, method="chebyshev")
        assert rel_err(Y[i], soft_ref(X[i], c)) <= 1.1e-3
        # the batch's degree is its largest, so the polynomial matrices agree to the tolerance
        assert rel_err(Y[i], alone.double()) <= 2e-3
    assert torch.equal(Y[1], soft_clip(X[1], c, method="eigh"))
    sigma = torch.linalg.matrix_norm(X.double(), ord=2)
    assert torch.allclose(norm[1], sigma[1], rtol=1e-5)  # the exact matrix: σ_max itself
    for i in (0, 2):  # the bound: σ_max ≤ s_max ≤ r^{1/4}·σ_max
        assert sigma[i] * (1 - 1e-6) <= norm[i] <= 24**0.25 * sigma[i]


def test_the_gram_route_computes_the_same_polynomial_from_g_alone():
    c = 0.7
    X = torch.stack([spiked((24, 40), c, s, seed=i) for i, s in enumerate([2.0, 50.0, 0.5])])
    K = gram.gram_factor(X @ X.mT, "soft_clip", c, method="chebyshev")
    # the same polynomial up to the float32 rounding of G (summed in another order)
    assert rel_err(K.to(X.dtype) @ X, soft_clip(X, c, method="chebyshev").double()) <= 1e-4
    X64 = X.double()
    assert gram.gram_factor(X @ X.mT, "soft_clip", c, method="chebyshev",
                            source_dtype=torch.float64) is None  # fmt: skip
    K64 = gram.gram_factor(X64 @ X64.mT, "soft_clip", c, method="chebyshev")
    assert rel_err(K64 @ X64, soft_clip(X64, c, method="chebyshev")) <= 1e-10


def test_zero_and_tiny_matrices_keep_their_weights_of_one():
    assert torch.equal(soft_clip(torch.zeros(4, 6), 1.0, method="chebyshev"), torch.zeros(4, 6))
    X = torch.randn(4, 6) * 1e-30
    assert rel_err(soft_clip(X, 1.0, method="chebyshev"), X.double()) <= 1e-6
    X = torch.randn(4, 6) * 1e30  # σ_max/c = 1e30: the exact route, in float64
    assert rel_err(soft_clip(X, 1.0, method="chebyshev"), soft_ref(X, 1.0)) <= 1e-5
    # a threshold whose square underflows (c² = 0 in float64): a zero matrix stays zero, a
    # nonzero one takes the exact route (σ_max/c = 1e303), whose c·UVᵀ rounds to float32 zeros
    c = 1e-303
    assert torch.equal(soft_clip(torch.zeros(2, 4, 6), c, method="chebyshev"), torch.zeros(2, 4, 6))
    X = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(0))
    Y = soft_clip(X, c, method="chebyshev")
    assert torch.equal(Y, soft_ref(X, c).float())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ns_dtype": torch.bfloat16}, r"ns_dtype must be None, torch.float32 or torch.float64 "
                                       r"for chebyshev, got torch.bfloat16"),
        ({"tol": 0.0}, r"tol must be a number in \[1e-06, 1\), got 0.0"),
    ],
)  # fmt: skip
def test_bad_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        soft_clip(torch.randn(4, 6), 1.0, method="chebyshev", **kwargs)


def test_auto_picks_chebyshev_on_a_cpu_without_bf16_units(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(methods, "has_bf16_units", lambda device: device.type != "cpu")
    assert methods.default_method("soft_clip", cpu, torch.float32) == "chebyshev"
    assert methods.default_method("soft_clip", cpu, torch.bfloat16) == "chebyshev"
    assert methods.default_method("soft_clip", cpu, torch.float64) == "eigh"
    assert methods.default_method("soft_clip", cpu, torch.float32, capturable=True) == "polar"
    monkeypatch.setattr(methods, "has_bf16_units", lambda device: True)
    assert methods.default_method("soft_clip", cpu, torch.float32) == "mixed"


def test_the_optimizers_batch_it_as_a_products_only_method():
    # batches one after another with the intra-op threads, and no two-phase read
    op = SpectralOp("soft_clip", 1.0, "chebyshev")
    X = torch.randn(4, 6)
    assert op.matmul_only(X) and not op.deferred(X)
    assert not SpectralOp("soft_clip", 1.0, "eigh").matmul_only(X)
