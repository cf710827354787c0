"""The machines behind the stored measurements under ``docs/data/``: one row per machine as the
files record it, rendered as the table the docs show (``machines_table``).

A file names its machine through the fields :func:`spectra_lab.bench.precision.device_about`
writes (``gpu``; ``cpu`` and ``cpu_bf16``; ``threads``, ``torch``), or, for a GPU run, through
its ``gpu_check.json``. Files written before the CPU's model was recorded say only what they
hold; the table says so rather than guess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def machine_of(report: dict[str, Any]) -> str:
    """What a stored report says of its machine, in words."""
    if "not a measurement" in str(report.get("what", "")):
        return "none: a model, not a measurement"
    about = report.get("machine", report)  # some experiments nest it
    gpu = about.get("gpu")
    if isinstance(gpu, str) and gpu:
        return gpu if gpu.startswith("NVIDIA") else f"none: a plan for {gpu.upper()} GPUs"
    if about.get("device") == "cuda":
        return "a CUDA GPU, its name not recorded"
    cpu = about.get("cpu") or "CPU, model not recorded"
    bf16 = about.get("cpu_bf16")
    if bf16 is None and "bf16_units" in about:
        bf16 = "native" if about["bf16_units"] else "emulated"
    return f"{cpu}, bf16 {bf16}" if bf16 else f"{cpu}, bf16 support not recorded"


def machines(data_dir: str | Path) -> dict[str, list[str]]:
    """Each machine (:func:`machine_of`) and the files under ``data_dir`` measured on it: the
    JSON reports directly under it, and every stored GPU run (``gpu/runs.json``)."""
    data_dir = Path(data_dir)
    out: dict[str, list[str]] = {}
    for path in sorted(data_dir.glob("*.json")):
        report = json.loads(path.read_text())
        if isinstance(report, dict):
            out.setdefault(machine_of(report), []).append(path.name)
    runs = data_dir / "gpu" / "runs.json"
    if runs.exists():
        for run in json.loads(runs.read_text())["runs"]:
            out.setdefault(run["gpu"], []).append(f"gpu/{run['folder']}/")
    return out


def machines_table(data_dir: str | Path) -> str:
    """The markdown table of :func:`machines`: machine, how many files, which."""
    lines = ["| machine (as the files record it) | files | under `docs/data/` |", "|---|---:|---|"]
    for machine, files in sorted(machines(data_dir).items()):
        names = ", ".join(f"`{f}`" for f in files)
        lines.append(f"| {machine} | {len(files)} | {names} |")
    return "\n".join(lines)
