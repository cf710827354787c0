"""A run directory, as training writes it and every other command reads it.

``checkpoint`` (the checkpoint files and the components they hold), ``model`` (a run's model
loaded from its latest checkpoint), ``records`` (its metrics.jsonl), ``scores`` (its downstream
scores from ``spectra eval``), and the subcommands that read finished runs: ``sample`` and
``compare``. Training (``train/``) and downstream evaluation (``eval/``) both sit on this room;
it imports neither.
"""
