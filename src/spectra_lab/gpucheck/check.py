"""``spectra bench gpu-check`` (``make gpu-check``): the GPU checks in one command.

Run as it is on a machine with a CUDA GPU, with that machine's own ``python3`` and torch
(``make gpu-check`` puts ``src/`` on ``PYTHONPATH``; nothing is installed). Each part runs in
its own process, so that one failing part leaves the others their say, and writes its file
under ``--out`` (default ``docs/data/gpu/``). The parts run in this order, the optimizer step
beside its peers first:

============================  ===============================================================
``bench_optim.json``          ``spectra bench optim`` at the 124M shapes: torch AdamW
                              (foreach and fused), ``torch.optim.Muon`` with torch AdamW,
                              D-Muon, Spectra-AdamW (default, ``polar``, ``mixed``) and the
                              paper's bf16 wrapper, in one process; step time and peak memory
``bench_optim_780m.json``     the same rows but the paper's wrapper at the 780M shapes (32
                              layers, width 1280, SwiGLU 3584), without the memory
``profile_124m_step.txt``     ``torch.profiler``'s top 30 CUDA kernels of one default
                              Spectra-AdamW step at the 124M shapes
``bench_optim_capturable``    the 124M step that reads nothing on the host (``capturable``):
``.json``                     eager and captured in a CUDA graph, each also with
                              ``clip_ns_dtype="bfloat16"`` (split bf16 products of three
                              parts), and compiled whole, beside the default step
``tests.json``                ``pytest -m cuda``: every operator and optimizer on CUDA in
                              float32 and bf16, bf16 autocast, ``torch.compile`` of the step,
                              NCCL with world size 1 through the FSDP2 path and the trainer
``bench_products.json``      ``spectra bench products``: one batched product of the clip's
                              shapes (124M and 780M) in each form, float32, bf16, bf16 with
                              a float32 result, split bf16 and the split Gram matrix: time
                              and TFLOP/s
``train.json``                the 124M model, ``TRAIN_STEPS`` steps under bf16 autocast, eager
                              and ``torch.compile``-d, Spectra-AdamW against torch AdamW:
                              tokens/s, MFU and peak memory (median over the steps after the
                              first ``TRAIN_SKIP``; random tokens from a 50304-token
                              vocabulary, since a step's time does not depend on them)
``overhead.json``            the paper's timing table's overhead on one GPU: the 124M model
                              compiled at the paper's tokens per GPU step (16 sequences of
                              512, 4 accumulation steps), torch AdamW, Spectra-AdamW and its
                              capturable step: step time, optimizer share, overhead
``bench_ops.json``            ``spectra bench ops`` at the paper's shapes against the paper's
                              bf16 Algorithm 1
``bench_optim_tf32.json``,    the 124M ``bench optim`` and ``bench ops`` again with TF32
``bench_ops_tf32.json``       float32 products
``gpu_check.json``            the index: GPU, torch, CUDA, commit, each part's status,
                              seconds and headline figures (rewritten after every part)
============================  ===============================================================

A part is recorded as not run when less than 80% of its own time limit is left of
``--budget`` seconds (default ``DEFAULT_BUDGET``, 390: the whole command within about six
minutes on an H100, so that fifteen minutes of a lent GPU leave room for a second, targeted
run). ``--archive PATH`` also packs every file the run wrote, the index and ``summary.md``
(the tables of docs/gpu.md) into one ``.tar.gz``, for a machine that brings back only a few
files. Without a CUDA GPU the command prints one line and exits 0. The exit status is 1 when
a part failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from spectra.validate import check_number
from spectra_lab.errors import CLIError
from spectra_lab.files import atomic_write, write_json_atomic
from spectra_lab.gpucheck.runs import keep_run, run_names
from spectra_lab.gpucheck.summary import (
    PROFILE_FILE,
    markdown_summary,
    ops_figures,
    optim_part,
)

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_OUT = ROOT / "docs" / "data" / "gpu"
#: The whole command's seconds unless ``--budget`` says otherwise (module docstring)
DEFAULT_BUDGET = 390.0
#: The 124M training runs: steps, sequences per step, steps left out of the medians
TRAIN_STEPS, TRAIN_BATCH, TRAIN_SKIP = 30, 16, 10
TRAIN_VOCAB, TRAIN_TOKENS = 50304, 2_000_000
#: The 124M runs: (compiled, optimizer, capturable). The capturable step compiled whole is
#: timed by ``bench_optim_capturable`` and in training by the overhead part: its compilation
#: took over 80 s on an H200, which here left the training part no time to finish
TRAIN_RUNS = (
    (False, "torch-adamw", False), (False, "spectra-adamw", False),
    (True, "torch-adamw", False), (True, "spectra-adamw", False),
)  # fmt: skip
#: The overhead runs (:func:`check_overhead`): compiled, at the paper's tokens per GPU step;
#: the last compiles the capturable step whole too (its lr a device tensor; a constant clip
#: threshold, as capturable asks)
OVERHEAD_RUNS = (
    (True, "torch-adamw", False), (True, "spectra-adamw", False), (True, "spectra-adamw", True),
)  # fmt: skip
OVERHEAD_STEPS, OVERHEAD_ACCUM = 14, 4
CAPTURABLE_TRAIN = (
    "--set", "optimizer_kwargs={capturable: true}", "--set", "clip_schedule=constant",
)  # fmt: skip
#: The operator benchmark's cells: the paper's 124M shapes and 2048², Adam-like, sign and
#: recorded inputs; ``mixed`` in float32 and bf16-first at each size (on either side of the
#: default's split threshold, ``spectra.ops.mixed.MIXED_SPLIT_FROM``)
OPS_ARGS = (
    "--shapes", "768x768", "768x3072", "2048x2048", "--inputs", "adam_spike", "sign",
    "recorded", "--dtypes", "fp32", "bf16", "--methods", "auto", "polar", "mixed", "mixed_fp32",
    "mixed_bf16", "polar_bf16", "paper_bf16", "paper_fp32", "--paper-bf16", "always",
    "--repeats", "10", "--no-progress",
)  # fmt: skip
#: The rows beside SPECTRA at both sizes: torch AdamW (foreach, fused), torch's Muon with
#: torch AdamW, D-Muon
PEERS = ("torch-adamw", "torch-adamw-fused", "torch-muon", "spectra-dmuon")
OPTIM_ARGS = (
    "--repeats", "10", "--warmup", "2", "--methods", *PEERS, "spectra-adamw",
    "spectra-adamw-polar", "spectra-adamw-mixed", "spectra-adamw-mixed-bf16", "paper-wrap-bf16",
)  # fmt: skip
#: The 780M shapes and the rows timed there (a few repeats: a step takes 0.1-0.5 s); there
#: ``mixed`` takes split bf16 products by default (``spectra.ops.mixed.MIXED_SPLIT_FROM``), and
#: ``-fp32`` times its float32 ones beside them
OPTIM_780M_ARGS = (
    "--layers", "32", "--dim", "1280", "--hidden", "3584", "--methods", *PEERS,
    "spectra-adamw", "spectra-adamw-polar", "spectra-adamw-mixed", "spectra-adamw-mixed-bf16",
    "spectra-adamw-mixed-fp32", "--repeats", "4", "--warmup", "2", "--no-memory",
)  # fmt: skip
#: The products of the clip in each form, at the batch shapes of its 124M and 780M steps
#: (``spectra_lab.bench.products.DEFAULT_SHAPES``)
PRODUCTS_ARGS = ("--repeats", "10")
#: The step without host reads (eager and in a CUDA graph, each with float32 products, with
#: split bf16 products of three parts, and of two under ``clip_ratio_bound=100``; then
#: compiled whole, its compilation last) beside the default step at the 124M shapes, with
#: their memory
CAPTURABLE_ARGS = (
    "--methods", "torch-adamw", "spectra-adamw", "spectra-adamw-capturable",
    "spectra-adamw-capturable-bf16", "spectra-adamw-capturable-bf16-r100", "spectra-adamw-graph",
    "spectra-adamw-graph-bf16", "spectra-adamw-graph-bf16-r100", "spectra-adamw-compiled",
    "--repeats", "5", "--warmup", "2",
)  # fmt: skip
#: One default Spectra-AdamW step at the 124M shapes under torch.profiler (into PROFILE_FILE)
PROFILE_ARGS = ("--methods", "spectra-adamw", "--repeats", "1", "--warmup", "3", "--no-memory")
TAIL = 3000  # characters of a failed part's output kept in the index


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help="folder of the JSON files (docs/data/gpu)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET,
        help=f"seconds for all parts together ({DEFAULT_BUDGET:.0f})",
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=list(PARTS),
        default=None,
        metavar="PART",
        help="run only these parts (in their usual order), a targeted rerun: the index under "
        "--out keeps the other parts of the same GPU's last run, each with its date "
        f"(parts: {', '.join(PARTS)})",
    )
    parser.add_argument(
        "--archive",
        default=None,
        metavar="PATH",
        help="also pack every file the run wrote into this .tar.gz",
    )


# --------------------------------------------------------------------------- running a part


def spectra_command(*argv: str) -> list[str]:
    """``python -m spectra_lab ARGV`` with this interpreter."""
    return [sys.executable, "-m", "spectra_lab", *argv]


def run_process(cmd: list[str], timeout: float) -> tuple[int, str]:
    """Exit status and output (stdout and stderr) of ``cmd``; status 124 on timeout."""
    paths = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        return 124, text + f"\n(stopped after {timeout:.0f} s)"
    return proc.returncode, proc.stdout + proc.stderr


def failed(status: int, output: str) -> dict[str, Any]:
    return {"status": "failed", "exit": status, "tail": output[-TAIL:]}


# --------------------------------------------------------------------------- the parts


def check_tests(out: Path, timeout: float) -> dict[str, Any]:
    """``pytest -m cuda`` over tests/, summarised from its JUnit report."""
    # only the modules with cuda tests: the others may import packages this machine lacks
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                   if "mark.cuda" in p.read_text())  # fmt: skip
    if not files:
        return {"status": "not run", "reason": f"no cuda tests in {ROOT / 'tests'}"}
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-p", "no:cacheprovider", "-q",
               f"--junitxml={junit}", *files]  # fmt: skip
        status, output = run_process(cmd, timeout)
        if not junit.exists():
            return failed(status, output)
        cases = ET.parse(junit).getroot().iter("testcase")
        results = [_case(c) for c in cases]
    summary = {
        "tests": len(results),
        "passed": sum(r["outcome"] == "passed" for r in results),
        "failed": [r for r in results if r["outcome"] not in ("passed", "skipped")],
        "skipped": [r for r in results if r["outcome"] == "skipped"],
        "seconds": round(sum(r["seconds"] for r in results), 1),
    }
    write_json_atomic(out / "tests.json", {**summary, "cases": results})
    ok = status == 0 and not summary["failed"]
    head = {k: v if isinstance(v, int | float) else len(v) for k, v in summary.items()}
    result = {"status": "passed" if ok else "failed", "file": "tests.json", **head}
    return result | ({} if ok else failed(status, output))


def _case(case: ET.Element) -> dict[str, Any]:
    outcome, message = "passed", None
    for tag in ("failure", "error", "skipped"):
        node = case.find(tag)
        if node is not None:
            outcome, message = tag, (node.get("message") or "").splitlines()[:1]
    name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
    row = {"name": name, "outcome": outcome, "seconds": float(case.get("time") or 0)}
    return row if message is None else {**row, "message": message[0] if message else ""}


def check_bench_ops(out: Path, timeout: float, tf32: bool) -> dict[str, Any]:
    name = "bench_ops_tf32.json" if tf32 else "bench_ops.json"
    cmd = spectra_command("bench", "ops", "--device", "cuda", *OPS_ARGS, "--out", str(out / name))
    status, output = run_process(cmd + (["--tf32"] if tf32 else []), timeout)
    if status != 0:
        return failed(status, output)
    figures = ops_figures(out / name)
    return {
        "status": "passed", "file": name,
        "median_vs_paper_bf16": {m: round(f[0], 3) for m, f in figures.items()},
        "max_error_fp32": {m: float(f"{f[1]:.2g}") for m, f in figures.items()},
        "max_error_bf16": {m: float(f"{f[2]:.2g}") for m, f in figures.items()},
    }  # fmt: skip


def check_bench_optim(out: Path, timeout: float, tf32: bool, size: str = "") -> dict[str, Any]:
    """``bench optim`` at the 124M shapes, or at the 780M ones with ``size="780m"``."""
    name = optim_part(size, tf32) + ".json"
    args = {"780m": OPTIM_780M_ARGS, "capturable": CAPTURABLE_ARGS}.get(size, OPTIM_ARGS)
    cmd = spectra_command("bench", "optim", "--device", "cuda", *args, "--json", str(out / name))
    status, output = run_process(cmd + (["--tf32"] if tf32 else []), timeout)
    if status != 0 and not (out / name).exists():
        return failed(status, output)
    rows = json.loads((out / name).read_text())["rows"]
    errors = {r["method"]: r["error"] for r in rows if r.get("error")}
    rows = [r for r in rows if not r.get("error")]
    if status != 0 and not (errors and rows):
        return failed(status, output)

    def ratios(key: str) -> dict[str, float]:
        return {r["method"]: round(r[key], 3) for r in rows if r.get(key) is not None}

    # "partial": some rows failed (each with its error), the others were measured
    return {
        "status": "partial" if errors else "passed", "file": name,
        **({"failed_rows": errors} if errors else {}),
        "step_ms": {r["method"]: round(1e3 * r["step_s"], 2) for r in rows},
        "vs_paper_bf16": ratios("vs_bf16"), "vs_torch_adamw": ratios("time_ratio"),
        "vs_torch_muon": ratios("vs_muon"), "peak_vs_torch_adamw": ratios("peak_ratio"),
    }  # fmt: skip


def check_bench_products(out: Path, timeout: float) -> dict[str, Any]:
    """``bench products``: the rate of each form of the clip's products at its batch shapes."""
    name = "bench_products.json"
    cmd = spectra_command("bench", "products", "--device", "cuda", *PRODUCTS_ARGS, "--json",
                          str(out / name))  # fmt: skip
    status, output = run_process(cmd, timeout)
    if status != 0 or not (out / name).exists():
        return failed(status, output)
    rows = json.loads((out / name).read_text())["rows"]
    tflops = {f"{r['shape']} {r['kind']}": round(r["tflops"], 1) for r in rows}
    return {"status": "passed", "file": name, "tflops": tflops}


def check_profile(out: Path, timeout: float) -> dict[str, Any]:
    """``torch.profiler``'s top kernels of one default Spectra-AdamW step at the 124M shapes."""
    cmd = spectra_command("bench", "optim", "--device", "cuda", *PROFILE_ARGS, "--profile",
                          str(out / PROFILE_FILE))  # fmt: skip
    status, output = run_process(cmd, timeout)
    if status != 0 or not (out / PROFILE_FILE).exists():
        return failed(status, output)
    return {"status": "passed", "file": PROFILE_FILE}


def check_training(out: Path, timeout: float) -> dict[str, Any]:
    """The 124M runs of :data:`TRAIN_RUNS` (torch AdamW, Spectra-AdamW; eager and compiled) on
    random tokens."""
    runs = train_runs(TRAIN_RUNS, TRAIN_STEPS, 1, timeout)
    report = {"preset": "124m", "steps": TRAIN_STEPS, "batch_size": TRAIN_BATCH,
              "median_after_step": TRAIN_SKIP, "autocast": "bf16", "runs": runs}  # fmt: skip
    write_json_atomic(out / "train.json", report)
    return {"status": runs_status(runs), "file": "train.json", "runs": runs}


def check_overhead(out: Path, timeout: float) -> dict[str, Any]:
    """The paper's timing table's measure on one GPU: the 124M model compiled at the paper's
    tokens per step and per GPU (256 sequences of 512 over 4 GPUs: 16 sequences, 4
    accumulation steps), Spectra-AdamW's step time over torch AdamW's, minus one."""
    runs = train_runs(OVERHEAD_RUNS, OVERHEAD_STEPS, OVERHEAD_ACCUM, timeout)
    base = next((r["step_ms"] for r in runs if r["optimizer"] == "torch-adamw"
                 and "error" not in r), None)  # fmt: skip
    for r in runs:
        if base and "error" not in r:
            r["overhead"] = round(r["step_ms"] / base - 1.0, 4)
    report = {"preset": "124m", "steps": OVERHEAD_STEPS, "batch_size": TRAIN_BATCH,
              "grad_accum": OVERHEAD_ACCUM, "median_after_step": TRAIN_SKIP // 2,
              "autocast": "bf16", "compile": True, "runs": runs}  # fmt: skip
    write_json_atomic(out / "overhead.json", report)
    return {"status": runs_status(runs), "file": "overhead.json", "runs": runs}


def runs_status(runs: list[dict[str, Any]]) -> str:
    """``passed``; ``partial`` where some runs failed (each with its ``error``)."""
    return "partial" if any("error" in r for r in runs) else "passed"


def train_runs(
    runs: tuple[tuple[bool, str, bool], ...], steps: int, accum: int, timeout: float
) -> list[dict[str, Any]]:
    """Train the 124M model once per ``(compiled, optimizer, capturable)`` of ``runs`` on random
    tokens; each run's throughput, step time and optimizer share, with its tokens/s over torch
    AdamW's at the same compilation. A run that fails is a row with its ``error`` (the last
    line of its output) and the others still run. A run stopped by the part's time limit is a
    row with that error, and the runs after it rows that say they were not run: the runs
    already measured are kept."""
    started, done = time.monotonic(), []
    skip = TRAIN_SKIP if accum == 1 else TRAIN_SKIP // 2
    with tempfile.TemporaryDirectory() as tmp:
        data = write_random_tokens(Path(tmp) / "tokens", TRAIN_VOCAB, TRAIN_TOKENS)
        for compiled, optimizer, capturable in runs:
            left = timeout - (time.monotonic() - started)
            name = f"{optimizer}-{int(compiled)}{int(capturable)}"  # compiled, capturable
            cmd = spectra_command(
                "train", "--preset", "124m", "--steps", str(steps),
                "--batch-size", str(TRAIN_BATCH), "--grad-accum", str(accum),
                "--optimizer", optimizer,
                "--dataset", str(data), "--device", "cuda", "--out", str(Path(tmp) / name),
                "--no-progress", "--warmup-steps", "2", "--set", "autocast=bf16",
                "--set", "log_interval=1", "--set", "eval_batches=1",
                "--set", f"eval_interval={steps}", "--set", "checkpoint_interval=0",
                "--set", "keep_checkpoints=0", "--set", "plot=false",
                *(["--compile"] if compiled else []), *(CAPTURABLE_TRAIN if capturable else ()),
            )  # fmt: skip
            status, output = run_process(cmd, max(left, 1.0))
            row = {"optimizer": optimizer, "compile": compiled, "capturable": capturable}
            if status == 124:
                done.append({**row, "error": f"stopped at the part's time limit ({timeout:.0f} s)"})
                done += [{"optimizer": o, "compile": c, "capturable": k,
                          "error": "not run: the part's time limit was reached"}
                         for c, o, k in runs[len(done):]]  # fmt: skip
                break
            if status != 0:
                last = [line for line in output.strip().splitlines() if line.strip()][-1:]
                done.append({**row, "error": last[0] if last else f"exit {status}"})
                continue
            done.append({**row, **_throughput(Path(tmp) / name, skip)})
    ok = [r for r in done if "error" not in r]
    base = {r["compile"]: r["tokens_per_s"] for r in ok if r["optimizer"] == "torch-adamw"}
    for r in ok:
        if r["compile"] in base:
            r["tokens_per_s_vs_torch_adamw"] = round(r["tokens_per_s"] / base[r["compile"]], 3)
    return done


def write_random_tokens(folder: Path, vocab: int, tokens: int) -> Path:
    """A prepared dataset (``train.bin``, ``val.bin``, ``meta.json``) of uniform random tokens."""
    import numpy as np

    from spectra_lab.data.format import token_dtype

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    dtype = token_dtype(vocab)
    rng.integers(0, vocab, tokens, dtype=dtype).tofile(folder / "train.bin")
    rng.integers(0, vocab, tokens // 16, dtype=dtype).tofile(folder / "val.bin")
    meta = {"vocab_size": vocab, "dtype": np.dtype(dtype).name, "tokenizer": "random tokens"}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def _throughput(run_dir: Path, skip: int) -> dict[str, Any]:
    """Medians of tokens/s, MFU, step time and the optimizer's share of it after the first
    ``skip`` steps, and the peak memory, of a run."""
    from spectra_lab.runs.records import read_jsonl

    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("kind") == "train"]
    kept = [r for r in steps if r["step"] > skip] or steps

    def median(key: str) -> float | None:
        values = [r[key] for r in kept if r.get(key) is not None]
        return statistics.median(values) if values else None

    mfu, step_s, opt_s = median("mfu"), median("t_step"), median("t_optimizer")
    peaks = [r["peak_mem_gb"] for r in steps if r.get("peak_mem_gb") is not None]
    return {
        "tokens_per_s": round(median("tokens_per_s") or 0.0),
        "mfu": None if mfu is None else round(mfu, 4),
        "step_ms": None if step_s is None else round(1e3 * step_s, 2),
        "optimizer_share": None if not (opt_s and step_s) else round(opt_s / step_s, 4),
        "peak_mem_gb": max(peaks) if peaks else None,
        "final_loss": steps[-1]["loss"] if steps else None,
    }


PARTS: dict[str, tuple[Callable[[Path, float], dict[str, Any]], float]] = {
    # name: (part, its time limit in seconds), in the order they run: the step beside its
    # peers, its profile, the capturable and bf16-first steps and the CUDA tests first; the
    # rest as the budget allows
    "bench_optim": (lambda out, t: check_bench_optim(out, t, tf32=False), 90.0),
    "bench_optim_780m": (lambda out, t: check_bench_optim(out, t, False, "780m"), 120.0),
    "profile": (check_profile, 60.0),
    "bench_optim_capturable": (
        lambda out, t: check_bench_optim(out, t, False, "capturable"),
        110.0,
    ),
    "tests": (check_tests, 200.0),
    "bench_products": (check_bench_products, 30.0),
    "train": (check_training, 200.0),
    "overhead": (check_overhead, 240.0),  # two compiled runs of ~50 s, the capturable ~120 s
    "bench_ops": (lambda out, t: check_bench_ops(out, t, tf32=False), 60.0),
    "bench_optim_tf32": (lambda out, t: check_bench_optim(out, t, tf32=True), 90.0),
    "bench_ops_tf32": (lambda out, t: check_bench_ops(out, t, tf32=True), 60.0),
}


# --------------------------------------------------------------------------- the command


def about_machine() -> dict[str, Any]:
    from spectra_lab.machine import source_commit

    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "commit": source_commit(),
    }


def earlier_parts(index_path: Path, gpu: str, chosen: list[str]) -> dict[str, Any]:
    """The parts a targeted rerun (``--parts``) keeps from the last run's index at
    ``index_path``: those not ``chosen``, each with the date and commit of the run that
    measured it; none where that run was on another GPU."""
    if not index_path.exists():
        return {}
    last = json.loads(index_path.read_text())
    if last.get("gpu") != gpu:
        return {}
    return {
        name: {"measured": last["date"], "commit": last["commit"], **part}
        if "measured" not in part
        else part
        for name, part in last["parts"].items()
        if name not in chosen
    }


def check_archive(path: str | None) -> None:
    """ValueError naming ``--archive PATH`` unless it ends in ``.tar.gz`` in an existing folder."""
    if path is None:
        return
    if not path.endswith(".tar.gz"):
        raise ValueError(f"--archive must name a .tar.gz file, got {path!r}")
    folder = Path(path).resolve().parent
    if not folder.is_dir():
        raise ValueError(f"--archive {path!r}: no folder {str(folder)!r}")


def write_archive(path: str | Path, out: Path, index: dict[str, Any]) -> list[str]:
    """Pack the index, ``summary.md`` and every part's file under ``out`` into the ``.tar.gz``
    ``path`` (atomically); returns the names packed."""
    import tarfile

    from spectra_lab.files import atomic_path

    names = run_names(out, index)
    with atomic_path(path) as tmp:
        with tarfile.open(tmp, "w:gz") as tar:
            for n in names:
                tar.add(out / n, arcname=n)
    return names


def run(args: argparse.Namespace) -> int:
    archive = getattr(args, "archive", None)
    try:
        check_number("--budget", args.budget, low=0.0, low_open=True)
        check_archive(archive)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA GPU here (torch {torch.__version__}); nothing to check")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {**about_machine(), "budget_s": args.budget, "parts": {}}
    chosen = list(PARTS) if getattr(args, "parts", None) is None else args.parts
    if len(chosen) < len(PARTS):
        index["parts"] = earlier_parts(out / "gpu_check.json", index["gpu"], chosen)
    deadline = time.monotonic() + args.budget
    for name, (part, limit) in PARTS.items():
        if name not in chosen:
            continue
        left = deadline - time.monotonic()
        if left < 0.8 * limit:
            index["parts"][name] = {"status": "not run", "reason": f"{left:.0f} s of budget left"}
        else:
            print(f"gpu-check: {name} ...", flush=True)
            started = time.monotonic()
            result = part(out, min(limit, left))
            index["parts"][name] = {**result, "seconds": round(time.monotonic() - started, 1)}
        print(f"gpu-check: {name}: {index['parts'][name]['status']}", flush=True)
        write_json_atomic(out / "gpu_check.json", index)
    summary = markdown_summary(out)
    atomic_write(out / "summary.md", summary + "\n")
    print(summary)
    print(f"gpu-check: this run kept in {keep_run(out, index)}")
    if archive is not None:
        packed = write_archive(archive, out, index)
        print(f"gpu-check: {len(packed)} files packed into {archive}")
    statuses = [p["status"] for p in index["parts"].values()]
    print(f"gpu-check: {statuses.count('passed')} of {len(statuses)} parts passed; "
          f"results in {out}")  # fmt: skip
    return 1 if "failed" in statuses or "partial" in statuses else 0
