"""What the block renderers share: reading the stored files, formatting numbers the way the
pages write them, and Markdown tables."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path


def json_of(root: Path, path: str) -> dict:
    file = root / path
    if not file.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return json.loads(file.read_text())


def main_job_losses(root: Path, sweep: str = "main-job") -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in json_of(root, f"results/{sweep}/results.json")["runs"]:
        out.setdefault(r["point"].get("optimizer", "spectra-adamw"), {})[r["seed"]] = r["val_loss"]
    return out


def paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float]:
    """Mean, sample std and t of ``b − a`` over the seeds both hold."""
    d = [b[s] - a[s] for s in sorted(a) if s in b]
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    return mean, sd, mean / (sd / math.sqrt(len(d)))


def table(header: list[str], rows: list[list[str]], align: str) -> str:
    from spectra_lab.bench.tables import markdown_table

    return markdown_table(header, rows, align).rstrip()


MIB = 1 << 20
#: The main job's target for SPECTRA-AdamW's training step against its AdamW twin.
STEP_TARGET = 1.05


def short(x: float) -> str:
    """A step size or a small loss as the synthetic pages write it: ``3.16``, ``0.1``,
    ``1e-4``, ``3.2e-5``."""
    return f"{x:.3g}" if 0.01 <= x < 1000 else lr_text(x)


def lr_text(x: float) -> str:
    """A learning rate as ``4e-3`` or ``3.2e-2``."""
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exp)}"


def loss_text(x: float) -> str:
    return f"{x:.3f}" if x >= 0.1 else f"{x:.1e}".replace("e-0", "e-")


def residual_text(x: float) -> str:
    return f"{x:.2f}" if x >= 0.1 else f"{x:.1e}".replace("e-0", "e-")


def sci(x: float) -> str:
    """``4.9e-6``: one decimal, the exponent without a leading zero."""
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exp)}"


def value_range(vals: list[float], fmt: str = ".2f") -> str:
    lo, hi = min(vals), max(vals)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def span(cells: list, method: str) -> str:
    vals = [c.vs_paper_bf16 for c in cells if c.method == method]
    return f"{min(vals):.2f}–{max(vals):.2f}"


def worst(cells: list, method: str) -> str:
    return f"≤ {max(c.rel_err for c in cells if c.method == method):.1e}"


def ops_cells(root: Path, name: str) -> list:
    from spectra_lab.bench.ops_report import Cell

    return [Cell(**c) for c in json_of(root, f"docs/data/{name}.json")["cells"]]


def latest_gpu(root: Path, gpu: str, holding: str = "gpu_check.json") -> Path:
    """The folder of the latest stored GPU run of ``gpu`` (``"H100"``, ``"H200"``) that holds
    the file ``holding`` (a targeted rerun holds only the parts it ran)."""
    runs = [r for r in json_of(root, "docs/data/gpu/runs.json")["runs"]
            if gpu in r["gpu"] and holding in r["files"]]  # fmt: skip
    if not runs:
        raise FileNotFoundError(f"no stored {gpu} run with {holding} in docs/data/gpu/runs.json")
    return root / "docs" / "data" / "gpu" / max(runs, key=lambda r: r["date"])["folder"]


def polar_and_mixed(figures: dict[str, float]) -> tuple[float, float]:
    """A GPU run's figures of Spectra-AdamW by ``polar`` and by ``mixed``: ``polar`` is the row
    ``spectra-adamw-polar``, or ``spectra-adamw`` in the runs made while it was the CUDA
    default."""
    polar = figures["spectra-adamw-polar" if "spectra-adamw-polar" in figures else "spectra-adamw"]
    return polar, figures["spectra-adamw-mixed"]


def err_range(lo: float, hi: float) -> str:
    """An error range as the operator tables write it: ``3.8–4.3e-4``, ``2.0e-5`` where the two
    round alike, ``0.09–0.17`` from 0.05 on."""
    if hi >= 0.05:
        return f"{lo:.2f}–{hi:.2f}"
    exp = math.floor(math.log10(hi))
    a, b = f"{lo / 10**exp:.1f}", f"{hi / 10**exp:.1f}"
    return f"{b}e{exp}" if a == b else f"{a}–{b}e{exp}"
