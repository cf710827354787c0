"""Downstream evaluation through lm-evaluation-harness (the ``eval`` extra).

``spectra_lab.eval.adapter`` registers the ``spectra`` model with ``lm_eval``;
``spectra_lab.eval.tasks`` builds the offline task on the validation plays;
``spectra_lab.eval.cli`` is ``spectra eval``; ``spectra_lab.eval.export`` is ``spectra export``
(which needs no lm-eval). ``python -m spectra_lab.eval`` is lm-eval's own
command line with the ``spectra`` model registered. Nothing here is imported by the library
or the trainer.
"""
