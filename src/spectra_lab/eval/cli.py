"""``spectra eval``: downstream scores of a run's checkpoint through lm-evaluation-harness.

The paper's tasks are read from the Hugging Face cache only (``HF_DATASETS_OFFLINE=1`` and
``HF_HUB_OFFLINE=1`` are set unless ``--online``): a task whose data is not there is
reported in one line and skipped. The offline task on the validation plays
(:mod:`spectra_lab.eval.tasks`) needs nothing but the prepared dataset, so every machine
gets at least that number. lm-eval's results JSON and a score table (Markdown and CSV) are
written atomically into ``RUN_DIR/eval/``; scores of earlier calls for other tasks are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from spectra_lab.errors import CLIError
from spectra_lab.files import atomic_write, write_csv
from spectra_lab.runs.model import check_device
from spectra_lab.runs.scores import EVAL_DIR, SCORE_FIELDS, SCORES_CSV

# The paper's downstream evaluation, 5-shot.
PAPER_TASKS = (
    "arc_challenge", "arc_easy", "boolq", "piqa", "hellaswag", "winogrande", "openbookqa",
    "lambada_openai", "sciq", "mmlu",
)  # fmt: skip
OFFLINE_TASK = "shakespeare_lambada"  # spectra_lab.eval.tasks.OFFLINE_TASK, without importing it
RESULTS_FILE = "results.json"
SCORES_MD = "scores.md"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory of `spectra train`")
    parser.add_argument(
        "--tasks", nargs="+", default=[*PAPER_TASKS, OFFLINE_TASK], metavar="TASK",
        help=f"lm-eval task or group names (default: the paper's list and {OFFLINE_TASK})",
    )  # fmt: skip
    parser.add_argument("--num-fewshot", type=int, default=5, help="shots for the paper's tasks")
    parser.add_argument("--ckpt", help="checkpoint to evaluate (default: the run's latest)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--limit", type=int, default=None, help="first N documents per task")
    parser.add_argument(
        "--online", action="store_true", help="let lm-eval download task data from the Hub"
    )
    parser.add_argument(
        "--hf", action="store_true",
        help="export the run in the Hugging Face format (RUN_DIR/eval/hf) and score it with "
        "lm-eval's own hf model instead of spectra's",
    )  # fmt: skip


def hub_offline() -> None:
    """Read task data from the cache only: no retries against an unreachable Hub.

    ``datasets`` and ``huggingface_hub`` read the variables when imported, so modules
    already imported in this process are switched too.
    """
    os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
    for module in ("datasets.config", "huggingface_hub.constants"):
        if module in sys.modules:
            sys.modules[module].HF_HUB_OFFLINE = True


def run(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise CLIError(f"{run_dir}: not a run directory")
    if args.num_fewshot < 0 or args.batch_size < 1 or (args.limit is not None and args.limit < 1):
        raise CLIError("--num-fewshot must be >= 0, --batch-size and --limit >= 1")
    if args.device is not None:  # cuda without a GPU falls back to the CPU, as in the adapter
        check_device("--device", args.device, available=False)
    if not args.online:
        hub_offline()
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager

        from spectra_lab.eval.adapter import SpectraLM
        from spectra_lab.eval.tasks import build_offline_task
    except ImportError as exc:
        raise CLIError(f"spectra eval needs lm-eval: pip install -e '.[eval]' ({exc})") from None

    out_dir = run_dir / EVAL_DIR
    if args.hf:
        lm, dataset_dir = hf_model(args.ckpt or run_dir, out_dir / "hf", args)
    else:
        lm = SpectraLM(ckpt=args.ckpt or run_dir, device=args.device, batch_size=args.batch_size)
        dataset_dir = lm.dataset_dir
    if OFFLINE_TASK in args.tasks:
        task_dir, n, digest = build_offline_task(dataset_dir, out_dir / "tasks")
        print(f"{OFFLINE_TASK}: {n} passages from {dataset_dir} (sha256 {digest[:12]})")
        task_manager = TaskManager(include_path=str(task_dir))
    else:
        task_manager = TaskManager()

    hub_tasks = []
    for task in (t for t in args.tasks if t != OFFLINE_TASK):
        try:
            load_task(task_manager, task)
        except KeyError:
            raise CLIError(f"unknown lm-eval task {task!r} (see `lm_eval ls tasks`)") from None
        except Exception as exc:  # missing data surfaces as many types (ConnectionError, ...)
            print(
                f"{task}: data not available locally ({type(exc).__name__}); download it once "
                f"with network (spectra eval {run_dir} --online --tasks {task}), then run "
                "with HF_DATASETS_OFFLINE=1",
                file=sys.stderr,
            )
            continue
        hub_tasks.append(task)

    common = dict(
        model=lm, task_manager=task_manager, limit=args.limit, log_samples=False,
        bootstrap_iters=1000,
    )  # fmt: skip
    results: dict[str, Any] | None = None
    if hub_tasks:
        results = lm_eval.simple_evaluate(tasks=hub_tasks, num_fewshot=args.num_fewshot, **common)
    if OFFLINE_TASK in args.tasks:  # LAMBADA is scored zero-shot
        offline = lm_eval.simple_evaluate(tasks=[OFFLINE_TASK], num_fewshot=0, **common)
        results = offline if results is None else merge_results(results, offline)
    if results is None:
        raise CLIError("no task could be evaluated")

    previous = out_dir / RESULTS_FILE
    if previous.is_file():
        results = merge_results(json.loads(previous.read_text(encoding="utf-8")), results)
    write_results(out_dir, results)
    rows = score_rows(results)
    print(scores_markdown(rows), end="")
    print(f"wrote {out_dir / RESULTS_FILE}, {out_dir / SCORES_MD} and {out_dir / SCORES_CSV}")
    return 0


def load_task(task_manager: Any, task: str) -> Any:
    """Build lm-eval task ``task`` (``KeyError`` if lm-eval knows no such task): through
    ``TaskManager.load``, or ``get_task_dict`` on an older lm-eval without it."""
    if hasattr(task_manager, "load"):
        return task_manager.load([task])
    from lm_eval.tasks import get_task_dict

    return get_task_dict([task], task_manager)


def hf_model(ckpt: str | Path, out: Path, args: argparse.Namespace) -> tuple[Any, Path]:
    """lm-eval's ``hf`` model on a Hugging Face export of ``ckpt`` written to ``out``, and the
    run's dataset directory. A run whose tokenizer has no end-of-text token (``bytes``),
    which lm-eval's ``hf`` model needs, is refused in one line before anything is written."""
    import torch

    from spectra_lab.data import load_tokenizer
    from spectra_lab.runs.checkpoint import read_checkpoint, resolve_checkpoint
    from spectra_lab.runs.export import export_hf

    dataset_dir = Path(read_checkpoint(resolve_checkpoint(ckpt), map_location="cpu")["dataset_dir"])
    tokenizer = load_tokenizer(dataset_dir)
    if tokenizer.eot_id is None:
        raise CLIError(
            f"--hf: lm-eval's hf model needs an end-of-text token, which the run's "
            f"{tokenizer.name} tokenizer has not; score the run without --hf (spectra's own "
            'adapter uses "\\n" in its place)'
        )
    from lm_eval.models.huggingface import HFLM

    export_hf(ckpt, out)
    print(f"exported {ckpt} to {out}; scoring it with lm-eval's hf model")
    device = args.device or "cuda"
    if device.startswith("cuda") and not torch.cuda.is_available():
        device = "cpu"
    lm = HFLM(pretrained=str(out), dtype="float32", device=device, batch_size=args.batch_size)
    return lm, dataset_dir


# ---------------------------------------------------------------------- results files

_MERGED_KEYS = ("results", "n-shot", "versions", "higher_is_better", "configs", "n-samples")


def merge_results(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the per-task entries of ``old`` that ``new`` does not have."""
    merged = dict(new)
    for key in _MERGED_KEYS:
        if isinstance(old.get(key), dict) or isinstance(new.get(key), dict):
            merged[key] = {**old.get(key, {}), **new.get(key, {})}
    return merged


def score_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (task, metric, filter) of lm-eval's ``results``, sorted by task."""
    rows = []
    for task, metrics in sorted(results["results"].items()):
        for key, value in metrics.items():
            name, _, filt = key.partition(",")
            if not filt or "_stderr" in name or not isinstance(value, (int, float)):
                continue
            stderr = metrics.get(f"{name}_stderr,{filt}")
            rows.append(
                {
                    "task": task,
                    "metric": name,
                    "filter": filt,
                    "n_shot": results.get("n-shot", {}).get(task, ""),
                    "value": float(value),
                    "stderr": float(stderr) if isinstance(stderr, (int, float)) else "",
                }
            )
    return rows


def scores_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| task | metric | shots | value | stderr |", "|---|---|---:|---:|---:|"]
    for r in rows:
        stderr = f"{r['stderr']:.4f}" if r["stderr"] != "" else ""
        lines.append(
            f"| {r['task']} | {r['metric']} | {r['n_shot']} | {r['value']:.4f} | {stderr} |"
        )
    return "\n".join(lines) + "\n"


def write_results(out_dir: Path, results: dict[str, Any]) -> None:
    from lm_eval.utils import handle_non_serializable

    rows = score_rows(results)
    text = json.dumps(results, indent=2, default=handle_non_serializable, sort_keys=True)
    atomic_write(out_dir / RESULTS_FILE, text + "\n")
    write_csv(out_dir / SCORES_CSV, SCORE_FIELDS, rows)
    atomic_write(out_dir / SCORES_MD, scores_markdown(rows))
