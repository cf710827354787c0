"""``spectra mup coord-check``: μP's coordinate check as a figure and a JSON file."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from spectra.validate import check_int
from spectra_lab.errors import CLIError
from spectra_lab.files import save_figure, write_json_atomic
from spectra_lab.train.cli import add_config_arguments, config_from_args

DEFAULT_WIDTHS = (64, 128, 256, 512, 1024)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="mup", metavar="TOOL", required=True)
    p = sub.add_parser(
        "coord-check",
        help="activation RMS per layer against width, standard vs μP",
        description=(
            "Train the same small model at several widths for a few steps, with the standard "
            "parametrization and with μP, and plot each layer's activation RMS against width."
        ),
    )
    p.add_argument(
        "--widths", type=int, nargs="+", default=list(DEFAULT_WIDTHS),
        help="model widths d_model (default: 64 128 256 512 1024)",
    )  # fmt: skip
    add_config_arguments(p)


#: the check's own defaults, under --config, --set and the flags: a small model, a few steps
#: at a large constant lr (a parametrization's flaws show within steps)
COORD_DEFAULTS = {"preset": "tiny", "steps": 6, "lr": 1e-2, "optimizer": "adamw", "batch_size": 8}


def run(args: argparse.Namespace) -> int:
    from spectra_lab.mup.coord import coord_check, coord_figure, growth
    from spectra_lab.train.trainer import model_config_of

    if args.field_out_dir is None:
        raise CLIError("--out is required: the folder of the runs, the JSON and the figure")
    for w in args.widths:
        try:
            check_int("--widths", w, low=1)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    cfg = config_from_args(args, base=COORD_DEFAULTS)
    # a few steps at a constant lr, nothing saved but the records
    cfg = dataclasses.replace(
        cfg, schedule="constant", warmup_steps=0, eval_interval=cfg.steps + 1, eval_batches=1,
        checkpoint_interval=0, plot=False, progress=False, clip_schedule="constant",
    )  # fmt: skip
    for w in args.widths:  # every width must fit the model and the base width: one line now
        model_config_of(dataclasses.replace(cfg, d_model=w, parametrization="mup"), 1)
    out = Path(cfg.out_dir)
    results = coord_check(cfg, sorted(args.widths), out)
    written = [
        write_json_atomic(out / "coord_check.json", results),
        save_figure(coord_figure(results), out / "coord_check.png"),
    ]
    print(f"RMS at width {max(args.widths)} / width {min(args.widths)}, step {cfg.steps - 1}:")
    for param, layers in growth(results).items():
        cells = " | ".join(f"{k} {v:.2f}" for k, v in layers.items())
        print(f"  {param:8s} {cells}")
    for path in written:
        print(f"wrote {path}")
    return 0
