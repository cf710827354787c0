"""``spectra export RUN --format hf --out DIR``: the Hugging Face export of
:mod:`spectra_lab.runs.export`, with the offline task beside it.

Next to the model and tokenizer files the export gets ``DIR/tasks/``: the passages of the
offline task ``shakespeare_lambada`` (:mod:`spectra_lab.eval.tasks`, built from the run's
dataset) and its YAML, so lm-eval's own command line scores a fresh export as it is::

    lm_eval --model hf --model_args pretrained=DIR --tasks shakespeare_lambada \\
        --include_path DIR/tasks

A dataset whose validation text has no speech to build passages from (any corpus but
Shakespeare's) gets no ``tasks/`` folder, and a line that says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spectra_lab.data import DataError, load_tokenizer
from spectra_lab.errors import CLIError
from spectra_lab.eval.tasks import OFFLINE_TASK, build_offline_task
from spectra_lab.runs import export
from spectra_lab.runs.checkpoint import read_checkpoint, resolve_checkpoint

#: the folder of the export that holds the offline task
TASKS_DIR = "tasks"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    export.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} is a file; give a folder for the export")
    code = export.run(args)
    dataset_dir = Path(read_checkpoint(resolve_checkpoint(args.run))["dataset_dir"])
    try:
        task_dir, n, _ = build_offline_task(dataset_dir, out / TASKS_DIR)
    except DataError as exc:
        print(f"no {OFFLINE_TASK} task in the export: {exc}")
        return code
    print(f"{OFFLINE_TASK}: {n} passages in {task_dir}")
    if load_tokenizer(dataset_dir).eot_id is None:
        print(
            "lm-eval's hf model needs an end-of-text token, which this run's tokenizer has "
            f"not: score the run with `spectra eval {args.run} --tasks {OFFLINE_TASK}`"
        )
    else:
        print(
            f"score the export with lm-eval's own command line: lm_eval --model hf "
            f"--model_args pretrained={out} --tasks {OFFLINE_TASK} --include_path {task_dir}"
        )
    return code
