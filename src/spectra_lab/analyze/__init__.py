"""Spectral diagnostics of training runs: what "Enhancing LLM Training via Spectral Clipping"
shows in its Section 4, Appendix D.2 and weight-norm figure, for the harness's runs.

* :mod:`~spectra_lab.analyze.subspace`: spectral and chordal distances between subspaces.
* :mod:`~spectra_lab.analyze.recorders`: observers of a training run (``train(watch=...)``)
  that record the spectra of gradients and updates, and the signal/noise structure of the
  gradient, at chosen steps.
* :mod:`~spectra_lab.analyze.plots`, :mod:`~spectra_lab.analyze.cli`: grid figures and
  ``spectra analyze {spectra,noise,norms}``.

The per-step scalars of a run (top singular values, spike scores, weight norms) come from
``spectra.SpectralMonitor`` through the trainer's ``monitor_every``; see docs/diagnostics.md.
"""
