"""Benchmarks: ``spectra bench ops`` (spectral operators) and ``spectra bench optim``."""
