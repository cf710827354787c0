"""The minimax-quintic tables behind ``soft_clip(method="polar")`` and Polar Express."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spectra.ops import _polar_coeffs as tables
from spectra.ops.quintics import (
    MARGIN,
    coupled_inverse_sqrt,
    inverse_sqrt_schedule,
    minimax_quintic,
)


def quintic(coef, s):
    a, b, c = coef
    return a * s + b * s**3 + c * s**5


SCHEDULES = [
    (f"soft[{j}]", tables.SOFT_ELLS[j], tables.SOFT_UPPERS[j], tables.SOFT_COEFFS[j])
    for j in range(len(tables.SOFT_ELL0))
] + [("orth", tables.ORTH_ELLS, tables.ORTH_UPPERS, tables.ORTH_COEFFS)]


@pytest.mark.parametrize("name,ells,uppers,coeffs", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_each_quintic_maps_its_interval_into_the_next_one(name, ells, uppers, coeffs):
    for k, coef in enumerate(coeffs):
        top = uppers[k] * (1 + MARGIN) if ells[k] < 0.9 else uppers[k]
        s = np.concatenate([np.geomspace(ells[k], top, 20001), np.linspace(ells[k], top, 20001)])
        p = quintic(coef, s)
        assert p.min() >= ells[k + 1] * (1 - 1e-9), (name, k)
        assert p.max() <= uppers[k + 1] * (1 + 1e-9), (name, k)
        # below the interval the map stays positive and below the interval's image
        below = np.linspace(0, ells[k], 2001)[1:]
        assert (quintic(coef, below) > 0).all() and (quintic(coef, below) <= p.max()).all()
    assert max(1 - ells[-1], uppers[-1] - 1) <= 1e-7


def test_table_polynomials_are_the_minimax_solutions():
    # regenerate one quintic of a schedule with the linear program and compare
    ells, uppers, coeffs = tables.SOFT_ELLS[1], tables.SOFT_UPPERS[1], tables.SOFT_COEFFS[1]
    k = 1
    top = uppers[k] * (1 + MARGIN) if ells[k] < 0.9 else uppers[k]
    coef = minimax_quintic(float(f"{ells[k]:.15g}"), float(f"{top:.15g}"))
    assert np.allclose(coef, coeffs[k], rtol=1e-6, atol=1e-6)


def test_coupled_iteration_acts_on_each_eigenvalue_as_the_composed_polynomial():
    # On a diagonal M̂ = diag(e), the iteration must return z with z·√e = p_K∘…∘p_1(√e).
    e = torch.tensor([1.0, 0.3, 1e-2, 1e-4, 1e-6], dtype=torch.float64)
    coeffs = inverse_sqrt_schedule(1e-3, 1e-3)
    Z = coupled_inverse_sqrt(torch.diag(e), torch.diag(e * e), coeffs)
    s = e.sqrt().numpy()
    for coef in coeffs:
        s = quintic(coef, s)
    assert np.allclose(torch.diagonal(Z).numpy() * e.sqrt().numpy(), s, rtol=1e-12)
    # every eigenvalue ≥ ℓ² = 1e-6 converged to within the tolerance
    assert np.abs(s - 1).max() <= 1e-3


@pytest.mark.parametrize("ell", [0.999, 0.5, 1e-1, 1e-3, 1e-5, 1e-8])
@pytest.mark.parametrize("tol", [1e-2, 1e-3, 1e-5])
def test_schedule_reaches_the_tolerance_on_its_whole_interval(ell, tol):
    coeffs = inverse_sqrt_schedule(ell, tol)
    s = np.geomspace(ell, 1.0, 50001)
    for coef in coeffs:
        s = quintic(coef, s)
    assert np.abs(s - 1).max() <= tol
