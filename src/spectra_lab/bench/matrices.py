"""The matrices ``spectra bench ops`` runs on: the synthetic inputs at the paper's shapes and the
update directions recorded from real ``cpu-small`` runs.

The recorded file ships with the package (``data/cpu_small_directions.pt``);
``spectra bench record-inputs`` (:mod:`spectra_lab.generate.record_inputs`) writes it again.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

SHAPES: dict[str, tuple[int, ...]] = {
    "768x768": (768, 768),
    "768x3072": (768, 3072),
    "2048x2048": (2048, 2048),
    "8x512x512": (8, 512, 512),
}
QUICK_SHAPES: dict[str, tuple[int, ...]] = {"48x80": (48, 80), "2x32x24": (2, 32, 24)}
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
INPUTS = ("adam_spike", "sign", "gauss")
CLIP_C = 10.0  # the paper's recommended threshold for unit-RMS updates
SPIKE_OVER_C = 1e3  # σ_spike/c of the Adam-like input: the hardest case of the accuracy target
#: The file ``spectra bench ops --inputs recorded`` reads by default.
DEFAULT_FILE = Path(__file__).parent / "data" / "cpu_small_directions.pt"


def make_input(kind: str, shape: tuple[int, ...], seed: int = 0) -> Tensor:
    """A float64 test matrix (batch): Adam-like update with a rank-one spike, sign-like, Gaussian.

    Entries have unit RMS. The Adam-like update is ``g/√v`` with ``v`` an independent
    exponential average of squared gradients (heavy-tailed entries), plus a rank-one spike of
    spectral norm ``SPIKE_OVER_C·CLIP_C``.
    """
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    if kind == "gauss":
        return g
    if kind == "sign":
        return torch.sign(g)
    if kind != "adam_spike":
        raise ValueError(f"unknown input kind {kind!r}")
    z = torch.randn(shape, generator=gen, dtype=torch.float64)
    v = 0.9 * z * z + 0.1 * g * g
    X = g / (v.sqrt() + 1e-3)
    X = X / X.pow(2).mean(dim=(-2, -1), keepdim=True).sqrt()
    u = torch.randn((*shape[:-1], 1), generator=gen, dtype=torch.float64)
    w = torch.randn((*shape[:-2], 1, shape[-1]), generator=gen, dtype=torch.float64)
    u = u / torch.linalg.vector_norm(u, dim=-2, keepdim=True)
    w = w / torch.linalg.vector_norm(w, dim=-1, keepdim=True)
    return X + SPIKE_OVER_C * CLIP_C * (u @ w)


def spiked(
    shape: tuple[int, ...],
    c: float,
    spike_over_c: float,
    kind: str = "adam",
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """A stress input: singular values ``c·logspace(0, −3)`` (the bulk, from c down to c/1000)
    with the largest set to ``spike_over_c·c``, and the singular vectors of an Adam-like
    (``"adam"``), sign (``"sign"``) or Gaussian (``"gauss"``) matrix."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    if kind == "sign":
        g = torch.sign(g)
    elif kind == "adam":
        v = 0.9 * torch.randn(shape, generator=gen, dtype=torch.float64) ** 2 + 0.1 * g * g
        g = g / (v.sqrt() + 1e-3)
    elif kind != "gauss":
        raise ValueError(f"unknown spiked kind {kind!r}; expected adam, sign or gauss")
    U, S, Vh = torch.linalg.svd(g, full_matrices=False)
    S = c * torch.logspace(0, -3, S.shape[-1], dtype=torch.float64).expand_as(S).clone()
    S[..., 0] = spike_over_c * c
    return ((U * S.unsqueeze(-2)) @ Vh).to(dtype)


def synthetic_inputs(
    shapes: dict[str, tuple[int, ...]], kinds: tuple[str, ...]
) -> list[tuple[str, str, Tensor]]:
    """``(shape label, input label, float64 matrix)`` for every shape and synthetic kind."""
    return [(name, kind, make_input(kind, shapes[name])) for name in shapes for kind in kinds]


def square_shapes(sizes: list[int]) -> dict[str, tuple[int, ...]]:
    """``{"NxN": (N, N)}`` for each size, in the given order, duplicates dropped."""
    return {f"{n}x{n}": (n, n) for n in sizes}


def square_size(label: str) -> int:
    """N of a square shape label ``"NxN"``; ``ValueError`` for any other label."""
    parts = label.split("x")
    if len(parts) != 2 or parts[0] != parts[1] or not parts[0].isdigit():
        raise ValueError(f"not a square shape label: {label!r}")
    return int(parts[0])


def load(path: str | Path = DEFAULT_FILE) -> dict[str, Tensor]:
    """The recorded directions: ``{"optimizer@step/group": U}`` as float32."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no recorded directions; run `spectra bench record-inputs --out {path}`"
        )
    found = torch.load(path, weights_only=True)["directions"]
    return {key: U.float() for key, U in found.items()}


def recorded_inputs(path: str | None = None) -> list[tuple[str, str, Tensor]]:
    """The update directions recorded from real ``cpu-small`` runs (``bench record-inputs``)."""
    found = load(path or DEFAULT_FILE)
    return [
        ("x".join(map(str, U.shape)), key, U.to(torch.float64)) for key, U in sorted(found.items())
    ]
