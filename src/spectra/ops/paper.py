r"""Method ``"paper"``: Algorithm 1 of "Enhancing LLM Training via Spectral Clipping", as written.

Soft spectral clipping through MISR, the coupled Newton–Schulz inverse square root of the
paper's Algorithm 2, ``N_s`` steps in one precision. Kept for reproduction: it is inaccurate when
the spectrum has a large spike (the bulk eigenvalues of ``M/α`` sit near ``1/α``, where each step
grows them only by 1.5×). Its Gram-route factor is the exact clip it approximates.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spectra.ops._common import (
    bf16_matmul,
    check_matrix_input,
    check_threshold,
    compute_dtype,
    orient,
    wide_view,
)
from spectra.ops.base import ClipMethod, Operator, Options, apply_checked
from spectra.ops.eigh import exact_gram_factor, soft_weight
from spectra.validate import check_int

#: the paper's N_s
NS_STEPS = 10


def misr(A: Tensor, alpha: Tensor, ns_steps: int) -> Tensor:
    r"""Matrix inverse square root by coupled Newton–Schulz (the paper's Algorithm 2, MISR).

    With ``Â = A/α``, ``Y₀ = Â``, ``Z₀ = I``, each step sets ``T = (3I − ZY)/2``,
    ``Y ← YT``, ``Z ← TZ``; returns ``Z_K/√α ≈ A^{-1/2}``. Requires α ≥ λ_max(A).
    """
    mm = bf16_matmul if A.dtype == torch.bfloat16 else torch.matmul
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    Y = A / alpha
    Z = eye.expand_as(A).clone()
    for _ in range(ns_steps):
        T = 0.5 * (3.0 * eye - mm(Z, Y))
        Y = mm(Y, T)
        Z = mm(T, Z)
    return Z / alpha.sqrt()


def algorithm_1(
    X: Tensor, c: float, ns_steps: int, dtype: torch.dtype | None
) -> tuple[Tensor, Tensor]:
    """Algorithm 1 on checked matrices, and its ``s²_max`` (one per matrix)."""
    wd = dtype or compute_dtype(X)
    Xw, transposed = wide_view(X)
    Xc = Xw.to(wd)
    mm = bf16_matmul if wd == torch.bfloat16 else torch.matmul
    G = mm(Xc, Xc.mT)
    Gn = G.to(compute_dtype(G))  # the bound in at least float32
    s2 = torch.minimum(
        torch.linalg.matrix_norm(Gn, ord="fro"), Gn.abs().sum(dim=-1).amax(dim=-1)
    )  # s²_max = min(‖G‖_F, max_i Σ_j |G_ij|)
    alpha = (1.0 + s2 / c**2).to(wd)[..., None, None]
    eye = torch.eye(G.shape[-1], dtype=wd, device=G.device)
    Y = mm(misr(eye + G / c**2, alpha, ns_steps), Xc).to(X.dtype)
    Y = torch.where((s2.sqrt() <= c)[..., None, None], Xw, Y)  # s_max ≤ c: X unchanged
    return orient(Y, transposed), s2


def soft_clip_paper(
    X: Tensor, c: float, *, ns_steps: int = NS_STEPS, dtype: torch.dtype | None = None
) -> Tensor:
    r"""The paper's Algorithm 1 (soft spectral clipping via MISR), exactly as written.

    ``s²_max = min(‖XXᵀ‖_F, max_i Σ_j |(XXᵀ)_ij|)``; if ``s_max ≤ c`` return X; else
    ``α = 1 + s²_max/c²`` and return ``MISR(I + XXᵀ/c², α, N_s) · X``. All arithmetic runs
    in ``dtype`` (default float32); bf16 products accumulate in float32 and round to bf16, as
    on tensor cores, also on CPUs without bf16 units (:func:`bf16_matmul`).
    """
    check_matrix_input(X)
    c = check_threshold(c, "c")
    options = Options(ns_steps=ns_steps, ns_dtype=dtype)
    return apply_checked(METHOD.soft_clip, X, c, options, soft_weight(c))


def _steps(options: Options) -> int:
    return NS_STEPS if options.ns_steps is None else options.ns_steps


def _with_norm(X: Tensor, c: float, options: Options) -> tuple[Tensor, Tensor]:
    """``(H_c(X), s_max)`` with Algorithm 1's ``s_max`` (``σ_max ≤ s_max ≤ √rank·σ_max``)."""
    Y, s2 = algorithm_1(X, c, _steps(options), options.ns_dtype)
    return Y, s2.to(torch.float64).sqrt()


METHOD = ClipMethod(
    "paper",
    soft_clip=Operator(
        apply=lambda X, c, o: algorithm_1(X, c, _steps(o), o.ns_dtype)[0],
        gram_factor=exact_gram_factor(soft_weight),
        check=lambda o: check_int("ns_steps", o.ns_steps, low=0, none_ok=True),
        with_norm=_with_norm,
        capturable=True,  # N_s steps whatever the input, and s_max ≤ c decided on the device
    ),
)
