"""``spectra train``: train the main job, or any configuration of it.

Configuration layers, later ones winning: the defaults of ``TrainConfig`` (or, with
``--resume``, the run directory's saved ``config.yaml``), then ``--config FILE``, then
``--shrink`` (a quick CPU version of it: ``config.SHRINK``), then ``--set key=value`` items,
then the direct flags (``--steps``, ``--out``, ...). Values from the command line are
strings, read as YAML scalars and typed by the config loader, so that a bad value is
reported with the field's name. The optimizer and the schedule check their own settings when
``train`` starts, before anything runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from spectra.validate import check_int
from spectra_lab.errors import CLIError
from spectra_lab.runs.records import perplexity_text
from spectra_lab.train.config import (
    LOGGERS,
    PARALLEL_MODES,
    TrainConfig,
    build_config,
    load_saved_config,
    parse_set,
    read_config_file,
    shrink,
)

# flag -> config field
DIRECT_FLAGS: dict[str, str] = {
    "--steps": "steps",
    "--out": "out_dir",
    "--optimizer": "optimizer",
    "--lr": "lr",
    "--preset": "preset",
    "--batch-size": "batch_size",
    "--grad-accum": "grad_accum",
    "--dataset": "dataset",
    "--tokenizer": "tokenizer",
    "--schedule": "schedule",
    "--warmup-steps": "warmup_steps",
    "--clip-c": "clip_c",
    "--seed": "seed",
    "--device": "device",
    "--parallel": "parallel",
    "--tp-size": "tp_size",
    "--monitor-every": "monitor_every",
    "--log": "loggers",
}
#: flags whose value is one of a few words (or a list of them), shown in the help
CHOICES: dict[str, str] = {
    "parallel": "{" + ",".join(PARALLEL_MODES) + "}",
    "loggers": ",".join(LOGGERS),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its latest checkpoint",
    )
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="train in N processes on this machine (DDP, or --parallel fsdp2|tp|2d), as torchrun "
        "--standalone would, with one line per failure",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in --out even if it holds checkpoints (they are deleted)",
    )


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that describe a run: ``--config``, ``--set``, the direct flags, switches."""
    parser.add_argument("--config", metavar="FILE", help="YAML or TOML file of config fields")
    parser.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="set any config field (repeatable), e.g. --set clip_groups=[hidden,attn]",
    )
    defaults = TrainConfig().to_dict()
    for flag, name in DIRECT_FLAGS.items():
        default = defaults[name]
        shown = f" (default {default})" if default not in (None, []) else ""
        parser.add_argument(flag, dest=f"field_{name}", metavar=CHOICES.get(name, name.upper()),
                            help=f"config field {name}{shown}")  # fmt: skip
    parser.add_argument(
        "--shrink",
        action="store_true",
        help="try the config on a CPU: tiny model, Shakespeare, 40 steps, into OUT-shrunk "
        "(optimizer and schedules kept; docs/scale.md#shrink)",
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--no-progress", action="store_true", help="log lines, no progress bar")


def config_from_args(args: argparse.Namespace, base: dict[str, Any] | None = None) -> TrainConfig:
    """Resolve the layered configuration; a bad layer raises a one-line ``ConfigError``.

    ``base`` replaces the defaults (``--resume`` takes the run directory's ``config.yaml``).
    """
    file_values = read_config_file(args.config) if args.config else {}
    flag_values: dict[str, Any] = {
        name: getattr(args, f"field_{name}")
        for name in DIRECT_FLAGS.values()
        if getattr(args, f"field_{name}") is not None
    }
    switches = ("compile", "resume", "overwrite")
    flag_values.update({name: True for name in switches if getattr(args, name, False)})
    if args.no_progress:
        flag_values["progress"] = False
    layers = [(args.config or "--config", file_values)]
    if getattr(args, "shrink", False):
        layers.append(("--shrink", shrink(file_values)))
    layers += [("--set", parse_set(args.overrides)), ("the command line", flag_values)]
    if base is None and getattr(args, "resume", False):
        out_dir = TrainConfig.__dataclass_fields__["out_dir"].default
        for _, layer in layers:
            out_dir = layer.get("out_dir", out_dir)
        saved = Path(str(out_dir)).expanduser() / "config.yaml"
        if saved.is_file():
            base = load_saved_config(saved)
    return build_config(*layers, base=base)


def run(args: argparse.Namespace) -> int:
    from spectra_lab.train.trainer import train

    cfg = config_from_args(args)
    nproc = args.nproc_per_node
    if nproc is not None and "RANK" not in os.environ:
        try:
            check_int("--nproc-per-node", nproc, low=1)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        cfg.accumulation(nproc)  # a bad global batch: one line, before any process starts
        return launch(nproc, strip_flag(args.argv, "--nproc-per-node"))
    cfg.accumulation(int(os.environ.get("WORLD_SIZE", "1")))  # a bad global batch: one line now
    result = train(cfg)
    if result.rank == 0 and result.val_loss is not None:
        print(
            f"final validation loss {result.val_loss:.4f} | "
            f"perplexity {perplexity_text(result.val_loss)} "
            f"| step {result.step} | run {result.run_dir}"
        )
    return 0


def strip_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag VALUE`` / ``flag=VALUE``."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(f"{flag}="):
            out.append(arg)
    return out


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``spectra <argv>`` in ``nproc`` processes on this machine, as ``torchrun
    --standalone --nproc-per-node nproc`` would (torch's elastic launcher), and return the
    first failed process's exit status. The processes report their own errors (rank 0, one
    line); the launcher adds none of its own."""
    import logging
    import uuid

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    logging.getLogger("torch.distributed").setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default for its processes
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
    )
    try:
        elastic_launch(config, sys.executable)("-m", "spectra_lab", *argv)
    except ChildFailedError as exc:
        return exc.get_first_failure()[1].exitcode or 1
    except SignalException as exc:  # the processes saved and reported; the status is theirs
        return 128 + int(exc.sigval)
    return 0
