"""The GPU runs kept on disk: each ``make gpu-check`` run copied whole into
``docs/data/gpu/<gpu>/<date>/`` and listed in ``docs/data/gpu/runs.json``, so that a figure a page
quotes stays with its run after the next run rewrites the files directly under
``docs/data/gpu/``."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from spectra_lab.files import write_json_atomic


def run_names(out: Path, index: dict[str, Any]) -> list[str]:
    """The files of one run under ``out``: the index, ``summary.md`` and every part's file."""
    names = ["gpu_check.json", "summary.md"]
    # (not the files of the parts a targeted rerun kept from an earlier run: that run has them)
    names += [p["file"] for p in index["parts"].values() if p.get("file") and "measured" not in p]
    return [n for n in dict.fromkeys(names) if (out / n).is_file()]


def gpu_slug(gpu: str) -> str:
    """A folder name for a GPU's runs: its model (``"NVIDIA H100 80GB HBM3"`` → ``h100``)."""
    model = re.search(r"\b([A-Z]+\d{2,4}[A-Za-z]?)\b", gpu)
    return (model.group(1) if model else re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-")).lower()


def keep_run(out: Path, index: dict[str, Any]) -> Path:
    """Copy the run's files into ``out/<gpu>/<date>/`` and list it in ``out/runs.json``, so that
    every run a page quotes stays on disk after the next run rewrites ``out``."""
    stamp = index["date"].replace(" UTC", "").replace(" ", "-").replace(":", "")
    folder = out / gpu_slug(index["gpu"]) / stamp
    folder.mkdir(parents=True, exist_ok=True)
    names = run_names(out, index)
    for n in names:
        shutil.copyfile(out / n, folder / n)
    listed = out / "runs.json"
    runs = json.loads(listed.read_text())["runs"] if listed.exists() else []
    entry = {"gpu": index["gpu"], "date": index["date"], "commit": index["commit"],
             "torch": index["torch"], "folder": str(folder.relative_to(out)),
             "files": names}  # fmt: skip
    runs = [r for r in runs if r["folder"] != entry["folder"]] + [entry]
    write_json_atomic(listed, {"runs": runs})
    return folder


def runs_table(out: str | Path) -> str:
    """The markdown table of every stored GPU run (``runs.json``): machine, date, commit."""
    runs = json.loads((Path(out) / "runs.json").read_text())["runs"]
    lines = ["| GPU | date | commit measured | torch | folder under `docs/data/gpu/` |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        lines.append(f"| {r['gpu']} | {r['date']} | {r['commit'] or 'unknown'} | "
                     f"{r['torch']} | `{r['folder']}/` |")  # fmt: skip
    return "\n".join(lines)
