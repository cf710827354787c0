"""The main job's training step with each soft-clip method, against its unclipped twin, side by
side.

Builds the main job's model and optimizers as ``spectra train`` does (``spectra bench step``'s
``build``: preset ``cpu-small``, batch 16 × 256 tokens, clipped attention and MLP matrices),
one AdamW twin and one Spectra-AdamW per ``--methods`` entry (``clip_method``; ``auto`` is the
default; ``--optimizer spectra-signum`` or ``spectra-ademamix`` for another base and its
twin), and steps them in turn on the same random tokens (step k of each before step k + 1 of
any), so that a shared machine's drift reaches all alike. Prints, per row, the medians of the
whole step and of ``optimizer.step()`` and the step ratio to the twin, both from the totals and
by optimizer time (``1 + (t_opt − t_opt,twin)/t_step,twin``). ``--runs N`` repeats all of it N
times, each time with the models and optimizers built afresh: the rows then hold the medians
over every run's steps and each run's ratio by optimizer time, with their mean and standard
deviation (a shared machine drifts from minute to minute). The CPU's bf16 path is what
``SPECTRA_CPU_BF16_UNITS`` says (unset: the probe); run with ``SPECTRA_CPU_BF16_UNITS=0`` to
measure a CPU without bf16 units' path on one that has them::

    SPECTRA_CPU_BF16_UNITS=0 PYTHONPATH=src python experiments/clip_method_step.py \\
        --methods eigh/32 eigh mixed auto --steps 15 \\
        --json docs/data/main_job_clip_step_no_bf16.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import NamedTuple

import torch

from spectra_lab.bench.step import _Run, _step, base_of, build
from spectra_lab.files import write_json_atomic
from spectra_lab.machine import device_about

#: The environment variables that hold the libraries to an older instruction set, and the one
#: that picks the operators' bf16 path; the JSON records those set.
ISA_ENV = ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
           "SPECTRA_CPU_BF16_UNITS")  # fmt: skip


#: The SPECTRA optimizers this compares; each is stepped beside its unclipped twin (``base_of``).
OPTIMIZERS = ("spectra-adamw", "spectra-ademamix", "spectra-signum")


def make_run(label: str, optimizer: str, kwargs: dict, batch_size: int, steps: int) -> _Run:
    cfg, model, model_cfg, opt = build(
        optimizer, "cpu-small", batch_size=batch_size, steps=steps, seed=0,
        optimizer_kwargs=kwargs,
    )  # fmt: skip
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(0)
    return _Run(label, None, cfg, model, opt, params, gen, (batch_size, model_cfg.seq_len + 1))


def cpu_flags() -> list[str]:
    """The CPU's AVX-512 BF16, AMX and AVX2 flags (``/proc/cpuinfo``), as far as it has them."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])  # fmt: skip
    except OSError:
        return []
    return sorted(set(flags) & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})


class Timed(NamedTuple):
    """A row's step times (seconds) from one run of :func:`measure`."""

    name: str
    totals: list[float]
    opt_times: list[float]


def by_optimizer_time(run: Timed, twin: Timed) -> float:
    """``1 + (t_opt − t_opt,twin)/t_step,twin`` from the medians of one run's steps."""
    twin_total = statistics.median(twin.totals)
    return 1.0 + (statistics.median(run.opt_times) - statistics.median(twin.opt_times)) / twin_total


def measure(args: argparse.Namespace) -> list[Timed]:
    """The twin and one row per ``--methods`` entry, built afresh and stepped in turn; only
    their times outlive the call."""
    total = args.warmup + args.steps
    twin = base_of(args.optimizer)
    runs = [make_run(twin, twin, {}, args.batch_size, total)]
    clipped = sum(p.numel() for g in runs[0].optimizer.param_groups if g["group"] in
                  ("attn", "hidden") for p in g["params"])  # fmt: skip
    for m in args.methods:
        method, _, old = m.partition("/")
        kw = {} if method == "auto" else {"clip_method": method}
        if old:  # the cap of one batch before the floor: 1/32 of the clipped elements
            kw["batch_elements"] = -(-clipped // int(old))
        runs.append(make_run(f"{args.optimizer} {m}", args.optimizer, kw, args.batch_size, total))
    device = torch.device("cpu")
    for k in range(total):
        for run in runs:
            _step(run, device, timed=k >= args.warmup)
        print(f"  step {k + 1} of {total}", file=sys.stderr, flush=True)
    return [Timed(run.name, run.totals, run.opt_times) for run in runs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", nargs="+", default=["auto/32", "auto", "mixed"])
    ap.add_argument("--optimizer", default="spectra-adamw", choices=OPTIMIZERS,
                    help="the SPECTRA optimizer, stepped beside its unclipped twin")  # fmt: skip
    ap.add_argument("--steps", type=int, default=15, help="timed steps (medians)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=1, help="repeats of the whole measurement")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    for name in ("steps", "batch_size", "threads", "runs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    per_run = [measure(args) for _ in range(args.runs)]
    # each row's steps over all runs, pooled
    pooled = [Timed(first.name, [t for runs in per_run for t in runs[k].totals],
                    [t for runs in per_run for t in runs[k].opt_times])
              for k, first in enumerate(per_run[0])]  # fmt: skip
    twin_total = statistics.median(pooled[0].totals)
    rows = []
    for k, row in enumerate(pooled):
        t, o = statistics.median(row.totals), statistics.median(row.opt_times)
        rows.append({"row": row.name, "total_ms": 1e3 * t, "optimizer_ms": 1e3 * o,
                     "ratio_by_steps": t / twin_total,
                     "ratio_by_optimizer_time": by_optimizer_time(row, pooled[0])})  # fmt: skip
        r = rows[-1]
        if args.runs > 1:
            each = [by_optimizer_time(runs[k], runs[0]) for runs in per_run]
            r["runs_ratio_by_optimizer_time"] = each
            r["runs_mean"], r["runs_std"] = statistics.mean(each), statistics.stdev(each)
        print(f"{r['row']:<22} step {r['total_ms']:7.1f} ms  optimizer {r['optimizer_ms']:6.1f} ms"
              f"  x twin {r['ratio_by_steps']:.3f} (by optimizer time "
              f"{r['ratio_by_optimizer_time']:.3f}"
              + (f"; runs {r['runs_mean']:.3f} ± {r['runs_std']:.3f}" if args.runs > 1 else "")
              + ")", flush=True)  # fmt: skip
    from spectra_lab.bench.ops import matmul_rate

    limits = {k: os.environ[k] for k in ISA_ENV if k in os.environ}
    command = [*(f"{k}={v}" for k, v in limits.items()), "python experiments/clip_method_step.py"]
    report = {
        "command": " ".join([*command, *sys.argv[1:]]),
        "cpu_flags": cpu_flags(),
        # what the run let the libraries use: ATen's kernels and MKL's and oneDNN's dispatch
        # can be held to AVX2 on a newer CPU (the ISA of a CPU without bf16 units)
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "isa_limits": limits,
        # the float32 product rate: what a matmul-only clip's cost follows from CPU to CPU
        "fp32_gflops": matmul_rate(torch.float32, torch.device("cpu")) / 1e9,
        **device_about("cpu"),
        "steps": args.steps,
        "warmup": args.warmup,
        "runs": args.runs,
        "batch_size": args.batch_size,
        "rows": rows,
    }
    if args.json:
        write_json_atomic(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
