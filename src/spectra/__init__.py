"""spectra: spectral clipping for LLM training.

Implements the operators and optimizers of "Enhancing LLM Training via Spectral
Clipping" (SPECTRA). Depends on torch alone.
"""

from spectra.ops import (
    coordinate_clip,
    global_clip,
    hard_clip,
    orthogonalize,
    soft_clip,
    spectral_lmo,
)

__version__ = "0.1.0"

__all__ = [
    "coordinate_clip",
    "global_clip",
    "hard_clip",
    "orthogonalize",
    "soft_clip",
    "spectral_lmo",
]
