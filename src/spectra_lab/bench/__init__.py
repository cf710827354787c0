"""Measurements: ``spectra bench ops`` (spectral operators), ``optim``, ``dist``, ``memory`` and
``step``."""
