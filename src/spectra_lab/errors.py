"""The harness's one base for errors the user can fix.

The data pipeline, the training config, the checkpoints and the command line each raise
their own subclass; the ``spectra`` command prints any of them as one line (exit code 2)
instead of a traceback. This module imports nothing, so every layer can use it.
"""


class UserError(Exception):
    """A problem the user can fix, reported in one line."""

    #: the ``spectra`` command's exit status for it
    exit_code: int = 2


class CLIError(UserError):
    """A bad command-line argument, reported as one line without a traceback."""
