"""The offline downstream task: LAMBADA-style last-word prediction on the validation plays.

The passages are built from a prepared dataset's ``val.bin`` (the held-out plays of the
embedded Shakespeare corpus, decoded with the dataset's own tokenizer, which round-trips
text exactly), so any machine that can train can also evaluate. The build is a pure
function of the validation text:

* the text is split into documents at the end-of-text marker and into blocks at blank
  lines;
* a block is a speech when its first line is a speaker's name in capitals ending in a
  period (``MACBETH.``), followed by at least :data:`MIN_WORDS` words of speech;
* the target is the speech's last word with its trailing punctuation removed, when that is
  a plain word of at least three letters (apostrophes inside allowed) that follows a space;
* the context is the speaker line and the speech up to that word, so the task is to predict
  the word that ends the speech, as in LAMBADA.

Passages keep the order of the text; their count and a hash are printed by ``spectra eval``.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib.resources import files
from pathlib import Path

import numpy as np
import yaml

from spectra_lab.data import check_dataset, load_tokenizer
from spectra_lab.data.errors import DataError
from spectra_lab.data.tokenizers import EOT_TEXT
from spectra_lab.files import atomic_write

__all__ = [
    "MIN_WORDS",
    "OFFLINE_TASK",
    "build_offline_task",
    "build_passages",
    "validation_text",
]

OFFLINE_TASK = "shakespeare_lambada"
MIN_WORDS = 40

_SPEAKER = re.compile(r"^[A-Z][A-Z0-9 ,'&-]*\.$")
_WORD = re.compile(r"[A-Za-z][A-Za-z']*[A-Za-z]")
_TRAILING = ".,;:!?-"


def validation_text(dataset_dir: str | Path) -> str:
    """The validation split of a prepared dataset as text (documents joined by EOT_TEXT)."""
    dataset_dir = Path(dataset_dir)
    meta = check_dataset(dataset_dir)
    ids = np.fromfile(dataset_dir / "val.bin", dtype=np.dtype(meta.get("dtype", "uint16")))
    # Without an end-of-text token the documents are separated by a blank line, which
    # build_passages splits at anyway.
    return load_tokenizer(dataset_dir).decode(ids.tolist())


def build_passages(text: str, min_words: int = MIN_WORDS) -> list[dict[str, str]]:
    """``[{"context", "target"}]`` for every speech of ``text`` that qualifies (see above)."""
    passages = []
    for doc in text.split(EOT_TEXT):
        for block in doc.split("\n\n"):
            lines = block.strip("\n").split("\n")
            if len(lines) < 2 or not _SPEAKER.match(lines[0].strip()):
                continue
            speech = "\n".join(lines[1:]).rstrip()
            if len(speech.split()) < min_words:
                continue
            head, sep, last = speech.rpartition(" ")
            word = last.rstrip(_TRAILING)
            if not sep or "\n" in last or not _WORD.fullmatch(word):
                continue
            passages.append({"context": f"{lines[0].strip()}\n{head}", "target": word})
    return passages


def build_offline_task(dataset_dir: str | Path, out_dir: str | Path) -> tuple[Path, int, str]:
    """Write the passages of ``dataset_dir``'s validation text and the task YAML into
    ``out_dir`` (for ``TaskManager(include_path=out_dir)``); return the folder, the number of
    passages and the SHA-256 of the data file."""
    out_dir = Path(out_dir)
    passages = build_passages(validation_text(dataset_dir))
    if not passages:
        raise DataError(f"{dataset_dir}: the validation text has no speech to build passages")
    data = "".join(json.dumps(p, ensure_ascii=False, sort_keys=True) + "\n" for p in passages)
    data_file = out_dir / f"{OFFLINE_TASK}.jsonl"
    atomic_write(data_file, data)
    config = yaml.safe_load(task_yaml())
    config["dataset_kwargs"]["data_files"] = {"test": str(data_file.resolve())}
    atomic_write(out_dir / f"{OFFLINE_TASK}.yaml", yaml.safe_dump(config, sort_keys=False))
    return out_dir, len(passages), hashlib.sha256(data.encode()).hexdigest()


def task_yaml() -> str:
    """The shipped task YAML (its ``data_files`` relative to the folder it is copied to)."""
    return files(__package__).joinpath(f"{OFFLINE_TASK}.yaml").read_text(encoding="utf-8")
