"""spectra: spectral clipping for LLM training.

Implements the operators and optimizers of "Enhancing LLM Training via Spectral
Clipping" (SPECTRA). Depends on torch alone.

Operators (``spectra.ops``) are pure functions over the last two dimensions of a
tensor. Optimizers (``spectra.optim``) compute a base direction U, optionally clip
it spectrally, then apply decoupled weight decay and the learning rate:
``X ← (1 − λη) X − αη · clip_c(U)``.
"""

from spectra.monitor import SpectralMonitor
from spectra.ops import (
    coordinate_clip,
    global_clip,
    hard_clip,
    orthogonalize,
    soft_clip,
    spectral_lmo,
)
from spectra.optim import (
    MARS,
    SGDM,
    SOAP,
    AdamW,
    AdEMAMix,
    ClipSchedule,
    DMuon,
    Signum,
    Spectra,
    SpectraOptimizer,
    cosine_schedule,
    matrix_param_groups,
    standard_clip_schedule,
    wsd_schedule,
)

__version__ = "0.1.0"

__all__ = [
    "MARS",
    "SGDM",
    "SOAP",
    "AdEMAMix",
    "AdamW",
    "ClipSchedule",
    "DMuon",
    "Signum",
    "Spectra",
    "SpectraOptimizer",
    "SpectralMonitor",
    "coordinate_clip",
    "cosine_schedule",
    "global_clip",
    "hard_clip",
    "matrix_param_groups",
    "orthogonalize",
    "soft_clip",
    "spectral_lmo",
    "standard_clip_schedule",
    "wsd_schedule",
]
