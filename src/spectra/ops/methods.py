"""The table of clip methods: one row per method, read by every operator and the Gram route.

``METHODS`` maps a method's name to what it offers each operator (:class:`~spectra.ops.base.
ClipMethod`). ``"auto"`` is not a row: :func:`resolve` picks a row for the input's device and
dtype. A name that is not in the table, or a method that does not offer the operator, is an
error wherever it is asked for; nothing falls back to another method.

Adding a method is one module that defines ``METHOD`` (see ``docs/architecture.md``) and one
row here.
"""

from __future__ import annotations

import torch

from spectra.ops import chebyshev, eigh, mixed, muon, paper, polar, polar_express, svd
from spectra.ops._common import has_bf16_units
from spectra.ops.base import ClipMethod, Operator

METHODS: dict[str, ClipMethod] = {
    m.name: m
    for m in (
        eigh.METHOD,
        svd.METHOD,
        polar.METHOD,
        mixed.METHOD,
        chebyshev.METHOD,
        paper.METHOD,
        muon.METHOD,
        polar_express.METHOD,
    )
}

OPERATORS: tuple[str, ...] = ("soft_clip", "hard_clip", "orthogonalize")


def default_method(
    kind: str, device: torch.device, dtype: torch.dtype, capturable: bool = False
) -> str:
    """The method ``"auto"`` picks for ``kind`` on ``dtype`` input on ``device``.

    ``soft_clip``: for float32 and bf16 input ``"mixed"`` on CUDA and on a CPU with bf16
    units (AMX, AVX-512 BF16), the fastest there at the bf16 floor of error (4-8e-3; on CUDA
    its optimizer step is faster and leaner than ``"polar"``'s in the stored H100 and H200
    runs, docs/gpu.md; there it forms its float32 products from split bf16 ones for matrices
    of smaller side 1024 or more, :func:`spectra.ops.mixed.exact_precision`); ``"chebyshev"``
    on a CPU without bf16 units, where the main job's step took 1.043× its AdamW twin against
    1.074× with ``"eigh"`` and 1.049× with ``"mixed"`` (the libraries held to AVX2,
    docs/operators.md) at an error of 1e-3 or less; float64 input on CUDA takes ``"polar"``,
    on a CPU ``"eigh"`` (float64 input keeps an accurate method, docs/operators.md).
    ``hard_clip``: ``"eigh"`` (min(σ, c) has a kink at c, which polynomial iterations resolve
    only slowly). ``orthogonalize``: ``"svd"``.

    ``capturable`` (no host read): the soft clip takes ``"polar"`` where it would take
    ``"eigh"`` or ``"chebyshev"``, and ``orthogonalize`` takes ``"polar_express"``;
    ``hard_clip`` has no such method.
    """
    if kind == "soft_clip":
        if dtype != torch.float64 and (device.type == "cuda" or has_bf16_units(device)):
            return "mixed"
        if device.type == "cuda" or capturable:
            return "polar"
        return "eigh" if dtype == torch.float64 else "chebyshev"
    if kind == "orthogonalize":
        return "polar_express" if capturable else "svd"
    return "eigh"


def method_names(kind: str) -> tuple[str, ...]:
    """The methods ``kind`` accepts, ``"auto"`` first."""
    return ("auto", *(n for n, m in METHODS.items() if getattr(m, kind) is not None))


def capturable_names(kind: str) -> tuple[str, ...]:
    """The methods of ``kind`` that run without a host read, ``"auto"`` first (none for
    ``hard_clip``)."""
    names = tuple(n for n, m in METHODS.items() if getattr(getattr(m, kind), "capturable", False))
    return ("auto", *names) if names else ()


def resolve(
    kind: str, method: str, device: torch.device, dtype: torch.dtype, capturable: bool = False
) -> str:
    """``method`` with ``"auto"`` resolved; ValueError naming the valid ones if ``kind`` has no
    such method (with ``capturable``: no such method that runs without a host read)."""
    if kind not in OPERATORS:
        raise ValueError(f"unknown operator {kind!r}; expected one of {', '.join(OPERATORS)}")
    if method != "auto" and getattr(METHODS.get(method), kind, None) is None:
        names = ", ".join(method_names(kind))
        raise ValueError(f"unknown {kind} method {method!r}; expected one of {names}")
    if capturable:
        check_capturable(kind, method)
    return default_method(kind, device, dtype, capturable) if method == "auto" else method


def check_capturable(kind: str, method: str) -> None:
    """Refuse a ``kind``/``method`` pair that has no form without a host read."""
    names = capturable_names(kind)
    if method not in names:
        offered = f"one of {', '.join(names)}" if names else "none: it needs an eigendecomposition"
        raise ValueError(
            f"{kind} method {method!r} cannot run without a host read (capturable=True); "
            f"capturable {kind} methods: {offered}"
        )


def operator(
    kind: str, method: str, device: torch.device, dtype: torch.dtype, capturable: bool = False
) -> Operator:
    """The :class:`~spectra.ops.base.Operator` that ``kind(X, method=method)`` runs for ``dtype``
    input on ``device``."""
    return getattr(METHODS[resolve(kind, method, device, dtype, capturable)], kind)
