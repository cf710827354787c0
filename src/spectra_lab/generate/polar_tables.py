"""Regenerate ``spectra.ops._polar_coeffs``: ``python -m spectra_lab.generate.polar_tables``.

Re-solves every minimax quintic of :mod:`spectra.ops.polar` by linear programming (scipy, a
few minutes), writes the table module atomically and formats it with ruff when ruff is
installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import spectra.ops
from spectra.ops.quintics import render_tables
from spectra_lab.files import atomic_write


def main() -> int:
    path = Path(spectra.ops.__file__).with_name("_polar_coeffs.py")
    atomic_write(path, render_tables())
    ruff = shutil.which("ruff")
    if ruff is not None:
        subprocess.run([ruff, "format", str(path)], check=True)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
