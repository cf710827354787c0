"""Matmul-only spectral functions from minimax-optimal odd polynomials.

Both the inverse square root used by :func:`spectra.ops.soft_clip` (``method="polar"``) and
the orthogonalization of :func:`spectra.ops.orthogonalize` (``method="polar_express"``) reduce
to the same scalar problem: drive every ``s`` in a known interval ``[ℓ, 1]`` to 1 by composing
odd quintics ``p(s) = a s + b s³ + c s⁵``.

The polynomials are the greedy minimax choice of "The Polar Express: Optimal Matrix Sign
Methods and Their Application to the Muon Algorithm" (Amsel, Persson, Musco and Gower, 2025):
at step ``k`` the quintic minimises ``max_{s ∈ [ℓ_k, u_k]} |1 − p(s)|``, and the next interval
is ``[min p, max p]`` over ``[ℓ_k, u_k]``. Each minimax problem is solved offline as a linear
program on a fine grid refined with the polynomial's critical points (:func:`greedy_schedule`,
needs scipy), with the paper's cushioning and a 1 % margin at the top of wide intervals for
robustness to rounding (:func:`greedy_schedule`). The resulting tables are hard-coded in
``spectra.ops._polar_coeffs``; ``python -m spectra_lab.generate.polar_tables`` regenerates them
(from :func:`render_tables`).

**Soft clipping.** With ``M = I + XXᵀ/c²`` (``m ≤ n``), ``α ≥ λ_max(M)`` and ``M̂ = M/α``
(eigenvalues in ``[1/α, 1]``), the coupled iteration ``Z₀ = I``, ``Y₀ = M̂``,
``E = ZY``, ``Q = aI + bE + cE²``, ``Z ← QZ``, ``Y ← YQ`` keeps ``E = Z²M̂``; on an eigenvalue
``e`` of ``M̂`` it maps ``s = √(e·z²)`` to ``p(s)``, i.e. it is exactly a polar iteration on
``s ∈ [1/√α, 1]``. When every ``s`` is within ``tol`` of 1, ``Z/√α ≈ M^{-1/2}`` with relative
error ``≤ tol`` on every eigen-direction, so ``H_c(X) = M^{-1/2}X`` has relative Frobenius error
``≤ tol`` in exact arithmetic.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from spectra.ops import _polar_coeffs as _tables
from spectra.ops._common import add_to_diagonal

__all__ = [
    "ORTH_COEFFS",
    "coupled_inverse_sqrt",
    "greedy_schedule",
    "inverse_sqrt_schedule",
    "minimax_quintic",
    "polar_express_band",
    "polynomial_gram_factor",
]

Quintic = tuple[float, float, float]

# Lower end of the interval each quintic is optimised on, relative to its upper end.
CUSHION = 1e-3
# While the interval is still wide (ℓ < 0.9) each quintic is designed for [ℓ, u·(1 + MARGIN)]:
# its upper end u is a repelling point (p'(u) > 1), so without the margin a rounding error
# that lifts a value above u would grow geometrically over the following steps.
MARGIN = 1e-2

# Quintics of the orthogonalization schedule, designed for singular values in [1e-3, 1].
ORTH_COEFFS: tuple[Quintic, ...] = _tables.ORTH_COEFFS


# --------------------------------------------------------------------------- offline design


def _quintic_extrema(coef: Quintic, lo: float, hi: float) -> tuple[float, float]:
    """Exact min and max of ``p(s) = a s + b s³ + c s⁵`` over ``[lo, hi]``."""
    import numpy as np

    a, b, c = coef
    pts = [lo, hi]
    for root in np.roots([5 * c, 3 * b, a]):  # p'(s) = a + 3b s² + 5c s⁴
        if abs(root.imag) < 1e-12 and root.real > 0:
            s = math.sqrt(root.real)
            if lo < s < hi:
                pts.append(s)
    vals = [a * s + b * s**3 + c * s**5 for s in pts]
    return min(vals), max(vals)


@functools.cache
def minimax_quintic(lo: float, hi: float, grid: int = 1000, rounds: int = 5) -> Quintic:
    """The odd quintic minimising ``max_{s∈[lo,hi]} |1 − p(s)|`` (linear program, scipy).

    Written as ``max d`` subject to ``p(s) ≥ lo·d`` and ``p(s) ≤ 2 − lo·d`` on the grid, so the
    objective stays well scaled even when ``lo`` is tiny (the optimum has ``1 − t = lo·d``). The
    grid (geometric + uniform) is refined with the critical points of each solution.
    """
    import numpy as np
    from scipy.optimize import linprog

    s = np.unique(np.concatenate([np.geomspace(lo, hi, grid), np.linspace(lo, hi, grid)]))
    coef: Quintic = (1.0, 0.0, 0.0)
    for _ in range(rounds):
        one = np.ones_like(s)
        lower = np.stack([-one, -(s**2), -(s**4), lo / s], axis=1)  # divided by s
        upper = np.stack([s, s**3, s**5, lo * one], axis=1)
        res = linprog(
            [0.0, 0.0, 0.0, -1.0],
            A_ub=np.vstack([lower, upper]),
            b_ub=np.concatenate([0.0 * one, 2.0 * one]),
            bounds=[(None, None)] * 4,
            method="highs",
        )
        if not res.success:
            raise RuntimeError(f"minimax LP failed on [{lo}, {hi}]: {res.message}")
        coef = (float(res.x[0]), float(res.x[1]), float(res.x[2]))
        a, b, c = coef
        crit = [lo, hi]
        for root in np.roots([5 * c, 3 * b, a]):
            if abs(root.imag) < 1e-12 and lo**2 < root.real < hi**2:
                crit.append(math.sqrt(root.real))
        s = np.unique(np.concatenate([s, crit]))
    return coef


def greedy_schedule(
    ell0: float,
    tol: float = 1e-7,
    max_steps: int = 60,
    cushion: float = CUSHION,
    margin: float = MARGIN,
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[Quintic, ...]]:
    """Greedy minimax schedule from ``[ℓ₀, 1]`` until the interval is within ``tol`` of 1.

    Each quintic is optimal on ``[max(ℓ_k, cushion·u_k), u_k']`` with ``u_k' = u_k(1 + margin)``
    while ``ℓ_k < 0.9`` and ``u_k' = u_k`` after. The cushion follows the Polar Express paper:
    below ``cushion·u_k`` the optimal polynomial barely changes its slope at 0 but would push
    interior points down to ``≈ ℓ_k``, where rounding dominates. The margin keeps values that
    rounding lifts above ``u_k`` inside the next interval. The interval tracked is the image
    of the full ``[ℓ_k, u_k']``.

    Returns ``(ells, uppers, coeffs)``: ``[ells[k], uppers[k]]`` is the interval before step
    ``k`` (and after the last step, at index ``len(coeffs)``).
    """
    lo, hi = float(ell0), 1.0
    ells, uppers, coeffs = [lo], [hi], []
    for _ in range(max_steps):
        if max(1.0 - lo, hi - 1.0) <= tol:
            break
        top = hi * (1.0 + margin) if lo < 0.9 else hi
        coef = minimax_quintic(float(f"{max(lo, cushion * top):.15g}"), float(f"{top:.15g}"))
        lo, hi = _quintic_extrema(coef, lo, top)
        coeffs.append(coef)
        ells.append(lo)
        uppers.append(hi)
    return tuple(ells), tuple(uppers), tuple(coeffs)


def render_tables() -> str:
    """The source of ``spectra.ops._polar_coeffs``: every schedule re-solved (minutes, scipy)."""
    lines = [
        '"""Generated by ``python -m spectra_lab.generate.polar_tables``: greedy minimax odd',
        "quintics.",
        "",
        'Method: "The Polar Express" (Amsel, Persson, Musco and Gower, 2025); see',
        "spectra.ops.quintics. SOFT_*[j] is the schedule that starts from the interval",
        "[SOFT_ELL0[j], 1]; ELLS/UPPERS hold the interval before each step and after the last.",
        '"""',
        "",
    ]
    soft_ell0 = [10.0 ** (-j / 2) for j in range(1, 21)]
    soft = []
    for e in soft_ell0:
        soft.append(greedy_schedule(e, tol=1e-7))
        print(f"l0={e:.3g}: {len(soft[-1][2])} steps", file=sys.stderr)
    lines.append(f"SOFT_ELL0 = {tuple(soft_ell0)!r}")
    lines.append("SOFT_ELLS = (")
    lines += [f"    {s[0]!r}," for s in soft]
    lines.append(")")
    lines.append("SOFT_UPPERS = (")
    lines += [f"    {s[1]!r}," for s in soft]
    lines.append(")")
    lines.append("SOFT_COEFFS = (")
    lines += [f"    {s[2]!r}," for s in soft]
    lines.append(")")
    orth = greedy_schedule(1e-3, tol=1e-7)
    lines.append(f"ORTH_ELLS = {orth[0]!r}")
    lines.append(f"ORTH_UPPERS = {orth[1]!r}")
    lines.append(f"ORTH_COEFFS = {orth[2]!r}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- run time


def inverse_sqrt_schedule(ell: float, tol: float) -> tuple[Quintic, ...]:
    """Quintics that bring every ``s ∈ [ell, 1]`` within ``tol`` of 1.

    Picks the hard-coded schedule with the largest start ``ℓ₀ ≤ ell`` (the smallest one if
    ``ell`` is below all of them; singular directions under ``ℓ₀`` then stay unconverged) and
    keeps only as many steps as ``tol`` needs.
    """
    if 1.0 - ell <= tol:
        return ()
    j = len(_tables.SOFT_ELL0) - 1
    for i, start in enumerate(_tables.SOFT_ELL0):
        if start <= ell:
            j = i
            break
    ells, uppers = _tables.SOFT_ELLS[j], _tables.SOFT_UPPERS[j]
    coeffs = _tables.SOFT_COEFFS[j]
    steps = len(coeffs)
    for k in range(len(coeffs) + 1):
        if max(1.0 - ells[k], uppers[k] - 1.0) <= tol:
            steps = k
            break
    return coeffs[:steps]


def polar_express_band(steps: int) -> tuple[float, float]:
    """Interval holding ``p_K∘…∘p_1(s)`` for all ``s ∈ [ℓ₀, 1]`` after ``steps`` orth steps."""
    ells, uppers = _tables.ORTH_ELLS, _tables.ORTH_UPPERS
    k = min(steps, len(ells) - 1)
    return ells[k], uppers[k]


def coupled_inverse_sqrt(
    M_hat: Tensor,
    M_hat_sq: Tensor,
    coeffs: tuple[Quintic, ...],
    matmul: Callable[[Tensor, Tensor], Tensor] = torch.matmul,
) -> Tensor:
    r"""``Z ≈ M̂^{-1/2}`` by the coupled polynomial iteration (batched, symmetric input).

    ``M_hat_sq`` is ``M̂²`` (the first step's ``E²``; the caller gets it for free). With
    ``Z₀ = I`` and ``Y₀ = M̂`` the first step needs one product; each later step needs four
    (``E = ZY``, ``E²``, ``QZ``, ``YQ``), the last one three, all through ``matmul``.
    """
    if not coeffs:
        eye = torch.eye(M_hat.shape[-1], dtype=M_hat.dtype, device=M_hat.device)
        return eye.expand_as(M_hat).clone()
    a, b, c = coeffs[0]
    # each polynomial in place in its fresh product: the working set is Z, Y and a product
    Z = add_to_diagonal(torch.mul(M_hat_sq, c).add_(M_hat, alpha=b), a)
    if len(coeffs) == 1:
        return Z
    Y = matmul(M_hat, Z)
    last = len(coeffs) - 1
    for k, (a, b, c) in enumerate(coeffs[1:], start=1):
        E = matmul(Z, Y)
        E = torch.add(E, E.mT).mul_(0.5)  # symmetric in exact arithmetic; keep it so
        Q = add_to_diagonal(matmul(E, E).mul_(c).add_(E, alpha=b), a)
        del E
        Z = matmul(Q, Z)
        if k < last:
            Y = matmul(Y, Q)
        del Q
    return Z


def polynomial_gram_factor(
    G: Tensor, coeffs: Sequence[Quintic], norm: Tensor, dtype: torch.dtype
) -> Tensor:
    r"""``P_K`` with ``Y_K = P_K·X`` for the quintic iteration ``Y ← aY + (bA + cA²)Y``,
    ``A = YYᵀ``, from ``Y₀ = X/norm``, for every X with ``XXᵀ = G``: carried as a polynomial
    in G, ``A_k = P_k G P_k`` and ``P_{k+1} = a_k P_k + (b_k A_k + c_k A_k²) P_k`` from
    ``P₀ = I/norm`` (the same products on ``m × m`` matrices, equal to the iteration on X up
    to rounding), in ``dtype``."""
    eye = torch.eye(G.shape[-1], dtype=torch.float64, device=G.device)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))[..., None, None]
    P = (eye / safe).to(dtype).expand_as(G).clone()
    Gd = G.to(dtype)
    for a, b, cc in coeffs:
        A = P @ Gd @ P
        B = b * A + cc * (A @ A)
        P = a * P + B @ P
    return P
