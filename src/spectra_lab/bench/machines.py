"""The machines behind the stored measurements under ``docs/data/``: one row per machine as the
files record it, rendered as the table the docs show (``machines_table``).

A file names its machine through the fields :func:`spectra_lab.machine.device_about`
writes (``gpu``; ``cpu`` and ``cpu_bf16``; ``threads``, ``torch``), or, for a GPU run, through
its ``gpu_check.json``. Files written before the CPU's model was recorded say only what they
hold; the table says so rather than guess.

A stored figure goes stale when a later commit changes the code it measures
(:data:`MEASURED_CODE`): :func:`stale_runs` lists such runs, from the commit each file records,
or, for a file that records none, the commit that stored it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

#: The code the stored measurements measure: a later commit that changes it makes them stale.
MEASURED_CODE = ("src/spectra/ops", "src/spectra/optim")


def machine_of(report: dict[str, Any]) -> str:
    """What a stored report says of its machine, in words."""
    if "not a measurement" in str(report.get("what", "")):
        return "none: a model, not a measurement"
    about = report.get("machine", report)  # some experiments nest it
    device = str(about.get("device"))
    gpu = about.get("gpu") or (device if device.startswith("NVIDIA") else None)
    if isinstance(gpu, str) and gpu:
        return gpu if gpu.startswith("NVIDIA") else f"none: a plan for {gpu.upper()} GPUs"
    if about.get("device") == "cuda":
        return "a CUDA GPU, its name not recorded"
    cpu = about.get("cpu") or "CPU, model not recorded"
    bf16 = about.get("cpu_bf16")
    if bf16 is None and "bf16_units" in about:
        bf16 = "native" if about["bf16_units"] else "emulated"
    return f"{cpu}, bf16 {bf16}" if bf16 else f"{cpu}, bf16 support not recorded"


def machine_at(root: str | Path, path: str) -> str:
    """The machine a stored file under ``root`` names, in words, with its threads, torch and
    commit where it records them: a GPU run's file names its run's GPU, date and commit
    (``gpu_check.json`` of its folder; for a copy directly under ``docs/data/gpu/``, of the
    latest run that holds the same file, since a targeted or failed part leaves an earlier
    run's copy there; a file of no run, what it records itself)."""
    root, parts = Path(root), path.split("/")
    if parts[:3] == ["docs", "data", "gpu"]:
        folder = gpu_run_of(root, path)
        if folder is not None:
            index = json.loads((folder / "gpu_check.json").read_text())
            return f"{index['gpu']}, {index['date']}, commit {index['commit']}"
    if parts[:2] != ["docs", "data"]:
        return runs_machines(root.joinpath(*parts[:-1]))
    report = json.loads((root / path).read_text())
    about = report.get("machine", report)
    words = [machine_of(report)]
    if about.get("threads"):
        words.append(f"{about['threads']} thread{'s' if about['threads'] > 1 else ''}")
    if about.get("torch"):
        words.append(f"torch {about['torch']}")
    words.append(f"commit {about['commit']}" if about.get("commit") else "commit not recorded")
    return ", ".join(words)


def gpu_run_of(root: Path, path: str) -> Path | None:
    """The folder of the GPU run a file under ``docs/data/gpu/`` belongs to: its own run folder,
    or for a copy directly there (and for the index, the list and the summary) the latest run
    that holds the same bytes; ``None`` for a file no run holds (a command of its own)."""
    file = root / path
    gpu = root / "docs" / "data" / "gpu"
    if file.parent != gpu:
        return file.parent
    if file.name in ("gpu_check.json", "runs.json", "summary.md"):
        return gpu
    listed = gpu / "runs.json"
    runs = json.loads(listed.read_text())["runs"] if listed.is_file() else []
    data = file.read_bytes()
    for run in sorted(runs, key=lambda r: r["date"], reverse=True):
        copy = gpu / run["folder"] / file.name
        if copy.is_file() and copy.read_bytes() == data:
            return copy.parent
    return None


def runs_machines(folder: Path) -> str:
    """The machines that the finished runs of a sweep (``folder/results.json``) record (in the
    results themselves, else in each run's ``run.json``, where the trainer records its
    machine), with how many runs each; runs without a record are counted as such."""
    results = folder / "results.json"
    runs = json.loads(results.read_text()).get("runs", []) if results.is_file() else []
    count: dict[str, int] = {}
    for run in runs:
        if run.get("status") != "done":
            continue
        about = folder / "runs" / run["name"] / "run.json"
        machine = run.get("machine")
        if machine is None and about.is_file():
            machine = json.loads(about.read_text()).get("machine")
        name = machine_of(machine) if machine else "not recorded"
        count[name] = count.get(name, 0) + 1
    if not count:
        return "not recorded"
    return "; ".join(f"{m} ({n} run{'s' if n > 1 else ''})" for m, n in sorted(count.items()))


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


def stored_runs(data_dir: str | Path) -> list[tuple[str, str | None]]:
    """Each stored measurement under ``data_dir`` (a JSON report, a GPU run's folder) and the
    commit it records (``None`` where it records none); models and plans are left out."""
    data_dir = Path(data_dir)
    out: list[tuple[str, str | None]] = []
    for path in sorted(data_dir.glob("*.json")):
        report = json.loads(path.read_text())
        if isinstance(report, dict) and not machine_of(report).startswith("none:"):
            out.append((path.name, report.get("machine", report).get("commit")))
    runs = data_dir / "gpu" / "runs.json"
    if runs.exists():
        out += [(f"gpu/{r['folder']}/", r["commit"]) for r in json.loads(runs.read_text())["runs"]]
    return out


def _git(root: Path, *args: str) -> str | None:
    out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else None


def stale_runs(root: str | Path) -> list[str]:
    """The stored measurements under ``root/docs/data`` whose commit predates a change to
    :data:`MEASURED_CODE`, one line each, with how many later commits change it; empty outside
    a git checkout. A file that records no commit is dated by the commit that stored it."""
    root = Path(root)
    if _git(root, "rev-parse", "--git-dir") is None:
        return []
    out = []
    for name, commit in stored_runs(root / "docs" / "data"):
        how = f"commit {commit}"
        if not commit:
            commit = _git(root, "log", "-1", "--format=%h", "--", f"docs/data/{name}")
            how = f"records no commit; stored at {commit}"
        later = _git(root, "rev-list", "--count", f"{commit}..HEAD", "--", *MEASURED_CODE)
        if commit and later and int(later):
            out.append(f"docs/data/{name} ({how}): {later} later commits change "
                       f"{', '.join(MEASURED_CODE)}")  # fmt: skip
    return out
