"""Generators of committed files: the polar coefficient tables (``spectra.ops._polar_coeffs``)
and the recorded update directions that ``spectra bench ops`` reads
(``spectra bench record-inputs``)."""
