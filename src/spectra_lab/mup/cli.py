"""``spectra mup coord-check``: μP's coordinate check as a figure and a JSON file."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from spectra.validate import check_int
from spectra_lab.errors import CLIError
from spectra_lab.files import save_figure, write_json_atomic
from spectra_lab.train.build import model_config_of
from spectra_lab.train.cli import add_config_arguments, config_from_args
from spectra_lab.train.config import TrainConfig

DEFAULT_WIDTHS = (64, 128, 256, 512, 1024)


#: the check's own defaults, under --config, --set and the flags: a small model, a few steps
#: at a large constant lr (a parametrization's flaws show within steps)
COORD_DEFAULTS = {"preset": "tiny", "steps": 6, "lr": 1e-2, "optimizer": "adamw", "batch_size": 8}
#: fields the check sets whatever the flags say: a constant lr, no evaluation, nothing saved
#: but the records
COORD_FIXED = {"schedule": "constant", "warmup_steps": 0, "clip_schedule": "constant"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="mup", metavar="TOOL", required=True)
    p = sub.add_parser(
        "coord-check",
        help="activation RMS per layer against width, standard vs μP",
        description=(
            "Train the same small model at several widths for a few steps, with the standard "
            "parametrization and with μP, and plot each layer's activation RMS against width. "
            "The defaults shown are the check's own (a tiny model, a few steps at a large "
            "constant lr), not those of `spectra train`."
        ),
    )
    p.add_argument(
        "--widths", type=int, nargs="+", default=list(DEFAULT_WIDTHS),
        help="model widths d_model (default: 64 128 256 512 1024)",
    )  # fmt: skip
    add_config_arguments(p)
    _show_coord_defaults(p)


def _show_coord_defaults(parser: argparse.ArgumentParser) -> None:
    """Rewrite the config flags' help to the values the check runs with."""
    for action in parser._actions:  # argparse has no public list of a parser's actions
        name = action.dest.removeprefix("field_")
        if name in COORD_DEFAULTS:
            action.help = f"config field {name} (default {COORD_DEFAULTS[name]})"
        elif name in COORD_FIXED:
            action.help = f"not used: the check runs with {name} = {COORD_FIXED[name]}"
        elif name == "out_dir":
            action.help = "the folder of the runs, coord_check.json and coord_check.png (required)"


def coord_config(args: argparse.Namespace) -> TrainConfig:
    """The configuration the check trains at every width: :data:`COORD_DEFAULTS` under the
    config layers and flags, with :data:`COORD_FIXED` and no evaluation or checkpoints. Its
    ``progress`` (``--no-progress``) is the check's bar; the runs themselves draw none."""
    cfg = config_from_args(args, base=COORD_DEFAULTS)
    return dataclasses.replace(
        cfg, **COORD_FIXED, eval_interval=cfg.steps + 1, eval_batches=1, checkpoint_interval=0,
        plot=False,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Train every width in both parametrizations; write the JSON and the figure."""
    from spectra_lab.mup.coord import coord_check, coord_figure, growth

    if args.field_out_dir is None:
        raise CLIError("--out is required: the folder of the runs, the JSON and the figure")
    for w in args.widths:
        try:
            check_int("--widths", w, low=1)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    cfg = coord_config(args)
    for w in args.widths:  # every width must fit the model and the base width: one line now
        model_config_of(dataclasses.replace(cfg, d_model=w, parametrization="mup"), 1)
    out = Path(cfg.out_dir)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} is a file; give a folder for the runs and the figure")
    results = coord_check(cfg, sorted(args.widths), out, progress=cfg.progress)
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
