"""Spectral operators: pure functions over tensors whose last two dimensions are the matrix."""

from spectra.ops.batched import batched_apply_, batched_apply_all_
from spectra.ops.lmo import lmo_singular_values, spectral_lmo
from spectra.ops.methods import METHODS
from spectra.ops.mixed import soft_clip_mixed
from spectra.ops.muon import newton_schulz_quintic
from spectra.ops.paper import misr, soft_clip_paper
from spectra.ops.polar import soft_clip_polar
from spectra.ops.polar_express import polar_express
from spectra.ops.spectral import (
    coordinate_clip,
    global_clip,
    hard_clip,
    orthogonalize,
    soft_clip,
    soft_clip_begin,
    soft_clip_end,
    soft_clip_method,
    soft_clip_with_norm,
)

__all__ = [
    "METHODS",
    "batched_apply_",
    "batched_apply_all_",
    "coordinate_clip",
    "global_clip",
    "hard_clip",
    "lmo_singular_values",
    "misr",
    "newton_schulz_quintic",
    "orthogonalize",
    "polar_express",
    "soft_clip",
    "soft_clip_begin",
    "soft_clip_end",
    "soft_clip_method",
    "soft_clip_mixed",
    "soft_clip_paper",
    "soft_clip_polar",
    "soft_clip_with_norm",
    "spectral_lmo",
]
