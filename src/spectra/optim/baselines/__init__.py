"""The baselines the SPECTRA optimizers are compared with: D-Muon and SOAP.

Both are plain torch optimizers (no spectral clipping) on the frame of
:class:`~spectra.optim.baselines.base.BaselineOptimizer`; they share the Adam moments and the
decay and step links with the SPECTRA chain. See ``docs/baselines.md``.
"""

from spectra.optim.baselines.base import BaselineOptimizer
from spectra.optim.baselines.dmuon import DMuon, default_use_muon, dmuon_param_groups
from spectra.optim.baselines.soap import SOAP

__all__ = ["SOAP", "BaselineOptimizer", "DMuon", "default_use_muon", "dmuon_param_groups"]
