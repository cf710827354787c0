"""SPECTRA optimizers: base directions inside the shared SPECTRA step, a wrapper for any torch
optimizer, and LR / clipping schedules.

See ``docs/optimizers.md`` for the settings and their defaults.
"""

from spectra.optim.adamw import AdamW
from spectra.optim.ademamix import AdEMAMix
from spectra.optim.base import SPECTRA_DEFAULTS, SpectraOptimizer
from spectra.optim.dmuon import DMuon, dmuon_param_groups
from spectra.optim.mars import MARS
from spectra.optim.schedules import ClipSchedule, cosine_schedule, wsd_schedule
from spectra.optim.sgdm import SGDM
from spectra.optim.signum import Signum
from spectra.optim.soap import SOAP
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
    "Signum",
    "Spectra",
    "SpectraOptimizer",
    "cosine_schedule",
    "dmuon_param_groups",
    "wsd_schedule",
]
