"""Flop counts of the matmul-only soft clipping methods and orthogonalization (2·m·k·n per
product): ``spectra bench ops`` skips the paper's bf16 cells that would outlast ``--budget``
by them and prints them with ``--flops``; ``spectra bench gpu-model`` builds on them."""

from __future__ import annotations

import math

import torch

from spectra.ops.polar import polar_steps
from spectra_lab.bench.matrices import CLIP_C, make_input
from spectra_lab.bench.tables import markdown_table


def matmul_flops(
    method: str, shape: tuple[int, ...], steps: int = 0, fp64_redo: bool = False
) -> int:
    """Flops of the matrix products of a matmul-only method (2·m·k·n per product).

    ``paper``: Gram + final product (``2m²n`` each) and 3 products of ``m × m`` per step, 10
    steps. ``polar``: the same two ``m²n`` products, ``G²`` and ``4K − 4`` products for ``K ≥ 1``
    steps (plus the float32 Gram matrix and ``G²`` recomputed in float64 when ``α > 1e5``).
    ``orth``: ``K`` steps of ``XXᵀ``, ``A²`` and ``BX``. ``polar-split``: ``polar``'s
    products as split bf16 ones, counted in bf16 products: three for each, two for the Gram
    matrix and ``G²`` (:func:`spectra.ops._common.split_bf16_gram`).
    """
    *batch, m, n = shape
    m, n = min(m, n), max(m, n)
    count = math.prod(batch) if batch else 1
    mn, mm = 2 * m * m * n, 2 * m**3
    if method == "paper":
        total = 2 * mn + 30 * mm
    elif method == "polar":
        total = 2 * mn + mm * (1 + max(0, 4 * steps - 4))
        if fp64_redo:
            total += mn + mm
    elif method == "polar-split":
        total = 5 * mn + mm * (2 + 3 * max(0, 4 * steps - 4))
    elif method == "orth":
        total = steps * (2 * mn + mm)
    else:
        raise ValueError(f"no flop count for {method!r}")
    return count * total


def mixed_flops(shape: tuple[int, ...], steps: int, exact: int) -> tuple[int, int]:
    """Flops of ``soft_clip(method="mixed")`` as ``(in the Gram matrix's precision, in bf16)``.

    In the Gram matrix's precision: the Gram matrix and the last product ``K·X`` (``2m²n``
    each), ``G²`` (``2m³``), and with ``e ≥ 1`` exact steps ``4e − 2`` products of ``m × m``
    matrices (the first step is a sum given ``G²``; each later one takes ``E = ZY``, the fused
    ``Q = p(E)``, ``QZ`` and ``YQ``; then ``E = ZY`` once more) and ``K = W·Z`` after bf16 steps.
    In bf16, ``r = K − e`` steps on E take ``4r − 3`` products (the first is one fused product,
    the last skips ``YQ``).
    """
    *batch, m, n = shape
    m, n = min(m, n), max(m, n)
    count = math.prod(batch) if batch else 1
    exact = min(exact, steps)
    rest = steps - exact
    products = 1 + (4 * exact - 2 if exact else 0) + (1 if exact and rest else 0)
    full = 4 * m * m * n + products * 2 * m**3
    half = (4 * rest - 3) * 2 * m**3 if rest else 0
    return count * full, count * half


def mixed_split_flops(shape: tuple[int, ...], steps: int, exact: int, parts: int = 2) -> int:
    """Flops of ``soft_clip(method="mixed", ns_dtype=torch.bfloat16)``, every product in bf16
    (while ``α ≤ 1e4``), counted in bf16 products: the Gram matrix and ``G²`` two each
    (``split_bf16_gram``); with ``e ≥ 1`` exact steps ``Y = M̂Z`` three, each later exact step
    eleven (``E = ZY``, ``QZ`` and ``YQ`` three each, ``E² = EEᵀ`` two) and ``E = ZY`` three;
    ``r = K − e`` plain bf16 steps (``4r − 3`` products for ``r ≥ 1``), then ``K = W·Z`` three
    where there were both; the last product ``K·X`` three (``2m²n`` each).

    ``parts=3`` (a capturable call's split products, whatever α): six bf16 products where two
    parts take three, and four where they take two (``split_bf16_matmul``,
    ``split_bf16_gram``)."""
    *batch, m, n = shape
    m, n = min(m, n), max(m, n)
    count = math.prod(batch) if batch else 1
    exact = min(exact, steps)
    rest = steps - exact
    prod, gram = (3, 2) if parts == 2 else (6, 4)
    cubes = gram + (2 * prod + (3 * prod + gram) * (exact - 1) if exact else 0)
    cubes += (4 * rest - 3 if rest else 0) + (prod if exact and rest else 0)
    return count * ((gram + prod) * 2 * m * m * n + cubes * 2 * m**3)


def flop_table(shapes: dict[str, tuple[int, ...]], inputs: tuple[str, ...]) -> str:
    """Markdown table: GFLOP of the matmul-only methods and polar's steps on each input."""
    rows = []
    for shape_name, shape in shapes.items():
        for kind in inputs:
            X = make_input(kind, shape).to(torch.float32)
            K, wd = polar_steps(X, CLIP_C)
            polar = matmul_flops("polar", shape, K, fp64_redo=wd == torch.float64)
            paper, orth = matmul_flops("paper", shape), matmul_flops("orth", shape, 5)
            precision = str(wd).removeprefix("torch.")
            gflop = [f"{polar / 1e9:.1f}", f"{paper / 1e9:.1f}", f"{polar / paper:.2f}"]
            rows.append([shape_name, kind, f"{K} ({precision})", *gflop, f"{orth / 1e9:.1f}"])
    head = ["shape", "input", "polar steps K (precision)", "polar GFLOP", "paper GFLOP (N_s=10)"]
    return markdown_table([*head, "polar/paper", "orth 5 steps GFLOP"], rows)
