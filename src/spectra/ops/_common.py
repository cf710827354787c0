"""Validation and shape helpers shared by the spectral operators."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch
from torch import Tensor

from spectra.validate import check_number


def check_matrix_input(X: Tensor, name: str = "X") -> None:
    """Reject inputs no spectral operator can act on."""
    if not isinstance(X, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(X).__name__}")
    if X.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension, got a 0-d tensor")
    if not (X.is_floating_point()):
        raise ValueError(f"{name} must have a floating dtype, got {X.dtype}")


def check_finite(X: Tensor, name: str = "X") -> None:
    """Reject inf and nan entries (one reduction; a host synchronisation on CUDA)."""
    # min and max are finite exactly when every entry is (nan propagates); unlike isfinite
    # this needs no temporary of X's size.
    if X.numel() and not bool(torch.stack(torch.aminmax(X)).isfinite().all()):
        raise ValueError(
            f"{name} holds non-finite values (inf or nan); a spectral operator needs finite input"
        )


def check_threshold(c: float, name: str = "c") -> float:
    """Return ``c`` as a float after checking it is a finite number > 0 (a one-element tensor
    counts as its number)."""
    if isinstance(c, Tensor) and c.numel() != 1:
        raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(c.shape)}")
    return check_number(name, c, low=0.0, low_open=True)


def wide_view(X: Tensor) -> tuple[Tensor, bool]:
    """Return X or its transpose so that rows <= columns (the Gram side is the small one)."""
    if X.shape[-2] > X.shape[-1]:
        return X.mT, True
    return X, False


def compute_dtype(X: Tensor) -> torch.dtype:
    """Working dtype for products on X: at least float32."""
    return torch.float64 if X.dtype == torch.float64 else torch.float32


# a setting, not data: torch.compile reads it while tracing (it cannot trace the backends' API)
@torch.compiler.assume_constant_result
def fp32_products_are_ieee(device: torch.device) -> bool:
    """Whether float32 matrix products on ``device`` run in IEEE float32.

    Users often enable TF32 on CUDA (``torch.set_float32_matmul_precision("high")``), or bf16
    products for float32 on CPUs with bf16 units (``"medium"``): about 1e-3 relative error per
    product, which the float32 Gram matrices of the operators cannot afford. Only reads the
    settings (the per-backend ``fp32_precision``, or the legacy flags on older torch), so that
    the user's choice of API is left alone.
    """
    backends = torch.backends
    backend = backends.cuda.matmul if device.type == "cuda" else backends.mkldnn.matmul
    mode = getattr(backend, "fp32_precision", None)
    if mode is None:  # torch before the per-backend settings
        return torch.get_float32_matmul_precision() == "highest"
    if mode == "none":
        mode = getattr(backends, "fp32_precision", "none")
    return mode in ("ieee", "none")


def _cpu_has_bf16_units() -> bool:
    """The CPU probe of :func:`has_bf16_units`: AMX tiles or AVX-512 BF16."""
    cpu = getattr(torch, "cpu", None)
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in probes)


#: The environment variable that overrides the CPU probe: ``0`` makes the operators take the
#: path of a CPU without bf16 units (to measure that path on a CPU that has them), ``1`` the
#: path of one with them; unset or empty, the probe decides.
CPU_BF16_ENV = "SPECTRA_CPU_BF16_UNITS"


def cpu_bf16_override(value: str | None) -> bool | None:
    """What a value of :data:`CPU_BF16_ENV` says: ``None`` (unset or empty: the probe decides),
    or whether to take the CPU's bf16 path; ValueError naming any other value."""
    if value is None or value == "":
        return None
    if value not in ("0", "1"):
        raise ValueError(f"{CPU_BF16_ENV} must be 0, 1 or unset, got {value!r}")
    return value == "1"


def _cpu_bf16_answer() -> bool:
    override = cpu_bf16_override(os.environ.get(CPU_BF16_ENV))
    return _cpu_has_bf16_units() if override is None else override


#: The CPU probe's answer (or :data:`CPU_BF16_ENV`'s), read once at import (every optimizer
#: step asks, and the CPU cannot change under a process). A plain constant rather than a
#: ``functools.cache``: torch.compile traces through a cache wrapper and warns of "potential
#: silent incorrectness" for it, while it reads a module constant as the constant it is.
CPU_HAS_BF16_UNITS = _cpu_bf16_answer()


def has_bf16_units(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 matrices in hardware: CUDA, or a CPU with AMX tiles
    or AVX-512 BF16. Elsewhere a bf16 product is a slow software path (about 60x slower than
    float32 on a 2-core AVX2 CPU)."""
    return device.type != "cpu" or CPU_HAS_BF16_UNITS


def matmul(A: Tensor, B: Tensor) -> Tensor:
    """``A @ B``, as ``torch.bmm`` where both are ``(B, m, k)`` and ``(B, k, n)`` batches: the
    same kernel, without the five views through which ``@`` folds the batch dimensions (each a
    dispatch on the host, which bounds a GPU step of small matrices)."""
    if A.dim() == 3 and B.dim() == 3 and A.shape[0] == B.shape[0]:
        return torch.bmm(A, B)
    return torch.matmul(A, B)


def bf16_matmul(A: Tensor, B: Tensor) -> Tensor:
    """``A @ B`` for bf16 operands with a bf16 result, accumulated in float32.

    On devices without bf16 units this is computed as the float32 product of the (exactly
    representable) bf16 operands, rounded to bf16 once: the numerics of a tensor-core bf16
    product, up to the order of the float32 summation, at float32 speed.
    """
    if has_bf16_units(A.device):
        return matmul(A, B)
    return matmul(A.float(), B.float()).to(torch.bfloat16)


def bf16_products_fp32(A: Tensor, B: Tensor) -> Tensor:
    """``A @ B`` for bf16 operands as a float32 result, accumulated in float32 (no rounding to
    bf16 at the end). On CUDA this is one tensor-core product (``out_dtype=torch.float32``);
    elsewhere the float32 product of the exactly representable operands, which has the same
    numerics up to the order of the summation."""
    if A.device.type == "cuda":
        return _float32_output_products(A, B)
    return matmul(A.float(), B.float())


def _float32_output_products(A: Tensor, B: Tensor) -> Tensor:
    """``torch.mm``/``torch.bmm`` with ``out_dtype=torch.float32`` (CUDA kernels; the tests run
    it on meta tensors), any batch dimensions flattened into one ``bmm``."""
    if A.dim() == 2 and B.dim() == 2:
        return torch.mm(A, B, out_dtype=torch.float32)
    if A.dim() == 3 and B.dim() == 3 and A.shape[0] == B.shape[0]:
        return torch.bmm(A, B, out_dtype=torch.float32)  # no views on the host
    batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    A3 = A.expand(*batch, *A.shape[-2:]).reshape(-1, *A.shape[-2:])
    B3 = B.expand(*batch, *B.shape[-2:]).reshape(-1, *B.shape[-2:])
    out = torch.bmm(A3, B3, out_dtype=torch.float32)
    return out.reshape(*batch, A.shape[-2], B.shape[-1])


def split_bf16(A: Tensor) -> tuple[Tensor, Tensor]:
    """``A ≈ A₁ + A₂`` with bf16 parts: ``A₁ = bf16(A)``, ``A₂ = bf16(A − A₁)``; the remainder
    is at most ``2⁻¹⁸·|A|`` per entry (16 of float32's 24 significand bits are kept)."""
    hi = A.to(torch.bfloat16)
    return hi, (A - hi).to(torch.bfloat16)  # hi is promoted to A's dtype, exactly


#: Split products of a matrix more than this many times longer than wide (an embedding) run
#: through this many blocks of its long side, so that the bf16 operands (three halves of the
#: float32 bytes of what they split) and each block's float32 result take a fraction of the
#: matrix. Along the CUDA code path (spectra_lab.bench.live_bytes) a mixed clip by split
#: products of one 1280 × 12576 matrix peaked at 2.96 times its float32 bytes unblocked and 2.08
#: in four blocks (the float32 products: 1.31). Each block costs a few launches, which bound a
#: GPU step of small matrices.
SPLIT_BLOCKS = 4


def _long_blocks(long: int, short: int) -> list[slice]:
    """``range(long)`` in :data:`SPLIT_BLOCKS` consecutive slices where ``long`` exceeds
    ``SPLIT_BLOCKS·short``, whole otherwise."""
    if long <= SPLIT_BLOCKS * short:
        return [slice(0, long)]
    width = -(-long // SPLIT_BLOCKS)
    return [slice(j, min(long, j + width)) for j in range(0, long, width)]


def split_bf16_matmul(A: Tensor, B: Tensor, parts: int = 2) -> Tensor:
    r"""``A @ B`` for float32 matrices from bf16 tensor-core products with float32 sums.

    ``parts=2``: ``A₁B₁ + A₁B₂ + A₂B₁`` with the splits of :func:`split_bf16`; the dropped
    terms (``A₂B₂`` and the remainders) are about ``3·2⁻¹⁸ ≈ 1.1e-5`` of ``|A||B|``
    entrywise: much closer to float32 (``6e-8``) than a plain bf16 product (``4e-3``), at
    three bf16 products' cost, which run as one over the concatenated inner dimension
    ``[A₁ A₁ A₂] @ [B₁; B₂; B₁]``. This is the split-precision idea of Ootomo and Yokota,
    "Recovering single precision accuracy from Tensor Cores while surpassing the FP32
    theoretical peak performance" (2022), with bf16 parts.

    ``parts=3``: ``A ≈ A₁ + A₂ + A₃`` (each the bf16 rounding of what the parts before it
    leave, 24 significand bits in all) and the six terms whose parts' orders sum to at most
    four, ``A₁B₁ + (A₁B₂ + A₂B₁) + (A₁B₃ + A₂B₂ + A₃B₁)``; the dropped ones are about
    ``2⁻²⁴`` of ``|A||B|``, float32's own rounding. This is the "bf16x6" product of Henry,
    Tang and Heinecke, "Leveraging the bfloat16 Artificial Intelligence Datatype For
    Higher-Precision Computations" (ARITH 2019), at six bf16 products' cost.

    Both run in blocks of B's columns or A's rows where they exceed ``SPLIT_BLOCKS`` times
    the inner dimension.
    """
    rows, inner, cols = A.shape[-2], A.shape[-1], B.shape[-1]
    left, right = partial(split_bf16_left, parts=parts), partial(split_bf16_right, parts=parts)
    product = partial(split_bf16_product, parts=parts)
    if max(rows, cols) <= SPLIT_BLOCKS * inner:
        return product(left(A), right(B))
    batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    out = torch.empty(*batch, rows, cols, dtype=torch.float32, device=A.device)
    if cols >= rows:  # B's column blocks against the whole of A, split once
        lhs = left(A)
        for s in _long_blocks(cols, inner):
            out[..., s].copy_(product(lhs, right(B[..., s])))
    else:  # A's row blocks against the whole of B
        rhs = right(B)
        for s in _long_blocks(rows, inner):
            out[..., s, :].copy_(product(left(A[..., s, :]), rhs))
    return out


#: The order of the parts in the concatenated operands of split products, by parts:
#: (left, right). With three parts, ``[A₁ A₂ A₃]`` against ``[B₃; B₂; B₁]`` gives the terms
#: of order four, and leading slices of the two the lower orders (:func:`split_bf16_product`).
_SPLIT_ORDER = {2: ((1, 1, 2), (1, 2, 1)), 3: ((1, 2, 3), (3, 2, 1))}


def _check_parts(parts: int) -> None:
    if parts not in _SPLIT_ORDER:
        raise ValueError(f"parts must be 2 or 3, got {parts!r}")


def split_bf16_left(A: Tensor, parts: int = 2) -> Tensor:
    """A's bf16 parts as the left operand of :func:`split_bf16_matmul`: ``[A₁ A₁ A₂]``, or
    ``[A₁ A₂ A₃]`` with three parts. Split apart from the product
    (:func:`split_bf16_product`), an operand that the product replaces can be freed before the
    product runs."""
    _check_parts(parts)
    return _split_concat(A, -1, _SPLIT_ORDER[parts][0])


def split_bf16_right(B: Tensor, parts: int = 2) -> Tensor:
    """B's bf16 parts as the right operand of :func:`split_bf16_matmul`: ``[B₁; B₂; B₁]``, or
    ``[B₃; B₂; B₁]`` with three parts."""
    _check_parts(parts)
    return _split_concat(B, -2, _SPLIT_ORDER[parts][1])


def split_bf16_product(left: Tensor, right: Tensor, parts: int = 2) -> Tensor:
    """``A @ B`` (float32) from the parts :func:`split_bf16_left` and :func:`split_bf16_right`
    made of A and B: with two parts one bf16 product over the concatenated inner dimension;
    with three, the terms of order four (``[A₁ A₂ A₃]·[B₃; B₂; B₁]``), then those of order
    three (``[A₁ A₂]·[B₂; B₁]``) and ``A₁B₁``, the smallest first."""
    _check_parts(parts)
    if parts == 2:
        return bf16_products_fp32(left, right)
    k = left.shape[-1] // 3
    out = bf16_products_fp32(left, right)
    out.add_(bf16_products_fp32(left[..., : 2 * k], right[..., k:, :]))
    return out.add_(bf16_products_fp32(left[..., :k], right[..., 2 * k :, :]))


def split_bf16_gram(X: Tensor, parts: int = 2) -> Tensor:
    r"""``X Xᵀ`` from bf16 tensor-core products with float32 sums, as accurate as
    :func:`split_bf16_matmul` with as many ``parts``, at two thirds of its flops.

    With two parts the three terms ``X₁X₁ᵀ + X₁X₂ᵀ + X₂X₁ᵀ`` are ``C + Cᵀ`` for
    ``C = X₁X₁ᵀ/2 + X₂X₁ᵀ``, one product over the concatenated inner dimension
    ``[X₁ X₂] @ [X₁/2 X₁]ᵀ`` (halving a bf16 number is exact). With three, the six terms of
    ``parts=3`` are ``C + Cᵀ`` for ``C = X₁X₁ᵀ/2 + X₂X₁ᵀ + X₃X₁ᵀ + X₂X₂ᵀ/2``, four bf16
    products (:func:`_gram_block`). Either
    is summed over blocks of X's columns where they exceed ``SPLIT_BLOCKS`` times its rows.
    The result is exactly symmetric, so the square of a symmetric matrix S (``S² = SSᵀ``) is
    formed the same way."""
    _check_parts(parts)
    C = None
    for s in _long_blocks(X.shape[-1], X.shape[-2]):
        block = _gram_block(X[..., s], parts)
        C = block if C is None else C.add_(block)
    return C + C.mT


def _gram_block(X: Tensor, parts: int) -> Tensor:
    """C of :func:`split_bf16_gram` for one block of X's columns (its operands freed on
    return): ``[X₁ X₂]·[X₁/2 X₁]ᵀ``; or with three parts, from ``[X₁ X₂ X₃]`` alone,
    ``X₃X₁ᵀ + (X₂X₂ᵀ)/2 + X₂X₁ᵀ + (X₁X₁ᵀ)/2``, four products of its slices, the smallest terms
    first (so that their sums round as float32's do), with no second operand to hold. The
    operands are built transposed, their parts stacked by rows (:func:`_split_rows`)."""
    width = X.shape[-1]
    lhs = _split_rows(X.mT, (1, 2) if parts == 2 else (1, 2, 3))  # Lᵀ
    hi = lhs[..., :width, :]
    if parts == 3:
        mid = lhs[..., width : 2 * width, :]
        C = bf16_products_fp32(lhs[..., 2 * width :, :].mT, hi)
        C.add_(bf16_products_fp32(mid.mT, mid), alpha=0.5)
        C.add_(bf16_products_fp32(mid.mT, hi))
        return C.add_(bf16_products_fp32(hi.mT, hi), alpha=0.5)
    rhs = torch.empty_like(lhs)  # Rᵀ
    torch.mul(hi, 0.5, out=rhs[..., :width, :])
    rhs[..., width:, :].copy_(hi)
    return bf16_products_fp32(lhs.mT, rhs)


def _split_concat(A: Tensor, dim: int, order: tuple[int, ...]) -> Tensor:
    """A's bf16 parts concatenated along ``dim`` (-1 or -2) in ``order`` (1: ``A₁ = bf16(A)``,
    2: ``A₂ = bf16(A − A₁)``, 3: ``A₃ = bf16(A − A₁ − A₂)``; ``(1, 1, 2)`` is
    ``[A₁ A₁ A₂]``). Along -1 it is the transpose of Aᵀ's parts stacked by rows, a view that
    products take as it is: every part is written whole into a contiguous place."""
    return _split_rows(A.mT, order).mT if dim == -1 else _split_rows(A, order)


def _split_rows(A: Tensor, order: tuple[int, ...]) -> Tensor:
    """A's bf16 parts stacked by rows in ``order`` (see :func:`_split_concat`), written into
    the stack itself: no separate parts (each remainder is exact in float32, and rounds once
    into its place), each written whole (``out=`` a contiguous place, which
    ``torch.compile`` traces)."""
    rows = A.shape[-2]
    out = torch.empty(*A.shape[:-2], rows * len(order), A.shape[-1], dtype=torch.bfloat16,
                      device=A.device)  # fmt: skip
    places = out.split(rows, dim=-2)
    first = {part: places[order.index(part)] for part in sorted(set(order))}
    first[1].copy_(A)
    if 3 in first:
        rest = torch.sub(A, first[1])
        first[2].copy_(rest)
        first[3].copy_(rest.sub_(first[2]))
        del rest
    else:
        torch.sub(A, first[1], out=first[2])
    for place, part in zip(places, order, strict=True):
        if place is not first[part]:
            place.copy_(first[part])
    return out


@contextlib.contextmanager
def single_thread_lapack(device: torch.device) -> Iterator[None]:
    """Run CPU LAPACK calls (eigh) on one intra-op thread, then restore the thread count.

    MKL's threaded symmetric eigensolver synchronises its threads many times per call; when
    the CPU is shared with other processes each synchronisation waits for a descheduled
    thread, and a 768 x 768 float64 eigh took 11.6 s with 2 threads against 0.11 s with one
    (docs/operators.md). The thread count is process-wide, so concurrent torch work in other
    Python threads runs single-threaded meanwhile.
    """
    old = torch.get_num_threads()
    if device.type != "cpu" or old == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def side_by_side(device: torch.device, calls: list[Callable[[], None]], workers: int) -> None:
    """Run ``calls`` on ``workers`` Python threads, each taking the next call when it is free,
    with one intra-op thread each (their LAPACK calls included): on the CPU, small batches use
    the cores better side by side than with the intra-op threads. Grad mode is thread-local:
    each call sets its own."""
    with single_thread_lapack(device), ThreadPoolExecutor(workers) as pool:
        for done in [pool.submit(call) for call in calls]:
            done.result()


# --------------------------------------------------------------------------- shared by methods


def vector_rule(x: Tensor, weight_of_norm: Callable[[Tensor], Tensor]) -> Tensor:
    """Apply ``x ↦ x · w(‖x‖)`` to a 1-D tensor, with ``w(r) = φ(r)/r`` (the paper's vector
    rule for an operator ``φ`` of the singular values)."""
    wd = compute_dtype(x)
    xw = x.to(wd)
    r = torch.linalg.vector_norm(xw)
    return (xw * weight_of_norm(r)).to(x.dtype)


def pow2_scale(X: Tensor) -> Tensor:
    """Per-matrix power of two near ``max|X|`` (float64, shape ``(..., 1, 1)``; 1 for all-zero
    matrices)."""
    # min and max apart, no |X| copy: on the CPU a batched aminmax(dim=...) runs about ten times
    # slower than the two reductions (0.33 against 0.03 ms on 4×192×512, two threads)
    lo, hi = X.amin(dim=(-2, -1), keepdim=True), X.amax(dim=(-2, -1), keepdim=True)
    return pow2_floor(torch.maximum(-lo, hi).to(torch.float64))


def pow2_floor(x: Tensor) -> Tensor:
    """The largest power of two ≤ x, elementwise for x ≥ 0 (float64; 1 where x is 0)."""
    safe = torch.where(x > 0, x, torch.ones_like(x))
    return torch.exp2(torch.floor(torch.log2(safe)))


def add_to_diagonal(A: Tensor, d: Tensor | float) -> Tensor:
    """``A + d·I`` in place on a ``(B, m, m)`` batch, for a number ``d`` or a tensor with one
    entry per matrix (shape ``(B,)`` or ``(B, 1, 1)``). A bf16 diagonal sums in float32 and
    rounds once: a bf16 add would round d first."""
    diagonal = A.diagonal(dim1=-2, dim2=-1)
    d = d.reshape(-1, 1) if isinstance(d, Tensor) else d
    if A.dtype == torch.bfloat16:
        diagonal.copy_(diagonal.float() + d)
    else:
        diagonal.add_(d)
    return A


def orient(Y: Tensor, transposed: bool) -> Tensor:
    """``Y`` back in the input's layout after :func:`wide_view`."""
    return Y.mT if transposed else Y
