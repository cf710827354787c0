"""spectra_lab: the research harness on top of the ``spectra`` library.

Model, data, trainer, synthetic experiments, benchmarks and the ``spectra`` CLI.
"""
