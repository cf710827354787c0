"""The tables of a ``make gpu-check`` run (``summary.md``, and docs/gpu.md's ``gpu:summary``),
rendered from the files the run wrote: only the files of parts that measured something in
that run, since an earlier run's copies may lie beside them."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

#: The statuses of a part whose figures count: all its rows, or some (the rest failed)
MEASURED = ("passed", "partial")
#: The profile part's file: one default Spectra-AdamW step at the 124M shapes
PROFILE_FILE = "profile_124m_step.txt"


def optim_part(size: str, tf32: bool) -> str:
    """The name of a ``bench optim`` part (and of its file): ``bench_optim[_780m][_tf32]``."""
    return "bench_optim" + (f"_{size}" if size else "") + ("_tf32" if tf32 else "")


def ops_figures(path: Path) -> dict[str, tuple[float, float, float]]:
    """Per method of a ``bench ops`` file: the median time ÷ the paper's bf16 run, and the
    worst error on float32 and on bf16 inputs."""
    cells = json.loads(path.read_text())["cells"]
    out = {}
    for m in dict.fromkeys(c["method"] for c in cells):
        mine = [c for c in cells if c["method"] == m]
        ratios = [c["vs_paper_bf16"] for c in mine if c["vs_paper_bf16"] == c["vs_paper_bf16"]]
        worst = [max(c["rel_err"] for c in mine if c["dtype"] == d) for d in ("fp32", "bf16")]
        out[m] = (statistics.median(ratios), *worst)
    return out


def ops_cells(path: Path) -> str:
    """What a ``bench ops`` file's cells are, per method: ``"48 cells: 12 synthetic (...) and
    36 recorded (...)"``, from the file itself."""
    cells = json.loads(path.read_text())["cells"]
    first = cells[0]["method"]
    mine = [c for c in cells if c["method"] == first]
    recorded = [c for c in mine if "@" in c["input"]]  # recorded inputs: optimizer@step/group
    synthetic = [c for c in mine if "@" not in c["input"]]

    def shapes(cs: list[dict[str, Any]]) -> str:
        return ", ".join(dict.fromkeys(c["shape"].replace("x", "×") for c in cs))

    def inputs(cs: list[dict[str, Any]]) -> str:
        return ", ".join(dict.fromkeys(c["input"] for c in cs))

    parts = []
    if synthetic:
        parts.append(f"{len(synthetic)} of inputs {inputs(synthetic)} at {shapes(synthetic)}")
    if recorded:
        parts.append(f"{len(recorded)} of recorded optimizer directions at {shapes(recorded)}")
    return f"{len(mine)} cells: " + " and ".join(parts)


def markdown_summary(folder: str | Path) -> str:
    """The tables of docs/gpu.md, from the files a gpu-check wrote into ``folder``."""
    folder = Path(folder)
    index = json.loads((folder / "gpu_check.json").read_text())
    parts = index["parts"]
    lines = [f"{index['gpu']}, torch {index['torch']} (CUDA {index['cuda']}), {index['date']}, "
             f"commit {index['commit']}", ""]  # fmt: skip
    kept: dict[tuple[str, str], list[str]] = {}
    for name, part in parts.items():
        if "measured" in part and (part.get("status") in MEASURED or "tests" in part):
            kept.setdefault((part["measured"], part["commit"]), []).append(f"`{name}`")
    for (date, commit), names in kept.items():
        lines += [f"A targeted rerun: {', '.join(names)} below come from the run of {date} at "
                  f"commit {commit}.", ""]  # fmt: skip
    t = parts.get("tests", {})
    if "passed" in t:
        failed = (
            json.loads((folder / "tests.json").read_text())["failed"] if t.get("failed") else []
        )
        failures = ", ".join(f"`{f['name']}`" for f in failed)
        lines += [f"CUDA tests: {t['passed']} of {t['tests']} passed"
                  + (f"; failed: {failures}" if failures else ""), ""]  # fmt: skip
    ran = {p.get("file") for p in parts.values() if p.get("status") in MEASURED}
    if "train.json" in ran:  # files of this run only: an older run's may lie beside them
        lines += train_table(json.loads((folder / "train.json").read_text()))
    if "overhead.json" in ran:
        lines += overhead_table(json.loads((folder / "overhead.json").read_text()))
    for size, heading in (("", "124M shapes (`bench optim`, float32 parameters, median of 10)"),
                          ("780m", "780M shapes (float32 parameters, median of 4)")):  # fmt: skip
        lines += optim_table(parts, size, heading)
    lines += capturable_table(parts.get(optim_part("capturable", False), {}))
    if "bench_products.json" in ran:
        lines += products_table(json.loads((folder / "bench_products.json").read_text()))
    if parts.get("profile", {}).get("status") == "passed":
        lines += [f"One default Spectra-AdamW step at the 124M shapes under `torch.profiler`, "
                  f"its top 30 kernels by CUDA time: `{PROFILE_FILE}`.", ""]  # fmt: skip
    if all(parts.get(p, {}).get("status") == "passed" for p in ("bench_ops", "bench_ops_tf32")):
        full, tf32 = (ops_figures(folder / f) for f in ("bench_ops.json", "bench_ops_tf32.json"))
        cells = ops_cells(folder / "bench_ops.json")
        lines += [
            f"Soft clipping, one matrix per call (`bench ops`, {cells}, float32 and bf16; "
            "errors against the float64 SVD, where bf16 rounding alone gives "
            "1.7e-3):",
            "",
            "| method | median ÷ paper bf16 | median ÷ paper bf16, TF32 | worst error, float32 "
            "input | worst error, bf16 input |",
            "|---|---:|---:|---:|---:|",
        ]
        for m, (ratio, err32, err16) in full.items():
            lines.append(f"| `{m}` | {ratio:.2f} | {tf32[m][0]:.2f} | {err32:.1e} | {err16:.1e} |")
        lines.append("")
    return "\n".join(lines)


def products_table(report: dict[str, Any]) -> list[str]:
    """The clip's products in each form (``bench_products.json``)."""
    from spectra_lab.bench.products import format_table

    return [f"One batched product of the clip's shapes in each form (`bench products`, median "
            f"of {report['repeats']}; TFLOP/s of the product's own flops):", "",
            format_table(report["rows"]), ""]  # fmt: skip


def train_table(train: dict[str, Any]) -> list[str]:
    """The markdown lines of the training part's runs (a failed run named with its error)."""
    lines = [
        f"124M, {train['batch_size']}×512 tokens per step, bf16 autocast, median of steps "
        f"{train['median_after_step'] + 1}–{train['steps']}:",
        "",
        "| optimizer | torch.compile | tokens/s | × torch AdamW | MFU | peak GB |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in train["runs"]:
        compiled = "yes, and the capturable step" if r.get("capturable") else "yes"
        if "error" in r:
            lines.append(f"| `{r['optimizer']}` | {compiled if r['compile'] else 'no'} | "
                         f"failed: {r['error']} | | | |")  # fmt: skip
            continue
        lines.append(
            f"| `{r['optimizer']}` | {compiled if r['compile'] else 'no'} | "
            f"{r['tokens_per_s']:,} | {r.get('tokens_per_s_vs_torch_adamw', math.nan):.2f} | "
            f"{100 * r['mfu']:.1f}% | {r['peak_mem_gb']:.1f} |"
        )
    lines.append("")
    return lines


def overhead_table(over: dict[str, Any]) -> list[str]:
    """The markdown lines of the overhead part's runs (a failed run named with its error)."""
    lines = [
        f"124M compiled at the paper's tokens per GPU step ({over['batch_size']}×512 "
        f"tokens × {over['grad_accum']} accumulation steps), bf16 autocast, median of steps "
        f"{over['median_after_step'] + 1}–{over['steps']}:",
        "",
        "| optimizer | step ms | optimizer share | overhead over torch AdamW |",
        "|---|---:|---:|---:|",
    ]
    for r in over["runs"]:
        name = f"`{r['optimizer']}`" + (", capturable" if r.get("capturable") else "")
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error']} | | |")
            continue
        share = r.get("optimizer_share")
        lines.append(f"| {name} | {r['step_ms']:.1f} | "
                     f"{'–' if share is None else f'{100 * share:.1f}%'} | "
                     f"{100 * r['overhead']:+.1f}% |")  # fmt: skip
    lines.append("")
    return lines


def optim_table(parts: dict[str, Any], size: str, heading: str) -> list[str]:
    """The markdown lines of one ``bench optim`` pair, if its float32 part passed; the TF32
    columns read "–" where that part did not (a budget that ran out first)."""
    full, tf32 = (parts.get(optim_part(size, t), {}) for t in (False, True))
    if full.get("status") not in MEASURED:
        return []
    with_tf32 = tf32.get("status") in MEASURED
    if full.get("vs_torch_muon"):  # a run with the peers: their ratios and the peak memory
        return peers_table(full, tf32 if with_tf32 else None, heading)
    lines = [
        f"Optimizer step at the {heading}:",
        "",
        "| method | step ms | × paper bf16 | step ms, TF32 | × paper bf16, TF32 |",
        "|---|---:|---:|---:|---:|",
    ]
    for m, ms in full["step_ms"].items():
        tf = f"{tf32['step_ms'][m]:.1f} | {tf32['vs_paper_bf16'][m]:.2f}" if with_tf32 else "– | –"
        lines.append(f"| `{m}` | {ms:.1f} | {full['vs_paper_bf16'][m]:.2f} | {tf} |")
    return [*lines, ""]


def capturable_table(part: dict[str, Any]) -> list[str]:
    """The markdown lines of the capturable part, if it measured anything (a row that failed
    is named with its error)."""
    if part.get("status") not in MEASURED:
        return []
    lines = [
        "The step without host reads and the bf16-first products (124M shapes, float32 "
        "parameters, median of 5):",
        "",
        "| method | step ms | × torch AdamW | peak × torch AdamW |",
        "|---|---:|---:|---:|",
    ]
    for m, ms in part["step_ms"].items():
        peak = part["peak_vs_torch_adamw"].get(m)
        lines.append(f"| `{m}` | {ms:.1f} | {part['vs_torch_adamw'][m]:.2f} | "
                     f"{'–' if peak is None else f'{peak:.2f}'} |")  # fmt: skip
    lines += ["", *(f"`{m}` failed: {e}" for m, e in part.get("failed_rows", {}).items())]
    return [*lines, ""]


def peers_table(full: dict[str, Any], tf32: dict[str, Any] | None, heading: str) -> list[str]:
    """The markdown lines of a ``bench optim`` part that ran the peers: each row's step, its
    multiples of torch AdamW's, of torch Muon's and of the paper's bf16 wrapper's, its peak
    memory over torch AdamW's, and its step with TF32 ("–" where a figure is missing)."""

    def cell(figures: dict[str, Any] | None, key: str, m: str, fmt: str) -> str:
        value = (figures or {}).get(key, {}).get(m)
        return "–" if value is None else f"{value:{fmt}}"

    lines = [
        f"Optimizer step at the {heading}:",
        "",
        "| method | step ms | × torch AdamW | × torch Muon | × paper bf16 | peak ÷ torch AdamW "
        "| step ms, TF32 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for m in full["step_ms"]:
        keys = ("step_ms", "vs_torch_adamw", "vs_torch_muon", "vs_paper_bf16",
                "peak_vs_torch_adamw")  # fmt: skip
        cells = [cell(full, k, m, ".1f" if k == "step_ms" else ".2f") for k in keys]
        cells.append(cell(tf32, "step_ms", m, ".1f"))
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    return [*lines, ""]
