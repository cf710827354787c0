"""``spectra analyze {spectra,noise,norms}``: the diagnostics of "Enhancing LLM Training via
Spectral Clipping" (Section 4, Appendix D.2 and its weight-norm figure).

``spectra`` and ``noise`` train a run — the config of ``RUN_DIR/config.yaml`` or the defaults,
with the ``spectra train`` flags on top — into ``--out`` and record, at fractions of its steps,
what the paper plots; they write ``spectra.json`` (or ``noise.json``) and grid figures next to
the run's own files. ``norms`` reads the monitor records of finished runs. See
docs/diagnostics.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from pathlib import Path
from typing import Any

import yaml

from spectra_lab.errors import CLIError
from spectra_lab.files import save_figure, write_json_atomic
from spectra_lab.train.cli import add_config_arguments, config_from_args
from spectra_lab.train.config import TrainConfig, load_saved_config

ANALYSES = {
    "spectra": "singular values of gradients and updates at fractions of a training run",
    "noise": "signal and noise of the gradient: spectral spikes and subspace distances",
    "norms": "aggregated l-inf and Frobenius weight norms of runs, from their monitor records",
}
DEFAULT_AT = "0,0.05,0.5,0.99"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="analysis", metavar="ANALYSIS", required=True)
    for name in ("spectra", "noise"):
        p = sub.add_parser(name, help=ANALYSES[name], description=ANALYSES[name])
        p.add_argument(
            "run_dir", nargs="?", metavar="RUN_DIR",
            help="a run directory whose config.yaml is the base config (default: the defaults)",
        )  # fmt: skip
        p.add_argument(
            "--at", default=DEFAULT_AT, metavar="F,F,...",
            help=f"fractions of the steps to record at (default {DEFAULT_AT})",
        )  # fmt: skip
        p.add_argument(
            "--layers", metavar="NAME,NAME,...",
            help="weight matrices, e.g. layers.0.attn.wq (default: the token embedding and the "
            "first attention and MLP matrices of the first, middle and last blocks)",
        )  # fmt: skip
        if name == "noise":
            p.add_argument(
                "--signal-batch", type=int, default=256,
                help="sequences of the large-batch gradient G (default 256)",
            )  # fmt: skip
            p.add_argument(
                "--samples", type=int, default=50,
                help="single-sequence noise samples per step (default 50)",
            )  # fmt: skip
            p.add_argument(
                "--rank", type=int, default=5,
                help="r: how many top singular values and singular vectors (default 5)",
            )  # fmt: skip
        add_config_arguments(p)
        p.add_argument("--overwrite", action="store_true",
                       help="start afresh in --out even if it holds checkpoints")  # fmt: skip
    p = sub.add_parser("norms", help=ANALYSES["norms"], description=ANALYSES["norms"])
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories trained with a monitor")
    p.add_argument("--out", required=True, type=Path, help="folder for norms.json and norms.png")
    p.add_argument("--labels", nargs="+", help="one label per run (default: the optimizer)")


def run(args: argparse.Namespace) -> int:
    if args.analysis == "norms":
        return run_norms(args)
    return run_recording(args)


# ---------------------------------------------------------------------------------------
# spectra and noise: a training run with a recorder


def parse_fractions(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise CLIError(f"--at expects comma-separated fractions, got {text!r}") from None
    if not values:
        raise CLIError("--at: give at least one fraction")
    return values


def analysis_config(args: argparse.Namespace) -> TrainConfig:
    """The run's config: ``RUN_DIR/config.yaml`` (or the defaults), then the flags; fresh."""
    if args.field_out_dir is None:
        raise CLIError("--out is required: the folder of the analysis run and its files")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise CLIError("spectra analyze runs in one process; start it without torchrun")
    base = None
    if args.run_dir is not None:
        saved = Path(args.run_dir) / "config.yaml"
        if not saved.is_file():
            raise CLIError(f"{args.run_dir}: not a run directory (no config.yaml)")
        if Path(args.field_out_dir).resolve() == Path(args.run_dir).resolve():
            raise CLIError("--out must not be RUN_DIR: the analysis trains a run of its own")
        base = load_saved_config(saved)
    cfg = config_from_args(args, base=base)
    if cfg.parallel == "fsdp2":
        raise CLIError("spectra analyze needs parallel=ddp (it reads whole matrices)")
    return dataclasses.replace(cfg, resume=False, overwrite=args.overwrite)


def run_recording(args: argparse.Namespace) -> int:
    from spectra_lab.analyze.plots import (
        noise_distance_figure,
        noise_spectra_figure,
        spectra_figure,
    )
    from spectra_lab.analyze.recorders import NoiseRecorder, SpectraRecorder, record_steps
    from spectra_lab.train.trainer import train

    cfg = analysis_config(args)
    fractions = parse_fractions(args.at)
    steps = record_steps(fractions, cfg.steps)
    layers = [v.strip() for v in args.layers.split(",") if v.strip()] if args.layers else None
    if args.analysis == "noise":
        for flag in ("signal_batch", "samples", "rank"):
            if getattr(args, flag) < 1:
                raise CLIError(
                    f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}"
                )
    built: list[Any] = []

    def watch(ctx: Any) -> Any:
        if args.analysis == "spectra":
            built.append(SpectraRecorder(ctx, layers, steps))
        else:
            built.append(
                NoiseRecorder(
                    ctx,
                    layers,
                    steps,
                    signal_batch=args.signal_batch,
                    samples=args.samples,
                    rank=args.rank,
                    progress=cfg.progress,
                )
            )
        return built[0]

    train(cfg, watch=watch)
    recorder = built[0]
    out = Path(cfg.out_dir)
    data: dict[str, Any] = {
        "analysis": args.analysis,
        "optimizer": cfg.optimizer,
        "preset": cfg.preset,
        "total_steps": cfg.steps,
        "fractions": fractions,
        "steps": steps,
    }
    if args.analysis == "noise":
        data.update(signal_batch=args.signal_batch, samples=args.samples, rank=args.rank)
    data["layers"] = {
        name: {"shape": [p.shape[0], p.numel() // p.shape[0]], "records": recorder.records[name]}
        for name, p in recorder.layers
    }
    if args.analysis == "noise":
        for layer in data["layers"].values():
            m, n = layer["shape"]
            layer["chordal_chance"] = chordal_chance(m, n, args.rank)
    written = [write_json_atomic(out / f"{args.analysis}.json", data)]
    if args.analysis == "spectra":
        for which in ("grad", "update"):
            fig = spectra_figure(data, which)
            written.append(save_figure(fig, out / f"spectra_{which}.png"))
        print_spectra(data)
    else:
        written.append(save_figure(noise_spectra_figure(data), out / "noise_spectra.png"))
        written.append(save_figure(noise_distance_figure(data), out / "noise_distances.png"))
        print_noise(data)
    for path in written:
        print(f"wrote {path}")
    return 0


def chordal_chance(m: int, n: int, r: int) -> float:
    """About what ``d_r`` chordal is for random subspaces: for r-dimensional subspaces of
    R^d drawn at random, ``E Σ cos²θ_i = r²/d``, so ``Σ sin²θ_i / r ≈ 1 − r/d``; the larger
    side (d = max(m, n)) wins the max of ``d_r``."""
    r = min(r, m, n)
    return math.sqrt(1.0 - r / max(m, n))


def _g(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.3g}"


def _condition(c: dict[str, float]) -> str:
    return (
        f"σmax {_g(c['sigma_max'])} σmin {_g(c['sigma_min'])} κ {_g(c['cond'])} "
        f"σmax/median {_g(c['max_over_median'])}"
    )


def print_spectra(data: dict[str, Any]) -> None:
    for name, layer in data["layers"].items():
        for r in layer["records"]:
            line = f"{name} step {r['step']}: grad {_condition(r['grad'])}"
            if r["update"] is not None:
                line += f" | update {_condition(r['update'])}"
            print(line)


def print_noise(data: dict[str, Any]) -> None:
    for name, layer in data["layers"].items():
        for r in layer["records"]:
            s = r["summary"]
            print(
                f"{name} step {r['step']}: ‖G‖₂ {_g(r['signal_norm'])} | median σ₁(N)/‖G‖₂ "
                f"{_g(s['noise_top_over_signal_median'])}, above 1 in "
                f"{s['fraction_noise_top_above_signal']:.0%} | median d_spec "
                f"{s['spectral_median']:.3f}, d_chord {s['chordal_median']:.3f} "
                f"(random subspaces: {layer['chordal_chance']:.3f})"
            )


# ---------------------------------------------------------------------------------------
# norms: the monitor records of finished runs


def load_norms(run: Path, label: str | None) -> dict[str, Any]:
    """The run's ``spectral/sum_weight_linf`` and ``sum_weight_fro`` against step."""
    from spectra_lab.runs.records import read_jsonl

    if not (run / "metrics.jsonl").is_file() or not (run / "config.yaml").is_file():
        raise CLIError(f"{run}: not a run directory (no metrics.jsonl or config.yaml)")
    config = yaml.safe_load((run / "config.yaml").read_text()) or {}
    records = [
        r
        for r in read_jsonl(run / "metrics.jsonl")
        if r.get("kind") == "monitor" and "spectral/sum_weight_linf" in r
    ]
    if not records:
        raise CLIError(f"{run}: no weight norms in metrics.jsonl; train it with --monitor-every N")
    return {
        "label": label or config.get("optimizer", run.name),
        "run": str(run),
        "optimizer": config.get("optimizer"),
        "monitor_groups": config.get("monitor_groups"),
        "steps": [r["step"] for r in records],
        "sum_weight_linf": [r["spectral/sum_weight_linf"] for r in records],
        "sum_weight_fro": [r["spectral/sum_weight_fro"] for r in records],
    }


def run_norms(args: argparse.Namespace) -> int:
    from spectra_lab.analyze.plots import norms_figure

    runs = [Path(r) for r in args.runs]
    labels = args.labels or [None] * len(runs)
    if len(labels) != len(runs):
        raise CLIError(f"--labels: got {len(labels)} labels for {len(runs)} runs")
    if args.out.exists() and not args.out.is_dir():
        raise CLIError(f"--out {args.out} is a file; give a folder for norms.json and norms.png")
    data = [load_norms(run, label) for run, label in zip(runs, labels, strict=True)]
    groups = {tuple(d["monitor_groups"] or ()) for d in data}
    if len(groups) > 1:
        raise CLIError(
            "the runs watched different matrices (monitor_groups "
            f"{' vs '.join(map(str, sorted(groups)))}): their sums are not comparable"
        )
    written = [
        write_json_atomic(args.out / "norms.json", {"runs": data}),
        save_figure(norms_figure(data), args.out / "norms.png"),
    ]
    for d in data:
        print(
            f"{d['label']}: step {d['steps'][-1]} | Σ‖X‖_∞ {d['sum_weight_linf'][-1]:.4g} | "
            f"Σ‖X‖_F {d['sum_weight_fro'][-1]:.4g}"
        )
    for path in written:
        print(f"wrote {path}")
    return 0
