r"""Spectral operators as functions of the Gram matrix: ``op(X) = K(G)·X`` with ``G = XXᵀ``.

Every operator of :mod:`spectra.ops` maps ``X = U diag(σ) Vᵀ`` to ``U diag(φ(σ)) Vᵀ``, which is
``K·X`` with ``K = U diag(φ(σ)/σ) Uᵀ``, a function of ``G = XXᵀ = U diag(σ²) Uᵀ`` alone (and
equally ``X·K`` with the same function of ``XᵀX``). So a matrix whose columns are spread over
several processes needs only the sum of their ``X_r X_rᵀ`` to be clipped: each process then
applies ``K`` to its own columns (:mod:`spectra.optim.distributed`, the Gram route).

:func:`gram_factor` returns ``K`` for a batch of Gram matrices:

* ``soft_clip`` by ``"mixed"`` (and by ``"auto"`` where it picks ``"mixed"``): the same
  iteration as the single-process call, which after forming G sees only G
  (:func:`spectra.ops.mixed.mixed_gram_factor`), so a sharded run equals the unsharded
  one up to the rounding of G's sum.
* ``soft_clip`` by ``"chebyshev"`` (and by ``"auto"`` where it picks it): the same polynomial of
  G as the single-process call, the exact factor for the matrices it hands to ``"eigh"``.
* ``soft_clip`` by any other method, ``hard_clip`` and ``orthogonalize`` by ``"svd"``/``"auto"``:
  the exact weights ``φ(σ)/σ`` from the float64 eigendecomposition of ``G``. For the
  soft clip's other matmul-only methods (``"polar"``, ``"paper"``) this is the exact clip, to
  which those methods are approximations (``"polar"`` within 1e-3).

Where a float32 ``G`` is too coarse for the clip (the single-process route would work in
float64), :func:`gram_factor` returns ``None`` and the caller passes the float64 ``G``.
  ``orthogonalize`` maps the directions with ``σ ≤ √ε₆₄·σ_max`` to zero (their σ² is below
  the rounding of the eigendecomposition); the SVD keeps those above ``max(m, n)·ε₆₄·σ_max``.
* ``orthogonalize`` by ``"muon"`` and ``"polar_express"``: the same quintic iteration, carried
  as a polynomial in ``G``. Writing the iterate as ``Y_k = P_k·X``, ``A_k = Y_kY_kᵀ =
  P_k G P_k`` and ``P_{k+1} = a_k P_k + (b_k A_k + c_k A_k²) P_k``, from ``P_0 = I/‖X‖_F``
  (``‖X‖²_F = tr G``): the same products on ``m × m`` matrices, equal to the iteration on X
  up to rounding. It runs in float32 (float64 for ``ns_dtype=torch.float64``), also where
  the method would run in bf16: ``G`` squares the condition number of X, so bf16 rounding
  would cost its small directions ``ε·κ²`` instead of the iteration's ``ε·κ`` (136% against
  10–20% for bf16 Newton–Schulz on X, measured on a 5 × 7 matrix with κ = 9.4). With bf16
  ``ns_dtype`` the result is therefore the float32 iteration's, not equal to the bf16 one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from spectra.ops.base import Options
from spectra.ops.methods import operator


def gram_factor(
    G: Tensor,
    kind: str,
    c: float | None = None,
    *,
    method: str = "auto",
    ns_steps: int | None = None,
    ns_dtype: torch.dtype | None = None,
    source_dtype: torch.dtype | None = None,
) -> Tensor | None:
    r"""``K`` with ``op(X) = K·X`` for every X with ``XXᵀ = G`` (and ``op(X) = X·K`` for
    ``XᵀX = G``), batched over the leading dimensions of the symmetric ``G``; float64 for the
    exact weights, the working precision for the iterations.

    ``kind`` is ``"soft_clip"``, ``"hard_clip"`` or ``"orthogonalize"`` with its threshold
    ``c`` and the arguments of that operator; the method's row of
    :data:`spectra.ops.methods.METHODS` gives the factor (see the module docstring for which
    method gives what). ``source_dtype`` is the dtype of the matrices G comes from (default:
    G's), which ``"auto"`` resolves with. ``None`` when a float32 G is too coarse for the clip
    (the single-process route would work in float64: ``(σ_max/c)² > 1e4`` for the exact
    weights, ``α > 1e5`` for ``"mixed"``).
    """
    source_dtype = source_dtype or G.dtype
    op = operator(kind, method, G.device, source_dtype)
    options = Options(ns_steps, ns_dtype)
    op.check(options)
    return op.gram_factor(G, c, options, source_dtype)
