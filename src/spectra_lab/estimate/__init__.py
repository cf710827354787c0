"""Analytic models, not measurements: ``spectra bench plan`` (a training config's time and
memory) and ``spectra bench gpu-model`` (soft clipping's flops and launches on an H100)."""
