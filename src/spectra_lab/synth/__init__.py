"""The synthetic experiments of "Enhancing LLM Training via Spectral Clipping" (Sec. 6.1).

* :mod:`~spectra_lab.synth.problem`: matrix logistic regression and its data.
* :mod:`~spectra_lab.synth.frank_wolfe`: post-spectral clipping with the Theorem's parameters,
  its composite Frank–Wolfe form, and a reference solver of the constrained problem.
* :mod:`~spectra_lab.synth.spikes`: SGD variants under sparse spectral spikes, and the
  configuration of that experiment (``SpikeConfig``).
* :mod:`~spectra_lab.synth.experiments`, :mod:`~spectra_lab.synth.plots`,
  :mod:`~spectra_lab.synth.cli`: the experiments' runs and tables (``FWConfig``), figures
  and ``spectra synth``.
"""
