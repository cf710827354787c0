"""Blocks rendered from the stored GPU runs under ``docs/data/gpu/`` (``make gpu-check``) and the
trainer's GPU peaks."""

from __future__ import annotations

import json
from pathlib import Path

from spectra_lab.blocks.common import json_of, latest_gpu, sci, table


def gpu_runs(root: Path) -> str:
    from spectra_lab.gpucheck.runs import runs_table

    return runs_table(root / "docs" / "data" / "gpu")


def gpu_summary(root: Path) -> str:
    """The summary of the latest stored GPU check (``make gpu-check``)."""
    from spectra_lab.gpucheck.check import markdown_summary

    return markdown_summary(root / "docs" / "data" / "gpu").rstrip()


def gpu_ops(root: Path) -> str:
    """``auto`` against the paper's bf16 run on the latest H200 and H100 runs of ``make
    gpu-check`` (median over the cells, plain and with TF32) and its worst float32 error."""
    from spectra_lab.gpucheck.check import ops_figures

    h200, h100 = latest_gpu(root, "H200"), latest_gpu(root, "H100")
    a, a32 = (ops_figures(h200 / f"{p}.json")["auto"] for p in ("bench_ops", "bench_ops_tf32"))
    b, b32 = (ops_figures(h100 / f"{p}.json")["auto"] for p in ("bench_ops", "bench_ops_tf32"))
    cells = json.loads((h200 / "bench_ops.json").read_text())["cells"]
    n = len(cells) // len({c["method"] for c in cells})
    return (f"`auto` takes {a[0]:.2f}× the paper's bf16 run on the H200 (median of {n} cells; "
            f"{a32[0]:.2f}× with TF32) at ≤ {sci(a[1])} error on float32 inputs, and "
            f"{b[0]:.2f}× ({b32[0]:.2f}×) on the H100")  # fmt: skip


def gpu_peaks(root: Path) -> str:
    """The dense peak TFLOP/s the trainer's MFU divides by, per GPU and precision
    (``spectra_lab.train.throughput.GPUS``, from NVIDIA's datasheets)."""
    from spectra_lab.train.throughput import GPUS

    sources = {"h100": "NVIDIA H100 Tensor Core GPU datasheet",
               "h200": "NVIDIA H200 Tensor Core GPU datasheet",
               "a100": "NVIDIA A100 Tensor Core GPU datasheet"}  # fmt: skip
    rows = []
    for key, g in GPUS.items():
        name = "A100, SXM or PCIe" if key == "a100" else g.name
        rows.append([f"{name} (`{key}`)", f"{g.bf16:g}", f"{g.tf32:g}", f"{g.fp32:g}",
                     sources.get(key, "same")])  # fmt: skip
    return table(["GPU", "bf16", "TF32", "FP32", "source"], rows, "lrrrl")


def gpu_peers(root: Path) -> str:
    """The optimizer step beside the peers a GPU user would pick, from the stand-alone run
    stored with the GPU check (``docs/data/gpu/peer_step.json``): median ms per size."""
    stored = json_of(root, "docs/data/gpu/peer_step.json")
    sizes = list(dict.fromkeys(r["size"] for r in stored["results"]))
    rows = []
    for name in dict.fromkeys(r["row"] for r in stored["results"]):
        by = {r["size"]: r["step_ms"] for r in stored["results"] if r["row"] == name}
        rows.append([f"`{name}`", *(f"{by[s]:.1f}" if s in by else "–" for s in sizes)])
    head = [f"step (ms, {stored['device']}, medians of 10)", *(s.upper() for s in sizes)]
    return table(head, rows, "l" + "r" * len(sizes))


def gpu_tests(root: Path) -> str:
    """The CUDA tests of the latest GPU check: how many passed of how many."""
    tests = json_of(root, "docs/data/gpu/tests.json")
    return f"{tests['passed']} of {tests['tests']}"


def gpu_train(root: Path) -> str:
    """124M training in the latest GPU check: torch AdamW's eager step, and Spectra-AdamW's
    tokens/s against it, eager and compiled."""
    train = json_of(root, "docs/data/gpu/train.json")
    runs = {(r["optimizer"], r["compile"]): r for r in train["runs"]}
    tokens = train["batch_size"] * 512
    eager_ms = 1e3 * tokens / runs["torch-adamw", False]["tokens_per_s"]
    ratio = {c: runs["spectra-adamw", c]["tokens_per_s_vs_torch_adamw"] for c in (False, True)}
    return (f"At {tokens:,} tokens per step a 124M step takes about {eager_ms:.0f} ms under torch "
            f"AdamW (eager); Spectra-AdamW runs at {ratio[False]:.2f}× torch AdamW's tokens/s "
            f"eager and {ratio[True]:.2f}× compiled")  # fmt: skip


def gpu_h100(root: Path) -> str:
    """The latest stored H100 run: the 124M optimizer step against the paper's bf16 wrapper
    (plain and with TF32), ``mixed``'s, and 124M training against torch AdamW."""
    folder = latest_gpu(root, "H100")
    parts = json.loads((folder / "gpu_check.json").read_text())["parts"]
    plain, tf32 = (parts[p]["vs_paper_bf16"] for p in ("bench_optim", "bench_optim_tf32"))
    runs = json.loads((folder / "train.json").read_text())["runs"]
    ratio = {r["compile"]: r["tokens_per_s_vs_torch_adamw"] for r in runs
             if r["optimizer"] == "spectra-adamw"}  # fmt: skip
    return (f"the 124M step at {plain['spectra-adamw']:.2f}× the paper's bf16 wrapper "
            f"({tf32['spectra-adamw']:.2f}× with TF32), the earlier `mixed` at "
            f"{plain['spectra-adamw-mixed']:.2f}× ({tf32['spectra-adamw-mixed']:.2f}×); 124M "
            f"training at {ratio[False]:.2f}× torch AdamW's tokens/s eager, {ratio[True]:.2f}× "
            "compiled")  # fmt: skip


def gpu_after_ops_modules(root: Path) -> str:
    """The 124M step on the H200 after the operators' restructure (``bench optim``)."""
    from spectra_lab.bench.optim import format_table

    stored = json_of(root, "docs/data/gpu/bench_optim_after_ops_modules.json")
    return "\n".join(format_table(stored).splitlines()[3:])
