"""μP tools: the coordinate check (``spectra mup coord-check``)."""
