"""``spectra synth {fw,spikes,all} --out DIR``: the paper's synthetic experiments.

``fw`` writes fw_curves.csv, fw_summary.json and fw_D2_<D₂>.png (+ fw_D2_<D₂>_stochastic.png);
``spikes`` writes spikes_grid.csv, spikes_curves.csv, spikes_summary.json, spikes_sgd.png,
spikes_sgdm.png and spikes_tuning.png. ``all`` runs both.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from spectra.validate import check_int
from spectra_lab.files import save_figure, write_csv, write_json_atomic
from spectra_lab.synth.experiments import (
    FW_CURVE_HEADER,
    SPIKE_CURVE_HEADER,
    SPIKE_GRID_HEADER,
    FWConfig,
    SpikeConfig,
    fw_curve_rows,
    run_fw_experiment,
    run_spike_experiment,
    spike_curve_rows,
    spike_grid_rows,
)
from spectra_lab.synth.files import CSV_FLOATS, torch_threads

EXPERIMENTS = {
    "fw": "constrained optimization with weight regularization (composite Frank–Wolfe)",
    "spikes": "robustness of SGD / SGD-M to sparse spectral spikes",
    "all": "both experiments",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    for name, help_text in EXPERIMENTS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--out", required=True, type=Path, help="output folder")
        p.add_argument("--seed", type=int, default=0, help="data and noise seed (default 0)")
        p.add_argument(
            "--iters", type=int, default=None, help="iterations per run (overrides the default)"
        )
        p.add_argument(
            "--quick", action="store_true", help="a small, fast version (fewer iterations/points)"
        )
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument(
            "--threads", type=int, default=1, help="torch threads (default 1: tiny matrices)"
        )


def fw_config(args: argparse.Namespace) -> FWConfig:
    cfg = FWConfig(seed=args.seed)
    if args.quick:
        cfg = replace(cfg, iters=200, stochastic_iters=200, stochastic_runs=2, solver_tol=1e-7)
    if args.iters is not None:
        cfg = replace(cfg, iters=args.iters, stochastic_iters=args.iters)
    return cfg


def spike_config(args: argparse.Namespace) -> SpikeConfig:
    cfg = SpikeConfig(seed=args.seed)
    if args.quick:
        cfg = replace(cfg, d=20, n=40, iters=100, eta_grid=(1e-4, 1e-3, 1e-2, 1e-1, 1.0))
    if args.iters is not None:
        cfg = replace(cfg, iters=args.iters)
    return cfg


def _progress_bar(total: int, args: argparse.Namespace) -> tqdm:
    return tqdm(total=total, disable=args.no_progress, file=sys.stderr, leave=False)


def run_fw(args: argparse.Namespace) -> list[Path]:
    from spectra_lab.synth.plots import fw_figure

    cfg = fw_config(args)
    n_tasks = 2 * len(cfg.radii) * len(cfg.regs) + len(cfg.regs)
    with _progress_bar(n_tasks, args) as bar:

        def progress(msg: str) -> None:
            bar.set_postfix_str(msg)
            bar.update()

        res = run_fw_experiment(cfg, progress)
    out: Path = args.out
    written = [
        write_csv(
            out / "fw_curves.csv", FW_CURVE_HEADER, fw_curve_rows(res), float_format=CSV_FLOATS
        ),
        write_json_atomic(out / "fw_summary.json", res.summary),
    ]
    for radius in cfg.radii:
        written.append(save_figure(fw_figure(res, "full", radius), out / f"fw_D2_{radius:g}.png"))
    r = cfg.stochastic_radius
    written.append(
        save_figure(fw_figure(res, "stochastic", r), out / f"fw_D2_{r:g}_stochastic.png")
    )
    return written


def run_spikes(args: argparse.Namespace) -> list[Path]:
    from spectra_lab.synth.plots import spike_figure, tuning_figure
    from spectra_lab.synth.spikes import MOMENTUM_METHODS, SGD_METHODS

    cfg = spike_config(args)
    with _progress_bar(len(cfg.scales) * len(cfg.methods), args) as bar:

        def progress(msg: str) -> None:
            bar.set_postfix_str(msg)
            bar.update()

        res = run_spike_experiment(cfg, progress)
    out: Path = args.out
    return [
        write_csv(
            out / "spikes_grid.csv",
            SPIKE_GRID_HEADER,
            spike_grid_rows(res),
            float_format=CSV_FLOATS,
        ),
        write_csv(
            out / "spikes_curves.csv",
            SPIKE_CURVE_HEADER,
            spike_curve_rows(res),
            float_format=CSV_FLOATS,
        ),
        write_json_atomic(out / "spikes_summary.json", res.summary),
        save_figure(spike_figure(res, SGD_METHODS), out / "spikes_sgd.png"),
        save_figure(spike_figure(res, MOMENTUM_METHODS), out / "spikes_sgdm.png"),
        save_figure(tuning_figure(res), out / "spikes_tuning.png"),
    ]


def run(args: argparse.Namespace) -> int:
    from spectra_lab.errors import CLIError

    try:
        check_int("--iters", args.iters, low=1, none_ok=True)
        check_int("--threads", args.threads, low=1)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.out.exists() and not args.out.is_dir():
        raise CLIError(f"--out {args.out} exists and is not a folder")
    written: list[Path] = []
    with torch_threads(args.threads):
        if args.experiment in ("fw", "all"):
            written += run_fw(args)
        if args.experiment in ("spikes", "all"):
            written += run_spikes(args)
    for path in written:
        print(path)
    return 0
