"""``spectra bench optim``: optimizer-step time and peak memory of SPECTRA vs torch AdamW.

Compared, on the parameter shapes of a Llama-style model (default: the paper's 124M model,
12 layers, d = 768, SwiGLU hidden 2048, untied 50304-token vocabulary):

* ``torch-adamw``: ``torch.optim.AdamW(foreach=True)``, the baseline;
* ``spectra-adamw``: ``spectra.AdamW(clip_c=10)`` (the native, chunked and batched step);
* ``spectra-wrap``: ``spectra.Spectra(torch.optim.AdamW(...), clip_c=10)``;
* ``spectra-noclip`` (only on request): ``spectra.AdamW(clip_c=None)``;
* ``paper-wrap-bf16``, ``paper-wrap-fp32``: the clone-and-subtract wrapper of the paper's
  code, reimplemented: clone every matrix, call the base step, recover
  ``U = (X_k − X_{k+1})/η − λX_k`` and loop over the matrices calling
  ``spectra.ops.soft_clip_paper`` with N_s = 10, in bfloat16 (the paper code's default) or
  float32.

By default ``paper-wrap-bf16`` runs only where bfloat16 products are fast: where a measured
bf16 matrix product runs at less than half the float32 rate, it is skipped with a line that
says so; ``--methods`` forces it. On CPUs without bf16 units the operators emulate bf16
products through float32 (:func:`spectra.ops._common.bf16_matmul`), so there the bf16 run
costs about what the float32 run does.

Time: median wall time of ``step()`` over ``--repeats`` steps after ``--warmup`` steps (the
gradients are fixed random tensors; CUDA is synchronised around each step).

Memory: the peak of a steady-state step (after the state exists). On CUDA it is
``torch.cuda.max_memory_allocated`` during the step. On CPU it is measured with the PyTorch
profiler's memory events (``profile_memory=True``): every allocation and free made through
PyTorch's CPU allocator during the step, summed in time order; the maximum of that running
sum is the step's transient peak, and the total peak is that plus the bytes alive before the
step (parameters, gradients and optimizer state). ``tracemalloc`` would not see tensor memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

import spectra.optim as so
from spectra.ops import soft_clip_paper
from spectra.validate import check_int
from spectra_lab.cli import CLIError
from spectra_lab.files import atomic_write

METHODS = ("torch-adamw", "spectra-adamw", "spectra-wrap", "paper-wrap-bf16", "paper-wrap-fp32")
#: Extra method: the native step without the clip, to separate the step's own cost from the
#: operator's.
EXTRA_METHODS = ("spectra-noclip",)


# --------------------------------------------------------------------------- shapes


def llama_shapes(
    layers: int = 12, dim: int = 768, hidden: int = 2048, vocab: int = 50304
) -> list[tuple[int, ...]]:
    """Parameter shapes of a Llama-style model with untied embeddings and SwiGLU MLPs."""
    shapes: list[tuple[int, ...]] = [(vocab, dim)]
    for _ in range(layers):
        shapes += [(dim, dim)] * 4  # q, k, v, o
        shapes += [(hidden, dim), (hidden, dim), (dim, hidden)]  # w1, w3, w2
        shapes += [(dim,), (dim,)]  # the two RMSNorm weights
    shapes += [(dim,), (vocab, dim)]  # final norm, untied output head
    return shapes


# --------------------------------------------------------------------------- baseline


class PaperWrapper:
    """The paper code's SPECTRA wrapper (clone-and-subtract), reimplemented for comparison.

    Clones every matrix with a gradient, lets the base optimizer step, recovers the base
    direction from the weight difference, and recomputes each matrix with Algorithm 1
    (``soft_clip_paper``, N_s Newton–Schulz steps), one matrix at a time.
    """

    def __init__(
        self,
        base: torch.optim.Optimizer,
        clip_c: float,
        ns_steps: int = 10,
        dtype: torch.dtype = torch.bfloat16,
    ):
        self.base, self.clip_c, self.ns_steps, self.dtype = base, clip_c, ns_steps, dtype

    @torch.no_grad()
    def step(self) -> None:
        saved = []
        for group in self.base.param_groups:
            for p in group["params"]:
                if p.grad is not None and p.dim() == 2:
                    saved.append((p, group, p.detach().clone()))
        self.base.step()
        for p, group, x in saved:
            lr, wd = float(group["lr"]), float(group["weight_decay"])
            U = (x - p) / lr - wd * x
            Y = soft_clip_paper(U, self.clip_c, ns_steps=self.ns_steps, dtype=self.dtype)
            alpha = max(1.0, p.shape[0] / p.shape[1]) ** 0.5
            p.copy_((1 - wd * lr) * x - lr * alpha * Y)


# --------------------------------------------------------------------------- measurement


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def live_bytes(tensors: list[Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def optimizer_tensors(params: list[Tensor], opt: Any) -> list[Tensor]:
    """Parameters, gradients and every tensor in the optimizer state (base state included)."""
    out = list(params) + [p.grad for p in params if p.grad is not None]
    states = [opt.state] if isinstance(opt, torch.optim.Optimizer) else []
    base = getattr(opt, "base", None)
    if base is not None:
        states.append(base.state)
    for st in states:
        for s in st.values():
            out += [v for v in s.values() if isinstance(v, Tensor) and v.numel() > 0]
    return out


def cpu_step_peak_bytes(step: Callable[[], Any]) -> int:
    """Peak of the running sum of CPU allocator traffic during ``step()`` (profiler events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return peak


def step_peak_bytes(step: Callable[[], Any], device: torch.device) -> int:
    """Transient peak bytes of one ``step()`` above what was allocated before it."""
    if device.type == "cuda":
        _sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        _sync(device)
        return torch.cuda.max_memory_allocated(device) - before
    return cpu_step_peak_bytes(step)


def make_optimizer(method: str, params: list[Tensor], lr: float, clip_c: float) -> Any:
    kw = {"lr": lr, "betas": (0.9, 0.999), "weight_decay": 0.1}
    if method == "torch-adamw":
        return torch.optim.AdamW(params, foreach=True, **kw)
    if method == "spectra-adamw":
        return so.AdamW(params, clip_c=clip_c, **kw)
    if method == "spectra-noclip":
        return so.AdamW(params, clip_c=None, **kw)
    if method == "spectra-wrap":
        return so.Spectra(torch.optim.AdamW(params, foreach=True, **kw), clip_c=clip_c)
    if method in ("paper-wrap-bf16", "paper-wrap-fp32"):
        dtype = torch.bfloat16 if method.endswith("bf16") else torch.float32
        return PaperWrapper(torch.optim.AdamW(params, foreach=True, **kw), clip_c, dtype=dtype)
    raise ValueError(f"unknown method {method!r}; expected one of {METHODS + EXTRA_METHODS}")


def bench_method(
    method: str,
    shapes: list[tuple[int, ...]],
    *,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int,
    warmup: int,
    clip_c: float,
    seed: int = 0,
    measure_memory: bool = True,
) -> dict[str, Any]:
    """Time and memory of ``method``'s optimizer step on fresh parameters of ``shapes``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    params = [
        (0.02 * torch.randn(s, generator=g)).to(device=device, dtype=dtype).requires_grad_()
        for s in shapes
    ]
    for p in params:
        p.grad = (0.01 * torch.randn(p.shape, generator=g)).to(device=device, dtype=dtype)
    opt = make_optimizer(method, params, 1e-3, clip_c)
    for _ in range(warmup):
        opt.step()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    result: dict[str, Any] = {"method": method, "step_s": statistics.median(times)}
    if measure_memory:
        resident = live_bytes(optimizer_tensors(params, opt))
        transient = step_peak_bytes(opt.step, device)
        result.update(
            resident_bytes=resident, transient_bytes=transient, peak_bytes=resident + transient
        )
    del opt, params
    return result


def run_benchmark(
    shapes: list[tuple[int, ...]],
    methods: tuple[str, ...] = METHODS,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    repeats: int = 3,
    warmup: int = 1,
    clip_c: float = 10.0,
    measure_memory: bool = True,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every method on ``shapes``; ratios are relative to ``torch-adamw`` when present."""
    device = torch.device(device)
    rows = []
    for m in methods:
        row = bench_method(
            m,
            shapes,
            device=device,
            dtype=dtype,
            repeats=repeats,
            warmup=warmup,
            clip_c=clip_c,
            measure_memory=measure_memory,
        )
        if progress is not None:
            progress(row)
        rows.append(row)
    by_name = {r["method"]: r for r in rows}
    base = by_name.get("torch-adamw")
    for r in rows:
        if base is not None:
            r["time_ratio"] = r["step_s"] / base["step_s"]
            if measure_memory:
                r["peak_ratio"] = r["peak_bytes"] / base["peak_bytes"]
        for paper in ("paper-wrap-bf16", "paper-wrap-fp32"):
            if paper in by_name:
                r[f"vs_{paper.removeprefix('paper-wrap-')}"] = (
                    r["step_s"] / by_name[paper]["step_s"]
                )
    return {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "num_params": sum(int(torch.Size(s).numel()) for s in shapes),
        "num_tensors": len(shapes),
        "repeats": repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }


def format_table(report: dict[str, Any]) -> str:
    mib = 1 << 20
    nan = float("nan")
    lines = [
        f"device {report['device']}, {report['dtype']}, {report['num_params'] / 1e6:.1f}M "
        f"parameters in {report['num_tensors']} tensors, median of {report['repeats']} steps, "
        f"{report['threads']} threads, torch {report['torch']}",
        f"{'method':<17}{'step (s)':>10}{'x torch':>9}{'x paper bf16':>14}{'x paper fp32':>14}"
        f"{'peak MiB':>10}{'x torch':>9}{'transient MiB':>15}",
    ]
    for r in report["rows"]:
        line = (
            f"{r['method']:<17}{r['step_s']:>10.3f}{r.get('time_ratio', nan):>9.2f}"
            f"{r.get('vs_bf16', nan):>14.3f}{r.get('vs_fp32', nan):>14.3f}"
        )
        if "peak_bytes" in r:
            line += (
                f"{r['peak_bytes'] / mib:>10.0f}{r.get('peak_ratio', nan):>9.3f}"
                f"{r['transient_bytes'] / mib:>15.0f}"
            )
        lines.append(line)
    for note in report.get("notes", []):
        lines.append(note)
    return "\n".join(lines)


def bf16_is_slow(device: torch.device) -> tuple[bool, float, float]:
    """Whether a bf16 matrix product runs at under half the float32 rate on ``device``.

    Returns ``(slow, bf16 GFLOP/s, fp32 GFLOP/s)`` measured on 256-cubed products.
    """
    from spectra_lab.bench.ops import matmul_rate

    bf16 = matmul_rate(torch.bfloat16, device) / 1e9
    fp32 = matmul_rate(torch.float32, device) / 1e9
    return bf16 < 0.5 * fp32, bf16, fp32


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", type=int, default=12, help="transformer layers (12)")
    parser.add_argument("--dim", type=int, default=768, help="model width (768)")
    parser.add_argument("--hidden", type=int, default=2048, help="SwiGLU hidden size (2048)")
    parser.add_argument("--vocab", type=int, default=50304, help="vocabulary size (50304)")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=METHODS + EXTRA_METHODS,
        default=None,
        help="default: all but spectra-noclip (paper-wrap-bf16 only where bf16 is fast)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per method")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--clip-c", type=float, default=10.0, help="post-clipping threshold")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument("--json", default=None, help="also write the results to this file")


def _write_json(path: str, data: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(data, indent=2))


def run(args: argparse.Namespace) -> int:
    try:
        for name in ("layers", "dim", "hidden", "vocab", "repeats"):
            check_int(f"--{name}", getattr(args, name), low=1)
        check_int("--threads", args.threads, low=1, none_ok=True)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = llama_shapes(args.layers, args.dim, args.hidden, args.vocab)
    methods = tuple(args.methods or METHODS)
    notes = []
    if args.methods is None:
        slow, bf16, fp32 = bf16_is_slow(torch.device(args.device))
        if slow:
            methods = tuple(m for m in methods if m != "paper-wrap-bf16")
            notes.append(
                f"paper-wrap-bf16 skipped: a bf16 matrix product runs at {bf16:.0f} GFLOP/s on "
                f"{args.device} against {fp32:.0f} in float32 (no bf16 units); "
                "--methods paper-wrap-bf16 runs it anyway"
            )
    report = run_benchmark(
        shapes,
        methods,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        repeats=args.repeats,
        warmup=args.warmup,
        clip_c=args.clip_c,
        measure_memory=not args.no_memory,
        progress=lambda row: print(f"  done: {row}", file=sys.stderr, flush=True),
    )
    report["notes"] = notes
    print(format_table(report), flush=True)
    if args.json:
        _write_json(args.json, report)
    return 0
