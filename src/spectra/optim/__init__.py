"""Optimizers."""

from spectra.optim.dmuon import DMuon, dmuon_param_groups
from spectra.optim.soap import SOAP

__all__ = ["SOAP", "DMuon", "dmuon_param_groups"]
