"""``spectra bench optim``: optimizer-step time and peak memory of SPECTRA vs torch AdamW.

Compared, on the parameter shapes of a Llama-style model (default: the paper's 124M model,
12 layers, d = 768, SwiGLU hidden 2048, untied 50304-token vocabulary):

* ``torch-adamw``: ``torch.optim.AdamW(foreach=True)``, the baseline;
* ``torch-adamw-loop``: ``torch.optim.AdamW(foreach=False)``, torch's default on the CPU (one
  parameter at a time: no parameter-sized transient);
* ``spectra-adamw``: ``spectra.AdamW(clip_c=10)`` (every direction formed before any weight
  moves: one parameter-sized transient, like torch's foreach AdamW);
* ``spectra-adamw-chunked``: the same with ``chunk_elements`` = max(largest parameter,
  total / 8), the step run an eighth of the parameters at a time;
* ``spectra-wrap``: ``spectra.Spectra(torch.optim.AdamW(...), clip_c=10)``;
* ``torch-adamw-fused``: ``torch.optim.AdamW(fused=True)`` (one fused kernel per dtype and
  device; where torch has none for the device it is skipped with a line that says so);
* ``torch-muon``: ``torch.optim.Muon`` (5 Newton–Schulz steps in bf16) on the hidden matrices
  (2-D, both sides under ``spectra.optim.baselines.dmuon.MUON_MAX_DIM``) and
  ``torch.optim.AdamW`` on the rest, as torch's docs set the two up (their example's
  ``lr=0.02, momentum=0.95`` and ``lr=3e-4, weight_decay=0.01``; ``adjust_lr_fn`` left at its
  default, ``"original"``);
* ``spectra-dmuon``: ``spectra.DMuon`` (Muon with AdamW's update RMS on the hidden matrices,
  AdamW on the rest, the SPECTRA paper's D-Muon baseline);
* ``spectra-noclip`` (only on request): ``spectra.AdamW(clip_c=None)``;
* ``spectra-adamw-eigh``, ``-polar``, ``-mixed`` (only on request): ``spectra-adamw`` with
  that ``clip_method``; ``-polar-bf16``, ``-mixed-bf16``: with ``clip_ns_dtype="bfloat16"``
  too (bf16 first: split bf16 products for the float32 ones);
* ``spectra-adamw-capturable``, ``-compiled``, ``-graph`` (only on request): the step that
  reads nothing on the host, eager, compiled whole, and captured in a CUDA graph (CUDA only;
  elsewhere skipped with a line that says so); ``-capturable-bf16``, ``-graph-bf16``: the
  first and the last with ``clip_ns_dtype="bfloat16"`` (split bf16 products of three parts),
  ``-capturable-bf16-r100``, ``-graph-bf16-r100`` with ``clip_ratio_bound=100`` too:
  :mod:`spectra_lab.bench.capturable`;
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
gradients are fixed random tensors; CUDA is synchronised around each step). Every row runs in
the same process on the same shapes; each row's time is also given as a multiple of
``torch-adamw``'s and, where ``torch-muon`` ran, of ``torch-muon``'s.

``--profile PATH`` also writes ``torch.profiler``'s table of one more step of the first
method (the 30 operators or kernels that took the most time: CUDA time on CUDA).

Memory: the peak of a steady-state step (after the state exists), on the path that runs. On
CUDA it is ``torch.cuda.max_memory_allocated`` during the step. On the CPU each method runs
again in a fresh Python process (:func:`rss_peak`), with the same threads as the timed run:
after the warm-up steps (parameters, gradients and state alive) the kernel's high-water mark
of the resident set is reset (``/proc/self/clear_refs``), one step runs, and the growth of the
high-water mark (``VmHWM``) over the resident set before the step (``VmRSS``) is the step's
transient, every thread's temporaries included. The peak is that transient plus the bytes of
the parameters, gradients and state (their storages, counted exactly: the resident set also
holds the interpreter and the code pages of whatever libraries a method loaded; the child's
whole resident set before the step is reported too). The child's ``ru_maxrss`` is not used:
on Linux it carries over, through ``fork`` and ``exec``, the resident set of the process that
started it. The child runs with ``MALLOC_MMAP_THRESHOLD_=131072`` (unless set), so that glibc
returns freed blocks of 128 KiB or more to the kernel at once and the resident set follows
the live tensors of every thread, not the free lists of per-thread malloc arenas. Where
``clear_refs`` is not writable (not Linux) the CPU step's memory is not measured (``nan``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import spectra.optim as so
from spectra.ops import soft_clip_paper
from spectra.optim.wrapper import eighth_chunks
from spectra.validate import check_int
from spectra_lab.bench.capturable import (
    CAPTURABLE_METHODS,
    GRAPH_METHODS,
    graph_note,
    make_capturable,
)
from spectra_lab.bench.optim_report import format_table
from spectra_lab.bench.peers import MuonWithAdamW, fused_adamw_note
from spectra_lab.bench.precision import add_tf32_argument, apply_tf32
from spectra_lab.errors import CLIError
from spectra_lab.files import atomic_write
from spectra_lab.machine import device_about

METHODS = (
    "torch-adamw",
    "torch-adamw-loop",
    "torch-adamw-fused",
    "torch-muon",
    "spectra-dmuon",
    "spectra-adamw",
    "spectra-adamw-chunked",
    "spectra-wrap",
    "paper-wrap-bf16",
    "paper-wrap-fp32",
)
#: Extra methods: the native step without the clip, to separate the step's own cost from the
#: operator's; and spectra-adamw with each soft-clip method forced (``clip_method``).
EXTRA_METHODS = (
    "spectra-noclip",
    "spectra-adamw-eigh",
    "spectra-adamw-polar",
    "spectra-adamw-mixed",
    "spectra-adamw-polar-bf16",
    "spectra-adamw-mixed-bf16",
    "spectra-adamw-mixed-fp32",
    *CAPTURABLE_METHODS,
)
#: How the peak memory is measured, as the report states it.
CUDA_MEMORY = "torch.cuda.max_memory_allocated during a step"
CPU_MEMORY = (
    "storages of parameters, gradients and state + the step's growth of the resident set in a "
    "fresh process, all threads (VmHWM after clear_refs, MALLOC_MMAP_THRESHOLD_=131072)"
)


# --------------------------------------------------------------------------- shapes


def square_shapes(count: int, size: int) -> list[tuple[int, ...]]:
    """``count`` matrices of ``size × size``."""
    return [(size, size)] * count


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


@dataclass(frozen=True)
class BenchSettings:
    """What every method of one benchmark runs on: the parameter ``shapes``, the ``device``
    and ``dtype``, the timed steps (``repeats``, their median reported) after ``warmup``
    untimed ones, the threshold ``clip_c``, the ``seed`` of the parameters and gradients, and
    whether the step's memory is measured (``measure_memory``)."""

    shapes: Sequence[tuple[int, ...]]
    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.float32
    repeats: int = 3
    warmup: int = 1
    clip_c: float = 10.0
    seed: int = 0
    measure_memory: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "shapes", tuple(tuple(s) for s in self.shapes))
        object.__setattr__(self, "device", torch.device(self.device))


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
    states += [o.state for o in getattr(opt, "optimizers", ())]
    for st in states:
        for s in st.values():
            out += [v for v in s.values() if isinstance(v, Tensor) and v.numel() > 0]
    return out


def _status_kib(field: str) -> int:
    """A ``VmRSS``/``VmHWM``-style field of ``/proc/self/status``, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Reset the kernel's high-water mark of the resident set; ``False`` where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _memory_child() -> None:
    """Body of :func:`rss_peak`'s fresh process: reads its spec from stdin, prints JSON."""
    spec = json.loads(sys.stdin.read())
    torch.set_num_threads(spec["threads"])
    settings = BenchSettings(spec["shapes"], dtype=getattr(torch, spec["dtype"]),
                             warmup=spec["warmup"], clip_c=spec["clip_c"],
                             seed=spec["seed"])  # fmt: skip
    params, opt = _setup(spec["method"], settings)
    for _ in range(max(1, settings.warmup)):
        opt.step()
    out: dict[str, Any] = {"resident": live_bytes(optimizer_tensors(params, opt))}
    if _reset_peak():
        before = _status_kib("VmRSS")
        opt.step()
        out.update(transient=(_status_kib("VmHWM") - before) << 10, rss=before << 10)
    else:
        out.update(transient=None, rss=None)
    print(json.dumps(out))


def rss_peak(method: str, settings: BenchSettings, threads: int | None = None) -> dict[str, Any]:
    """The CPU step's memory on the path that runs, in a fresh process (module docstring),
    on ``settings``' shapes, dtype, threshold, seed and warm-up steps (its device is not read).

    Returns ``resident_bytes`` (the storages of the parameters, gradients and state, counted
    exactly), ``transient_bytes`` (the growth of the resident set during the step, every
    thread included), ``peak_bytes`` (their sum) and ``process_rss_bytes`` (the child's whole
    resident set before the step). Where the kernel's high-water mark cannot be reset (no
    Linux ``/proc/self/clear_refs``) the last three are ``None``.
    """
    import os
    import subprocess

    spec = {"method": method, "shapes": settings.shapes,
            "dtype": str(settings.dtype).removeprefix("torch."), "clip_c": settings.clip_c,
            "warmup": settings.warmup, "seed": settings.seed,
            "threads": threads or torch.get_num_threads()}  # fmt: skip
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_",
                                                                  "131072")}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", "from spectra_lab.bench.optim import _memory_child; "
         "_memory_child()"],
        input=json.dumps(spec), capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"memory measurement of {method} failed:\n{proc.stderr[-2000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    transient = r["transient"]
    return {
        "resident_bytes": r["resident"],
        "transient_bytes": transient,
        "peak_bytes": None if transient is None else r["resident"] + transient,
        "process_rss_bytes": r["rss"],
    }


def step_peak_bytes(step: Callable[[], Any], device: torch.device) -> int:
    """CUDA: peak bytes allocated during one ``step()`` above what was allocated before it."""
    _sync(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    _sync(device)
    return torch.cuda.max_memory_allocated(device) - before


def make_optimizer(method: str, params: list[Tensor], lr: float, clip_c: float) -> Any:
    kw = {"lr": lr, "betas": (0.9, 0.999), "weight_decay": 0.1}
    if method == "torch-adamw":
        return torch.optim.AdamW(params, foreach=True, **kw)
    if method == "torch-adamw-loop":
        return torch.optim.AdamW(params, foreach=False, **kw)
    if method == "torch-adamw-fused":
        return torch.optim.AdamW(params, fused=True, **kw)
    if method == "torch-muon":
        return MuonWithAdamW(params)
    if method == "spectra-dmuon":
        return so.DMuon(params, lr=lr, weight_decay=0.1)
    if method == "spectra-adamw":
        return so.AdamW(params, clip_c=clip_c, **kw)
    if method == "spectra-adamw-chunked":
        chunk = eighth_chunks([p.numel() for p in params])  # the wrapper's chunks
        return so.AdamW(params, clip_c=clip_c, chunk_elements=chunk, **kw)
    if method in CAPTURABLE_METHODS:
        return make_capturable(method, params, lr, clip_c, betas=(0.9, 0.999), weight_decay=0.1)
    if method.startswith("spectra-adamw-") and method != "spectra-adamw-chunked":
        # a clip_method; "-bf16": bf16-first products, "-fp32": float32 ones, whatever the size
        name, _, precision = method.removeprefix("spectra-adamw-").partition("-")
        ns = {"bf16": {"clip_ns_dtype": "bfloat16"}, "fp32": {"clip_ns_dtype": "float32"}}
        return so.AdamW(params, clip_c=clip_c, clip_method=name, **ns.get(precision, {}), **kw)
    if method == "spectra-noclip":
        return so.AdamW(params, clip_c=None, **kw)
    if method == "spectra-wrap":
        return so.Spectra(torch.optim.AdamW(params, foreach=True, **kw), clip_c=clip_c)
    if method in ("paper-wrap-bf16", "paper-wrap-fp32"):
        dtype = torch.bfloat16 if method.endswith("bf16") else torch.float32
        return PaperWrapper(torch.optim.AdamW(params, foreach=True, **kw), clip_c, dtype=dtype)
    raise ValueError(f"unknown method {method!r}; expected one of {METHODS + EXTRA_METHODS}")


def _setup(method: str, settings: BenchSettings) -> tuple[list[Tensor], Any]:
    """Fresh parameters of the settings' shapes with fixed random gradients, and ``method``'s
    optimizer."""
    # drawn on the device: at the 780M shapes drawing on the host and copying took longer than
    # the steps (the values differ between devices; a step's time does not depend on them)
    device, dtype = settings.device, settings.dtype
    g = torch.Generator(device=device).manual_seed(settings.seed)
    params = [
        (0.02 * torch.randn(s, generator=g, device=device)).to(dtype).requires_grad_()
        for s in settings.shapes
    ]
    for p in params:
        p.grad = (0.01 * torch.randn(p.shape, generator=g, device=device)).to(dtype)
    return params, make_optimizer(method, params, 1e-3, settings.clip_c)


def bench_method(method: str, settings: BenchSettings) -> dict[str, Any]:
    """Time and memory of ``method``'s optimizer step on fresh parameters of the settings'
    shapes."""
    params, opt = _setup(method, settings)
    device, measure_memory = settings.device, settings.measure_memory
    for _ in range(settings.warmup):
        opt.step()
    times = []
    for _ in range(settings.repeats):
        _sync(device)
        t0 = time.perf_counter()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    result: dict[str, Any] = {"method": method, "step_s": statistics.median(times)}
    if measure_memory and device.type == "cuda":
        resident = torch.cuda.memory_allocated(device)
        transient = step_peak_bytes(opt.step, device)
        result.update(resident_bytes=resident, transient_bytes=transient,
                      peak_bytes=resident + transient)  # fmt: skip
    del opt, params
    if measure_memory and device.type == "cpu":
        result.update(rss_peak(method, settings))
    return result


def run_benchmark(
    settings: BenchSettings,
    methods: tuple[str, ...] = METHODS,
    *,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every method on ``settings``; ratios are relative to ``torch-adamw`` when present.

    A method whose step raises is a row with its ``error`` (the exception's first line) and no
    figures, and the others still run: one row that fails to compile (say) leaves the rest
    measured."""
    device, shapes, measure_memory = settings.device, settings.shapes, settings.measure_memory
    rows = []
    for m in methods:
        try:
            row = bench_method(m, settings)
        except Exception as exc:  # reported in its row; the others go on
            first = (str(exc).strip().splitlines() or [""])[0]
            row = {"method": m, "step_s": None, "error": f"{type(exc).__name__}: {first}"}
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if progress is not None:
            progress(row)
        rows.append(row)
    measured = [r for r in rows if r["step_s"] is not None]
    by_name = {r["method"]: r for r in measured}
    base, muon = by_name.get("torch-adamw"), by_name.get("torch-muon")
    for r in measured:
        if muon is not None:
            r["vs_muon"] = r["step_s"] / muon["step_s"]
        if base is not None:
            r["time_ratio"] = r["step_s"] / base["step_s"]
            if measure_memory and r["peak_bytes"] and base["peak_bytes"]:
                r["peak_ratio"] = r["peak_bytes"] / base["peak_bytes"]
        for paper in ("paper-wrap-bf16", "paper-wrap-fp32"):
            if paper in by_name:
                r[f"vs_{paper.removeprefix('paper-wrap-')}"] = (
                    r["step_s"] / by_name[paper]["step_s"]
                )
    return {
        "device": str(device),
        "dtype": str(settings.dtype).removeprefix("torch."),
        "num_params": sum(int(torch.Size(s).numel()) for s in shapes),
        "num_tensors": len(shapes),
        "repeats": settings.repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "memory": CUDA_MEMORY if device.type == "cuda" else CPU_MEMORY,
        "rows": rows,
    }


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
        "--matrices",
        type=int,
        nargs=2,
        metavar=("COUNT", "SIZE"),
        default=None,
        help="COUNT square SIZE x SIZE matrices instead of the Llama shapes",
    )
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
    parser.add_argument(
        "--profile",
        default=None,
        metavar="PATH",
        help="also write torch.profiler's top 30 of one step of the first method here",
    )
    add_tf32_argument(parser)


def _write_json(path: str, data: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(data, indent=2))


def run(args: argparse.Namespace) -> int:
    try:
        for name in ("layers", "dim", "hidden", "vocab", "repeats"):
            check_int(f"--{name}", getattr(args, name), low=1)
        check_int("--threads", args.threads, low=1, none_ok=True)
        for name, value in zip(("COUNT", "SIZE"), args.matrices or (), strict=False):
            check_int(f"--matrices {name}", value, low=1)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    apply_tf32(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.matrices:
        shapes = square_shapes(*args.matrices)
    else:
        shapes = llama_shapes(args.layers, args.dim, args.hidden, args.vocab)
    methods = tuple(args.methods or METHODS)
    notes = []
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    rows = [(r, lambda r=r: graph_note(device, r)) for r in GRAPH_METHODS]
    for row, note in (*rows, ("torch-adamw-fused", lambda: fused_adamw_note(device, dtype))):
        why = note() if row in methods else None  # why the row cannot run here
        if why is not None:
            methods = tuple(m for m in methods if m != row)
            notes.append(why)
    if args.methods is None:
        slow, bf16, fp32 = bf16_is_slow(torch.device(args.device))
        if slow:
            methods = tuple(m for m in methods if m != "paper-wrap-bf16")
            notes.append(
                f"paper-wrap-bf16 skipped: a bf16 matrix product runs at {bf16:.0f} GFLOP/s on "
                f"{args.device} against {fp32:.0f} in float32 (no bf16 units); "
                "--methods paper-wrap-bf16 runs it anyway"
            )
    settings = BenchSettings(
        shapes,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        repeats=args.repeats,
        warmup=args.warmup,
        clip_c=args.clip_c,
        measure_memory=not args.no_memory,
    )
    report = run_benchmark(
        settings,
        methods,
        progress=lambda row: print(f"  done: {row}", file=sys.stderr, flush=True),
    )
    report["notes"] = notes
    report.update(device_about(args.device))
    print(format_table(report), flush=True)
    if args.json:
        _write_json(args.json, report)
    if args.profile:
        atomic_write(args.profile, profile_table(methods[0], settings))
    return 1 if any(r.get("error") for r in report["rows"]) else 0


def profile_table(method: str, settings: BenchSettings, rows: int = 30) -> str:
    """``torch.profiler``'s table of one step of ``method`` after ``settings.warmup`` untimed
    ones (at least one): the ``rows`` operators (CUDA: kernels) that took the most time."""
    _params, opt = _setup(method, settings)
    device = settings.device
    for _ in range(max(1, settings.warmup)):
        opt.step()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    _sync(device)
    with torch.profiler.profile(activities=activities) as prof:
        opt.step()
        _sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    head = (f"one {method} step, {len(settings.shapes)} tensors of "
            f"{sum(int(torch.Size(s).numel()) for s in settings.shapes) / 1e6:.1f}M parameters, "
            f"{settings.dtype}, {device}, torch {torch.__version__}, sorted by {key}")  # fmt: skip
    return head + "\n" + prof.key_averages().table(sort_by=key, row_limit=rows) + "\n"
