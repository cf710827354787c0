"""``spectra bench step``: a training step's time, in the format of the paper's timing table.

For each optimizer of the harness's registry, on a model preset with random tokens: the median
total step time (forward, backward, global gradient clipping and ``optimizer.step()``), the
optimizer step's time and share of it, and the overhead against the base optimizer
(``spectra-adamw`` against ``adamw``, ``X + pre-clip`` against ``X``): of the totals, and by
optimizer time (the optimizer steps' difference over the base's total, which leaves out the
forward and backward passes' own spread). The first is the layout of "Enhancing LLM Training
via Spectral Clipping", Table timing_combined (there on 4×H100 at 160M and 780M).

The optimizers take their steps in turn (step k of each before step k + 1 of any), each on its
own model built from the same seed and fed the same tokens, so that a shared machine's change
of speed during the run reaches them alike; all their models are held at once.

The model and optimizer are built exactly as ``spectra train`` builds them (same presets,
parameter groups and recipes); the data are random tokens, since the step's time does not
depend on them. On CUDA the step runs under bf16 autocast and is synchronised around each
timed phase.

``--json PATH`` also writes the report the table is printed from (the command's arguments, the
torch version and thread count, the rows) atomically; ``experiments/study/report.py`` renders
the tables of docs/results.md from such files.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from spectra.validate import check_int, check_number
from spectra_lab.errors import CLIError
from spectra_lab.machine import device_about

DEFAULT_OPTIMIZERS = ("adamw", "spectra-adamw", "signum", "spectra-signum")
#: Vocabulary of the random tokens (the embedded corpus's default BPE size).
VOCAB = 4096
#: The command's arguments that ``--json`` stores with the rows.
ARGS = ("preset", "optimizer", "pre_clip", "steps", "warmup", "batch_size", "device", "threads")


def base_of(name: str) -> str:
    """The optimizer a row's overhead is measured against (itself for a base optimizer)."""
    return name.removeprefix("spectra-")


def build(name: str, preset: str, **config: Any) -> tuple[Any, Any, Any, Any]:
    """``(cfg, model, model_cfg, optimizer)`` built as ``spectra train`` builds them."""
    from spectra_lab.train.build import build_model
    from spectra_lab.train.config import TrainConfig
    from spectra_lab.train.optimizers import build_optimizer
    from spectra_lab.train.schedule import build_lr_lambda

    cfg = TrainConfig(preset=preset, optimizer=name, **config)
    model, model_cfg = build_model(cfg, VOCAB)
    return cfg, model, model_cfg, build_optimizer(model, cfg, build_lr_lambda(cfg))


@dataclass
class _Run:
    """One optimizer's model and its timings, stepped in turn with the others."""

    name: str
    pre_clip_c: float | None
    cfg: Any
    model: Any
    optimizer: Any
    params: list[torch.Tensor]
    gen: torch.Generator
    shape: tuple[int, int]
    totals: list[float] = field(default_factory=list)
    opt_times: list[float] = field(default_factory=list)


def _make_run(
    name: str, preset: str, steps: int, warmup: int, batch_size: int, device: torch.device,
    pre_clip_c: float | None = None, seed: int = 0,
) -> _Run:  # fmt: skip
    cfg, model, model_cfg, optimizer = build(
        name, preset, batch_size=batch_size, steps=warmup + steps, pre_clip_c=pre_clip_c,
        seed=seed, device=str(device),
    )  # fmt: skip
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(seed)  # the same tokens for every optimizer
    return _Run(name, pre_clip_c, cfg, model, optimizer, params, gen,
                (batch_size, model_cfg.seq_len + 1))  # fmt: skip


def _step(run: _Run, device: torch.device, timed: bool) -> None:
    """One training step of ``run``: forward, backward, gradient clipping, optimizer step."""
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device.type == "cuda")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    tokens = torch.randint(0, VOCAB, run.shape, generator=run.gen).to(device)
    sync()
    t0 = time.perf_counter()
    with autocast:
        _, loss = run.model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.params, run.cfg.grad_clip or float("inf"))
    sync()
    t1 = time.perf_counter()
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    sync()
    t2 = time.perf_counter()
    if timed:
        run.totals.append(t2 - t0)
        run.opt_times.append(t2 - t1)


def _row(run: _Run) -> dict[str, Any]:
    label = run.name + (f" + pre-clip {run.pre_clip_c:g}" if run.pre_clip_c is not None else "")
    return {
        "optimizer": label,
        "name": run.name,
        "pre_clip": run.pre_clip_c,
        "base": base_of(run.name),
        "total_ms": 1e3 * statistics.median(run.totals),
        "optimizer_ms": 1e3 * statistics.median(run.opt_times),
        "parameters": sum(p.numel() for p in run.params),
    }


def pre_clips(name: str, preset: str) -> bool:
    """Whether the registry's optimizer ``name`` can pre-clip gradients (SOAP and torch's own
    optimizers cannot: pre-clipping is part of spectra's own recipes)."""
    from spectra_lab.train.config import ConfigError, TrainConfig
    from spectra_lab.train.optimizers import check_optimizer

    try:
        check_optimizer(TrainConfig(preset=preset, optimizer=name, pre_clip_c=1.0))
    except ConfigError:
        return False
    return True


def run_benchmark(
    optimizers: tuple[str, ...], preset: str, steps: int = 5, warmup: int = 2,
    batch_size: int = 8, device: str | torch.device = "cpu", pre_clip_c: float | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """One row per optimizer, and with ``pre_clip_c`` one more per optimizer that can
    pre-clip (decided before anything is timed)."""
    device = torch.device(device)
    pre = {name: pre_clip_c is not None and pre_clips(name, preset) for name in optimizers}
    runs = []
    for name in optimizers:
        runs.append(_make_run(name, preset, steps, warmup, batch_size, device))
        if pre[name]:
            runs.append(_make_run(name, preset, steps, warmup, batch_size, device, pre_clip_c))
    # Round robin: step k of every optimizer runs before step k + 1 of any, so that a change
    # of the machine's speed during the benchmark reaches all of them alike.
    for k in range(warmup + steps):
        for run in runs:
            _step(run, device, timed=k >= warmup)
    rows = [_row(run) for run in runs]
    bases = {r["optimizer"]: r for r in rows}
    for r in rows:
        r["share"] = r["optimizer_ms"] / r["total_ms"]
        base = bases.get(r["base"])
        r["overhead"] = r["total_ms"] / base["total_ms"] - 1.0 if base is not None else None
        r["optimizer_overhead"] = optimizer_overhead(r, base)
    return rows


def optimizer_overhead(row: dict[str, Any], base: dict[str, Any] | None) -> float | None:
    """The overhead by optimizer time: ``(optimizer step − base's optimizer step) / base's
    total``, what the step costs beyond the base's with the passes the same."""
    if base is None:
        return None
    return (row["optimizer_ms"] - base["optimizer_ms"]) / base["total_ms"]


def format_table(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| optimizer | total (ms) | optimizer step (ms) | share | overhead vs base "
        "| by optimizer time |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    bases = {r["optimizer"]: r for r in rows}
    for r in rows:
        over = "–" if r["overhead"] is None else f"{100 * r['overhead']:+.1f}%"
        by_opt = optimizer_overhead(r, bases.get(r["base"]))  # also for reports stored before
        by_opt = "–" if by_opt is None else f"{100 * by_opt:+.1f}%"
        lines.append(
            f"| {r['optimizer']} | {r['total_ms']:.1f} | {r['optimizer_ms']:.1f} "
            f"| {100 * r['share']:.1f}% | {over} | {by_opt} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from spectra_lab.train.optimizers import OPTIMIZERS

    parser.add_argument("--preset", default="cpu-small", help="model preset (cpu-small)")
    parser.add_argument(
        "--optimizer", nargs="+", choices=sorted(OPTIMIZERS), default=list(DEFAULT_OPTIMIZERS),
        metavar="OPT", help=f"optimizers of the registry (default: {' '.join(DEFAULT_OPTIMIZERS)})",
    )  # fmt: skip
    parser.add_argument("--pre-clip", type=float, default=None, help="also time X + pre-clip C")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the report here")


def header(report: dict[str, Any]) -> str:
    """The table's first line: preset, size, batch, device, threads and steps of a report."""
    a = report["args"]
    return (
        f"preset {a['preset']} ({report['parameters'] / 1e6:.2f}M parameters), batch "
        f"{a['batch_size']}, device {a['device']}, {report['threads']} threads, median of "
        f"{a['steps']} steps"
    )


def format_report(report: dict[str, Any]) -> str:
    """The table of a report (as ``run`` prints it and ``--json`` stores it), and a line naming
    the optimizers that got no pre-clip row."""
    text = format_table(report["rows"], header(report))
    if report["no_pre_clip"]:
        text += f"no pre-clip row for {', '.join(report['no_pre_clip'])}: they do not pre-clip\n"
    return text


def run(args: argparse.Namespace) -> int:
    try:
        for name in ("steps", "batch_size"):
            check_int(f"--{name.replace('_', '-')}", getattr(args, name), low=1)
        check_int("--warmup", args.warmup, low=0)
        check_int("--threads", args.threads, low=1, none_ok=True)
        check_number("--pre-clip", args.pre_clip, low=0.0, low_open=True, none_ok=True)
        from spectra_lab.model.llama import PRESETS

        if args.preset not in PRESETS:
            raise ValueError(f"--preset must be one of {', '.join(PRESETS)}, got {args.preset!r}")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {args.device}: CUDA is not available")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = run_benchmark(
        tuple(args.optimizer), args.preset, args.steps, args.warmup, args.batch_size,
        args.device, args.pre_clip,
    )  # fmt: skip
    report = {
        "command": "spectra bench step",
        "args": {name: getattr(args, name) for name in ARGS},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **device_about(args.device),
        "parameters": rows[0]["parameters"],
        "rows": rows,
        "no_pre_clip": (
            [n for n in args.optimizer if not pre_clips(n, args.preset)]
            if args.pre_clip is not None
            else []
        ),
    }
    print(format_report(report), end="")
    if args.json:
        from spectra_lab.files import write_json_atomic

        write_json_atomic(args.json, report)
    return 0
