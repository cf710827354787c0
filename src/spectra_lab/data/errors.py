"""The error raised by the data pipeline for problems the user can fix."""

from __future__ import annotations

from spectra_lab.errors import UserError


class DataError(UserError, RuntimeError):
    """A one-line, actionable data problem (fetch failed, files missing, bad dataset)."""
