"""Blocks rendered from the stored GPU runs under ``docs/data/gpu/`` (``make gpu-check``) and the
trainer's GPU peaks."""

from __future__ import annotations

import json
from pathlib import Path

from spectra_lab.blocks.common import json_of, latest_gpu, polar_and_mixed, sci, table


def gpu_runs(root: Path) -> str:
    from spectra_lab.gpucheck.runs import runs_table

    return runs_table(root / "docs" / "data" / "gpu")


def gpu_summary(root: Path) -> str:
    """The summary of the latest stored GPU check (``make gpu-check``)."""
    from spectra_lab.gpucheck.summary import markdown_summary

    return markdown_summary(root / "docs" / "data" / "gpu").rstrip()


def gpu_ops(root: Path) -> str:
    """``auto`` against the paper's bf16 run on the latest H200 and H100 runs of ``make
    gpu-check`` (median over the cells, plain and with TF32) and its worst float32 error."""
    from spectra_lab.gpucheck.summary import ops_figures

    h200, h100 = (latest_gpu(root, g, "bench_ops_tf32.json") for g in ("H200", "H100"))
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
    runs = {(r["optimizer"], r["compile"]): r for r in train["runs"] if not r.get("capturable")}
    tokens = train["batch_size"] * 512
    eager_ms = 1e3 * tokens / runs["torch-adamw", False]["tokens_per_s"]
    ratio = {c: runs["spectra-adamw", c]["tokens_per_s_vs_torch_adamw"] for c in (False, True)}
    return (f"At {tokens:,} tokens per step a 124M step takes about {eager_ms:.0f} ms under torch "
            f"AdamW (eager); Spectra-AdamW runs at {ratio[False]:.2f}× torch AdamW's tokens/s "
            f"eager and {ratio[True]:.2f}× compiled")  # fmt: skip


def gpu_h100(root: Path) -> str:
    """The latest stored H100 run: the 124M optimizer step against the paper's bf16 wrapper
    (plain and with TF32), ``mixed``'s, and 124M training against torch AdamW."""
    folder = latest_gpu(root, "H100", "train.json")
    parts = json.loads((folder / "gpu_check.json").read_text())["parts"]
    plain, tf32 = (parts[p]["vs_paper_bf16"] for p in ("bench_optim", "bench_optim_tf32"))
    runs = json.loads((folder / "train.json").read_text())["runs"]
    ratio = {r["compile"]: r["tokens_per_s_vs_torch_adamw"] for r in runs
             if r["optimizer"] == "spectra-adamw" and not r.get("capturable")}  # fmt: skip
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


def _gpu_runs(root: Path, gpu: str) -> list[tuple[str, dict]]:
    """``(date, parts)`` of every stored run of ``gpu`` (``"H100"``), oldest first (the index's
    own parts only: a targeted rerun's kept parts belong to the run that measured them)."""
    listed = json_of(root, "docs/data/gpu/runs.json")["runs"]
    out = []
    for run in sorted((r for r in listed if gpu in r["gpu"]), key=lambda r: r["date"]):
        index = json.loads((root / "docs/data/gpu" / run["folder"] / "gpu_check.json").read_text())
        own = {k: v for k, v in index["parts"].items() if "measured" not in v}
        out.append((index["date"], own))
    return out


def gpu_bars(root: Path, gpu: str = "H100") -> str:
    """The GPU step's figures against the bars it is held to, from the latest runs of ``gpu``:
    the 124M step over torch AdamW's, the 780M step over torch Muon's (and ``mixed``'s
    bf16-first step where a run timed it), the 124M step's peak memory, compiled 124M training,
    and the overhead at the paper's tokens per GPU step (:func:`polar_and_mixed`); training
    runs that a later failure stopped still count. ``spectra-adamw`` in training is the
    default clip of the run's commit."""
    runs = _gpu_runs(root, gpu)

    def last(part: str, key: str) -> tuple[str, dict]:
        date, parts = next((d, p) for d, p in reversed(runs) if key in p.get(part, {}))
        return date, parts[part]

    def clips(figures: dict[str, float]) -> tuple[float, ...]:
        bf16 = figures.get("spectra-adamw-mixed-bf16")
        return (*polar_and_mixed(figures), *(() if bf16 is None else (bf16,)))

    d124, small = last("bench_optim", "vs_torch_adamw")
    d780, big = last("bench_optim_780m", "vs_torch_muon")
    dtrain, train = last("train", "runs")
    compiled = {r["optimizer"]: r["tokens_per_s"] for r in train["runs"] if r["compile"]
                and not r.get("capturable") and "error" not in r}  # fmt: skip
    overheads = []
    for date, parts in runs:
        over = {(r["optimizer"], r["capturable"]): r["step_ms"]
                for r in parts.get("overhead", {}).get("runs", []) if "error" not in r}  # fmt: skip
        if ("torch-adamw", False) in over and ("spectra-adamw", False) in over:
            ratio = over[("spectra-adamw", False)] / over[("torch-adamw", False)] - 1.0
            overheads.append(f"{100 * ratio:+.1f}% ({date[11:16]})")

    def row(what: str, date: str, values: tuple[float, ...], default: float, bar: str, ok,
            digits: int = 2) -> list[str]:  # fmt: skip
        # the bar holds the step by default: its met column judges the run's default clip
        text = " / ".join(f"{v:.{digits}f}×" for v in values)
        return [what, date[:16], text, bar, "yes" if ok(default) else "no"]

    def by_clip(what: str, date: str, figures: dict[str, float], bar: str, ok, digits=2):
        return row(what, date, clips(figures), figures["spectra-adamw"], bar, ok, digits)

    bf16 = " / `mixed` bf16-first" if "spectra-adamw-mixed-bf16" in small["vs_torch_adamw"] else ""
    named = f"`polar` / `mixed`{bf16}"
    speed = compiled["spectra-adamw"] / compiled["torch-adamw"]
    rows = [
        by_clip(f"124M step ÷ torch AdamW (foreach), {named}", d124,
                small["vs_torch_adamw"], "≤ 3×", lambda v: v <= 3.0),
        by_clip(f"780M step ÷ `torch.optim.Muon`, {named}", d780,
                big["vs_torch_muon"], "≤ 1.5× (goal ≤ 1.0×)", lambda v: v <= 1.5),
        by_clip(f"124M step's peak memory ÷ torch AdamW's, {named}", d124,
                small["peak_vs_torch_adamw"], "≤ 1.10×", lambda v: v <= 1.10, 3),
        row("compiled 124M training at 16×512 tokens, tokens/s ÷ torch AdamW (default clip)",
            dtrain, (speed,), speed, "≥ 0.7×", lambda v: v >= 0.7),
    ]  # fmt: skip
    rows.append(["overhead at the paper's tokens per GPU step (16×512 × 4 accumulation "
                 "steps, compiled, default clip), per run", runs[-1][0][:10], ", ".join(overheads),
                 "the paper's table below", "–"])  # fmt: skip
    return table([f"measure (NVIDIA {gpu})", "run (UTC)", "figure", "bar",
                  "met by the default clip"], rows, "llrll")  # fmt: skip


def gpu_bars_h200(root: Path) -> str:
    """:func:`gpu_bars` from the latest H200 runs."""
    return gpu_bars(root, "H200")


def gpu_peak_after_free(root: Path) -> str:
    """The 124M step's peak over torch AdamW's on the H200 after ``mixed``'s coupled steps free
    what they no longer need (``bench_optim_peak_after_free.json``)."""
    stored = json_of(root, "docs/data/gpu/bench_optim_peak_after_free.json")
    peak = {r["method"]: r["peak_ratio"] for r in stored["rows"]}
    return (f"the default step {peak['spectra-adamw']:.3f}×, the capturable step "
            f"{peak['spectra-adamw-capturable']:.3f}× and `polar` "
            f"{peak['spectra-adamw-polar']:.3f}× torch AdamW's peak")  # fmt: skip


def gpu_memory_model(root: Path) -> str:
    """The CPU's model of the GPU step's peak over torch AdamW's at the 124M shapes
    (``experiments/gpu_step_memory_model.py``)."""
    rows = json_of(root, "docs/data/gpu_step_memory_model.json")["rows"]
    return ", ".join(f"`{r['row']}` {r['peak_vs_torch_adamw']:.2f}×" for r in rows)


def gpu_memory_model_780m(root: Path) -> str:
    """The same model at eight layers of the 780M shapes, where CUDA's ``mixed`` takes split
    bf16 products (``experiments/gpu_step_memory_model.py --large``)."""
    rows = json_of(root, "docs/data/gpu_step_memory_model_780m.json")["rows"]
    return ", ".join(f"`{r['row']}` {r['peak_vs_torch_adamw']:.3f}×" for r in rows)


def gpu_host_ops(root: Path) -> str:
    """The operations one step dispatches on the CUDA code path at the 124M shapes, counted on
    the CPU (``experiments/gpu_step_host_ops.py``)."""
    return _host_ops_table(root, "docs/data/gpu_step_host_ops.json", "124M shapes")


def gpu_host_ops_780m(root: Path) -> str:
    """The same at eight layers of the 780M shapes (``gpu_step_host_ops.py --large``)."""
    return _host_ops_table(root, "docs/data/gpu_step_host_ops_780m.json", "780M shapes, 8 layers")


def _host_ops_table(root: Path, path: str, shapes: str) -> str:
    stored = json_of(root, path)
    rows = [[f"`{r['row']}`", str(r["operations"]), str(r["compute"]), str(r["view"]),
             str(r["read"])] for r in stored["rows"]]  # fmt: skip
    return table([f"step ({shapes})", "operations", "compute (launches)", "views", "reads"],
                 rows, "lrrrr")  # fmt: skip
