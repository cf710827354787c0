"""The optimizer's share of real training runs: pairs of runs (base optimizer, SPECTRA) of the
same job, from the per-step timings that ``spectra train`` logs in ``metrics.jsonl``.

For each pair: the medians of ``t_optimizer`` and ``t_step`` over the training steps after the
first ``--skip``, and the SPECTRA step's cost as a multiple of the base's step, by optimizer
time (``1 + (t_opt,S − t_opt,B) / t_step,B``: the forward and backward passes taken as equal)
and by the steps' medians. Run the pairs one after another (base, SPECTRA, base, SPECTRA, ...)
so that a shared machine's drift reaches both alike::

    for i in 1 2; do for o in adamw spectra-adamw; do
        spectra train --optimizer $o --out runs/ratio-$o-$i --no-progress --overwrite
    done; done
    python experiments/step_ratio.py runs/ratio-adamw-1 runs/ratio-spectra-adamw-1 \\
        runs/ratio-adamw-2 runs/ratio-spectra-adamw-2 --json docs/data/main_job_step_ratio.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from spectra_lab.files import write_json_atomic


def medians(run: Path, skip: int) -> dict[str, Any]:
    """Median ``t_optimizer`` and ``t_step`` (ms) of a run's training steps after ``skip``."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("kind") == "train"][skip:]
    if not steps:
        raise SystemExit(f"{run}: no training steps after the first {skip}")
    config = yaml.safe_load((run / "config.yaml").read_text())
    about = json.loads((run / "run.json").read_text())
    return {
        "run": run.name,
        "machine": about.get("machine"),  # as the trainer records it (absent in older runs)
        "optimizer": config.get("optimizer"),
        "soft_clip_auto": about.get("soft_clip_auto"),
        "steps": len(steps),
        "optimizer_ms": 1e3 * statistics.median(r["t_optimizer"] for r in steps),
        "step_ms": 1e3 * statistics.median(r["t_step"] for r in steps),
    }


def pair(base: dict[str, Any], spectra: dict[str, Any]) -> dict[str, Any]:
    added = spectra["optimizer_ms"] - base["optimizer_ms"]
    return {
        "base": base,
        "spectra": spectra,
        "by_optimizer_time": 1.0 + added / base["step_ms"],
        "by_step": spectra["step_ms"] / base["step_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders: base, SPECTRA, ...")
    parser.add_argument("--skip", type=int, default=5, help="first steps left out (5)")
    parser.add_argument("--json", type=Path, default=None, help="also write the pairs here")
    args = parser.parse_args(argv)
    if len(args.runs) % 2:
        print("step_ratio: give the runs in pairs (base, SPECTRA)", file=sys.stderr)
        return 2
    runs = [medians(r, args.skip) for r in args.runs]
    pairs = [pair(b, s) for b, s in zip(runs[::2], runs[1::2], strict=True)]
    for p in pairs:
        b, s = p["base"], p["spectra"]
        print(f"{b['run']} / {s['run']}: optimizer {s['optimizer_ms']:.1f} against "
              f"{b['optimizer_ms']:.1f} ms on a {b['step_ms']:.1f} ms step: "
              f"{p['by_optimizer_time']:.3f}x by optimizer time, {p['by_step']:.3f}x by the "
              f"steps")  # fmt: skip
    if args.json is not None:
        report = {"machine": runs[0]["machine"], "skip": args.skip, "pairs": pairs}
        write_json_atomic(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
