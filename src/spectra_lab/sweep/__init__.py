"""``spectra sweep``: grids of training runs over seeds, resumable, with mean ± std reports."""
