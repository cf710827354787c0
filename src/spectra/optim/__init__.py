"""SPECTRA optimizers: base directions inside the shared SPECTRA chain, a wrapper for any torch
optimizer, and LR / clipping schedules.

See ``docs/optimizers.md`` for the settings and their defaults, and ``docs/architecture.md``
for the flow of one step.
"""

from spectra.optim.adamw import AdamW
from spectra.optim.ademamix import AdEMAMix
from spectra.optim.base import NonFiniteError, SpectraOptimizer
from spectra.optim.baselines import SOAP, DMuon, dmuon_param_groups
from spectra.optim.chain import spectra_step
from spectra.optim.compiled import compile_step, inductor_options
from spectra.optim.groups import matrix_param_groups
from spectra.optim.layout import MatrixLayout
from spectra.optim.mars import MARS
from spectra.optim.plan import ParamPlan, SpectralOp
from spectra.optim.schedules import (
    ClipSchedule,
    cosine_schedule,
    standard_clip_schedule,
    wsd_schedule,
)
from spectra.optim.settings import SPECTRA_DEFAULTS
from spectra.optim.sgdm import SGDM
from spectra.optim.signum import Signum
from spectra.optim.wrapper import Spectra

__all__ = [
    "MARS",
    "SGDM",
    "SOAP",
    "SPECTRA_DEFAULTS",
    "AdEMAMix",
    "AdamW",
    "ClipSchedule",
    "DMuon",
    "MatrixLayout",
    "NonFiniteError",
    "ParamPlan",
    "Signum",
    "Spectra",
    "SpectraOptimizer",
    "SpectralOp",
    "compile_step",
    "cosine_schedule",
    "dmuon_param_groups",
    "inductor_options",
    "matrix_param_groups",
    "spectra_step",
    "standard_clip_schedule",
    "wsd_schedule",
]
