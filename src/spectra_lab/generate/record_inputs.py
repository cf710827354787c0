"""Update directions recorded from real training runs: the inputs SPECTRA's clip sees.

``spectra bench record-inputs`` trains the ``cpu-small`` model on the embedded corpus with a
base optimizer (AdamW, Signum, AdEMAMix; no clipping) and, at a few fractions of training,
recovers the update direction ``U`` of some clipped matrices from the weights around the
step: with decoupled weight decay ``X₊ = (1 − ηλ)X − ηU``, so ``U = ((1 − ηλ)X − X₊)/η``
(the group's own η and λ). These are the matrices the post-clip ``H_c(U)`` acts on in
SPECTRA training; ``spectra bench ops`` times and checks the operators on them beside its
synthetic inputs (:mod:`spectra_lab.bench.matrices` reads them).

The recorded file ships with the package (``spectra_lab/bench/data/cpu_small_directions.pt``);
recording it again takes a few minutes on a CPU.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from spectra.validate import check_int
from spectra_lab.bench.matrices import DEFAULT_FILE
from spectra_lab.files import atomic_path

OPTIMIZERS = ("adamw", "signum", "ademamix")
#: Learning rates of the recording runs (the main job's for AdamW and AdEMAMix; a sign
#: update has unit entries, so Signum takes a smaller one).
LR = {"adamw": 2e-3, "signum": 3e-4, "ademamix": 2e-3}
FRACTIONS = (0.05, 0.5, 1.0)
#: Stored in float16 to keep the shipped file small (2.4 MB): sign directions are exact,
#: Adam-type ones rounded to 11 bits; the benchmark uses the stored matrices as they are.
STORE_DTYPE = torch.float16
#: Which matrices are recorded: the first 2-D parameter of each of these groups (the first
#: layer's query projection and SwiGLU W₁).
GROUPS = ("attn", "hidden")


def _chosen(optimizer: torch.optim.Optimizer) -> list[tuple[str, Tensor, dict[str, Any]]]:
    out = []
    for group in optimizer.param_groups:
        name = group.get("group")
        if name not in GROUPS:
            continue
        mats = [p for p in group["params"] if p.dim() == 2]
        if mats:
            out.append((name, mats[0], group))
    return out


class _Recorder:
    """Global optimizer step hooks that recover ``U`` at the chosen steps (1-based)."""

    def __init__(self, label: str, at_steps: set[int]) -> None:
        self.label, self.at_steps = label, at_steps
        self.step = 0
        self.pending: list[tuple[str, Tensor, float, float, Tensor]] = []
        self.found: dict[str, Tensor] = {}

    def pre(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.pending = []
        if self.step + 1 in self.at_steps:
            for name, p, group in _chosen(optimizer):
                lr, wd = float(group["lr"]), float(group["weight_decay"])
                self.pending.append((name, p, lr, wd, p.detach().clone()))

    def post(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self.step += 1
        for name, p, lr, wd, before in self.pending:
            X0, X1 = before.double(), p.detach().double()
            U = ((1.0 - lr * wd) * X0 - X1) / lr
            self.found[f"{self.label}@{self.step}/{name}"] = U.to(STORE_DTYPE)
        self.pending = []


def record(
    out: str | Path,
    optimizers: tuple[str, ...] = OPTIMIZERS,
    steps: int = 150,
    fractions: tuple[float, ...] = FRACTIONS,
    progress: bool = True,
    **config: Any,
) -> dict[str, Tensor]:
    """Train each optimizer for ``steps`` steps and save the recovered directions to ``out``.

    ``config`` overrides :class:`~spectra_lab.train.config.TrainConfig` fields (default: the
    main job's, i.e. ``cpu-small`` on the embedded corpus).

    Returns ``{"optimizer@step/group": U}`` (float16), also saved (atomically) as a dict
    with the run settings under ``"meta"``.
    """
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    from spectra_lab.train.config import TrainConfig
    from spectra_lab.train.trainer import train

    check_int("steps", steps, low=1)
    at_steps = {max(1, min(steps, math.ceil(f * steps))) for f in fractions}
    found: dict[str, Tensor] = {}
    for name in optimizers:
        rec = _Recorder(name, at_steps)
        handles = [
            register_optimizer_step_pre_hook(rec.pre),
            register_optimizer_step_post_hook(rec.post),
        ]
        try:
            with tempfile.TemporaryDirectory() as tmp:
                settings = dict(
                    lr=LR.get(name, 2e-3),
                    eval_interval=steps,
                    checkpoint_interval=0,
                    plot=False,
                    progress=progress,
                )
                settings.update(config, out_dir=tmp, optimizer=name, steps=steps)
                cfg = TrainConfig(**settings)
                train(cfg)
        finally:
            for h in handles:
                h.remove()
        found.update(rec.found)
    meta = {"steps": steps, "at_steps": sorted(at_steps), "lr": LR, "config": config}
    with atomic_path(out) as tmp_path:
        torch.save({"meta": meta, "directions": found}, tmp_path)
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=str(DEFAULT_FILE), help="file to write (.pt)")
    parser.add_argument("--steps", type=int, default=150, help="training steps per optimizer")
    parser.add_argument(
        "--optimizers", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS), metavar="OPT"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from spectra_lab.errors import CLIError

    try:
        check_int("--steps", args.steps, low=1)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    found = record(
        args.out, tuple(args.optimizers), steps=args.steps, progress=not args.no_progress
    )
    for key, U in found.items():
        print(f"{key}: {tuple(U.shape)}, ‖U‖₂ = {torch.linalg.matrix_norm(U.double(), 2):.4g}")
    print(f"wrote {len(found)} directions to {args.out}")
    return 0
