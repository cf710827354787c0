"""The generated blocks of README.md and docs/, and the numbers of their prose.

A figure of the pages lives between two markers, ``<!-- PREFIX:NAME -->`` and
``<!-- /PREFIX:NAME -->``: on lines of their own for a table, inside a line for a number or a
phrase. What sits between them is rendered from a stored file, never typed:

* the ``study:`` blocks by ``experiments/study/report.py`` (the reproduction study's sweeps
  under ``results/study/``);
* every other block by :data:`BLOCKS` here (``spectra docs`` writes them, ``spectra docs
  --check`` compares them with their data).

Outside the blocks, prose holds no measurement. :func:`stray_numbers` lists the numbers of a
page that look like one (a decimal, a power of ten with a mantissa, a number with a unit, ×, %
or ±) and sit outside blocks, code, links and the paper's quotes (``<!-- paper -->`` …
``<!-- /paper -->``); what is not a measurement (versions, settings written ``c = 10``, powers
of ten such as ``1e-5``) is allowed by :data:`ALLOWED`.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path

from spectra_lab.errors import UserError

#: The pages: the README and every page under docs/.
PAGE_GLOBS = ("README.md", "docs/*.md")

MARKER = re.compile(r"<!-- ([a-z]+):([\w.-]+) -->")


def pages(root: Path) -> list[Path]:
    """The pages under ``root``, README first."""
    return [p for pattern in PAGE_GLOBS for p in sorted(root.glob(pattern))]


def block_pattern(key: str) -> re.Pattern:
    """The block ``key`` (``PREFIX:NAME``), its body as group 1."""
    k = re.escape(key)
    return re.compile(rf"<!-- {k} -->(.*?)<!-- /{k} -->", re.S)


def keys(text: str) -> list[str]:
    """The blocks of ``text``, in order, each once."""
    return list(dict.fromkeys(f"{p}:{n}" for p, n in MARKER.findall(text)))


def extract(text: str, key: str) -> str | None:
    """The body of the (first) block ``key`` of ``text``; None where there is none."""
    m = block_pattern(key).search(text)
    if m is None:
        return None
    body = m.group(1)
    return body[1:].removesuffix("\n") if body.startswith("\n") else body


def fill(text: str, key: str, body: str) -> str:
    """``text`` with every block ``key`` holding ``body``: on lines of their own where the
    opening marker ends its line, else inside the line (``body`` must then be one line)."""
    pattern = block_pattern(key)
    if not pattern.search(text):
        raise ValueError(f"no block <!-- {key} --> … <!-- /{key} -->")

    def sub(m: re.Match) -> str:
        if m.group(1).startswith("\n"):
            inner = "\n" + body.rstrip() + "\n"
        elif "\n" in body:
            raise ValueError(f"block {key} sits inside a line, and its text has line breaks")
        else:
            inner = body
        return f"<!-- {key} -->{inner}<!-- /{key} -->"

    return pattern.sub(sub, text)


def differences(text: str, bodies: dict[str, str]) -> list[str]:
    """A few lines of diff for each block of ``text`` that ``bodies`` renders otherwise."""
    out = []
    for key, body in bodies.items():
        old = extract(text, key)
        if old is None:
            continue
        new = extract(fill(text, key, body), key)
        if old != new:
            diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), "page", "data",
                                             n=0, lineterm=""))[2:]  # fmt: skip
            out.append(f"{key}: differs from the data")
            out += [f"  {line}" for line in diff[:12]]
    return out


# --------------------------------------------------------------------------- stray numbers

NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+−]?\d+)?")
UNIT = re.compile(r"\s?(?:×|%|ms\b|µs\b|s\b|min\b|GiB|GB|MiB|MB|KiB|tok/s|nats?\b)")

#: What a number outside a block may be, not being a measurement: a version (``torch
#: 2.13.0``), a setting or a definition written with its symbol (``c = 10``, ``σ ≤ 1.5``), a
#: power of ten with no mantissa (``1e-5``, a threshold or a tolerance), a model's size
#: (``3.3M``, ``1.5B``), a shape (``16 × 256``), a test's confidence level (``95% level``).
ALLOWED = {
    "version": re.compile(r"(?:torch|Python|transformers|CUDA|lm-eval|version|v)\s*$"),
    "setting": re.compile(r"(?:=|≤|≥|<|>|≈)\s*$"),
    "power of ten": re.compile(r"1e[-+−]?\d+"),
    "size": re.compile(r"[MBk]\b"),
    "shape": re.compile(r"\s?×\s?\d"),
    "confidence level": re.compile(r"% (?:level|quantile|confidence)"),
}


def prose(text: str) -> str:
    """``text`` without its blocks, the paper's quotes, code, links' targets and math."""
    text = re.sub(r"<!-- ([a-z]+:[\w.-]+|paper) -->.*?<!-- /\1 -->", " ", text, flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"https?://\S+", " ", text)
    return re.sub(r"\$[^$\n]*\$", " ", text)


def stray_numbers(text: str) -> list[str]:
    """The measurements of ``text``'s prose outside blocks (see the module docstring), each
    with a little of its line."""
    out = []
    for line in prose(text).splitlines():
        for m in NUMBER.finditer(line):
            if _measurement(line, m):
                out.append(line[max(0, m.start() - 30) : m.end() + 10].strip())
    return out


def _measurement(line: str, m: re.Match) -> bool:
    s, before, after = m.group(0), line[max(0, m.start() - 14) : m.start()], line[m.end() :]
    if re.match(r"\.\d", after) or ALLOWED["version"].search(before):
        return False  # a version, 2.13.0
    if any(ALLOWED[k].match(after) for k in ("size", "shape", "confidence level")):
        return False
    if UNIT.match(after) or re.match(r"\s*±", after) or re.search(r"±\s*$", before):
        return True
    if ALLOWED["power of ten"].fullmatch(s):
        return False
    return ("." in s or "e" in s) and not ALLOWED["setting"].search(before)


# --------------------------------------------------------------------------- the blocks


def _json(root: Path, path: str) -> dict:
    file = root / path
    if not file.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return json.loads(file.read_text())


def _main_job(root: Path, sweep: str = "main-job") -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in _json(root, f"results/{sweep}/results.json")["runs"]:
        out.setdefault(r["point"].get("optimizer", "spectra-adamw"), {})[r["seed"]] = r["val_loss"]
    return out


def _paired(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float]:
    """Mean, sample std and t of ``b − a`` over the seeds both hold."""
    d = [b[s] - a[s] for s in sorted(a) if s in b]
    mean, sd = statistics.fmean(d), statistics.stdev(d)
    return mean, sd, mean / (sd / math.sqrt(len(d)))


def main_job_table(root: Path) -> str:
    """The main job's table: seed 1337's loss and perplexity, mean ± std over the seeds."""
    runs = _main_job(root)
    rows = {
        "adamw": "| `adamw` (`clip_c=None`) |",
        "spectra-adamw": "| `spectra-adamw` (`clip_c=10`, standard schedule) |",
    }
    best = min(runs, key=lambda k: statistics.fmean(runs[k].values()))
    lines = ["| optimizer | val loss, seed 1337 | val perplexity, seed 1337 | val loss, mean ± std "
             f"over seeds {min(runs['adamw'])}–{max(runs['adamw'])} |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for name, vals in runs.items():
        s0 = vals[1337]
        cells = [
            f"{s0:.4f}",
            f"{math.exp(s0):.2f}",
            f"{statistics.fmean(vals.values()):.3f} ± {statistics.stdev(vals.values()):.3f}",
        ]
        if name == best:
            cells = [f"**{c}**" for c in cells]
        lines.append(f"{rows[name]} {' | '.join(cells)} |")
    return "\n".join(lines)


def main_job_paired(root: Path) -> str:
    """Δ = AdamW − Spectra-AdamW over the main job's seeds, with its t and verdict."""
    runs = _main_job(root)
    mean, sd, t = _paired(runs["spectra-adamw"], runs["adamw"])
    sig = "significant" if abs(t) > 4.303 else "not significant"  # Student's t, 2 dof
    return f"Δ = AdamW − Spectra-AdamW = {mean:.3f} ± {sd:.3f} (t = {t:.1f}, {sig}"


def main_job_mixed(root: Path) -> str:
    """The main job's Spectra-AdamW with ``mixed``, and its pairing against ``eigh``."""
    exact = _main_job(root)["spectra-adamw"]
    mixed = next(iter(_main_job(root, "main-job-mixed").values()))
    mean, sd, t = _paired(exact, mixed)
    ms = f"{statistics.fmean(mixed.values()):.4f} ± {statistics.stdev(mixed.values()):.4f}"
    sig = "significant" if abs(t) > 4.303 else "not significant"
    return f"end at {ms}, paired against `eigh` {mean:+.4f} ± {sd:.4f} (t = {t:.1f}, {sig})"


def _gpu_runs(root: Path) -> str:
    from spectra_lab.gpucheck.runs import runs_table

    return runs_table(root / "docs" / "data" / "gpu")


def _machines(root: Path) -> str:
    from spectra_lab.bench.machines import machines_table

    return machines_table(root / "docs" / "data")


def _bench_optim(name: str) -> Callable[[Path], str]:
    """The table of a stored ``spectra bench optim`` run (without its two header lines)."""

    def make(root: Path) -> str:
        from spectra_lab.bench.optim import format_table

        return "\n".join(format_table(_json(root, f"docs/data/{name}.json")).splitlines()[3:])

    return make


def _bench_step(name: str) -> Callable[[Path], str]:
    """The report of a stored ``spectra bench step`` run, as the command prints it (fenced)."""

    def make(root: Path) -> str:
        from spectra_lab.bench.step import format_report

        return "```\n" + format_report(_json(root, f"docs/data/{name}.json")).rstrip() + "\n```"

    return make


def _ops_cells(root: Path, name: str) -> list:
    from spectra_lab.bench.ops_report import Cell

    return [Cell(**c) for c in _json(root, f"docs/data/{name}.json")["cells"]]


def ops_table(cells: list, columns: tuple[str, ...] = ("polar", "eigh64")) -> str:
    """A stored ``spectra bench ops`` run, one row per input: ``auto``'s time, its ratios to
    the paper's runs and the three errors, then each of ``columns``' time ÷ paper fp32."""
    from spectra_lab.bench.ops_report import _by_input
    from spectra_lab.bench.tables import markdown_table

    def ratio(x: float, fmt: str) -> str:
        return "–" if math.isnan(x) else f"{x:{fmt}}"

    rows = []
    for (shape, dtype, kind), by in _by_input(cells).items():
        auto, fp32, bf16 = by["auto"], by["paper_fp32"], by.get("paper_bf16")
        rows.append([shape, dtype, kind, f"{auto.sigma_over_c:.3g}", f"{auto.time_ms:.4g}",
                     ratio(auto.vs_paper_fp32, ".2f"), ratio(auto.vs_paper_bf16, ".3f"),
                     f"{auto.rel_err:.1e}", f"{fp32.rel_err:.1e}",
                     "skipped" if bf16 is None else f"{bf16.rel_err:.1e}",
                     *(ratio(by[m].vs_paper_fp32, ".2f") for m in columns)])  # fmt: skip
    head = ["shape", "dtype", "input", "σ_max/c", "`auto` ms", "÷ paper fp32", "÷ paper bf16",
            "`auto` error", "paper fp32 error", "paper bf16 error",
            *(f"`{m}` ÷ paper fp32" for m in columns)]  # fmt: skip
    return markdown_table(head, rows, "lll" + "r" * (len(head) - 3))


def _ops(name: str, what: str) -> Callable[[Path], str]:
    """A table of the stored ``spectra bench ops`` run ``name``: ``cells`` (:func:`ops_table`)
    or ``summary`` (per method, as the command prints it)."""

    def make(root: Path) -> str:
        from spectra_lab.bench.ops_report import sizes_table, summary

        cells = _ops_cells(root, name)
        return {"cells": ops_table, "summary": summary, "sizes": sizes_table}[what](cells)

    return make


def _gpu_model(root: Path) -> str:
    """The stored H100 flop and launch model's table (``spectra bench gpu-model``)."""
    from spectra_lab.estimate.gpu_model import format_report

    return "\n".join(format_report(_json(root, "docs/data/gpu_model_h100.json")).splitlines()[2:])


def _gpu_summary(root: Path) -> str:
    """The summary of the latest stored GPU check (``make gpu-check``)."""
    from spectra_lab.gpucheck.check import markdown_summary

    return markdown_summary(root / "docs" / "data" / "gpu").rstrip()


#: Every block outside the study, by key: what renders it from the files under the root.
BLOCKS: dict[str, Callable[[Path], str]] = {
    "gpu:runs": _gpu_runs,
    "gpu:summary": _gpu_summary,
    "data:machines": _machines,
    "data:main-job": main_job_table,
    "data:main-job-paired": main_job_paired,
    "data:main-job-mixed": main_job_mixed,
    "data:gpu-model-h100": _gpu_model,
    **{f"data:{name.replace('_', '-')}": _bench_optim(name) for name in (
        "bench_optim_cpu_2threads", "bench_optim_memory_cpu_2threads",
        "bench_optim_memory_cpu_1thread", "bench_optim_peers_cpu_2threads",
        "bench_optim_cpu_native_bf16_2threads")},
    "data:bench-ops-cpu": _ops("bench_ops_cpu", "cells"),
    **{f"data:{name.replace('_', '-')}-summary": _ops(name, "summary") for name in (
        "bench_ops_cpu", "bench_ops_cpu_recorded")},
    "data:bench-ssc-vs-orth-cpu": _ops("bench_ssc_vs_orth_cpu", "sizes"),
    **{f"data:{name.replace('_', '-')}": _bench_step(name) for name in (
        "bench_step_main_job_2threads", "bench_step_main_job_1thread")},
}  # fmt: skip

#: The blocks rendered elsewhere: prefix → the command that renders them.
ELSEWHERE = {"study": "python experiments/study/report.py"}


def render(root: Path) -> dict[str, str]:
    """The body of every block of :data:`BLOCKS`."""
    return {key: make(root) for key, make in BLOCKS.items()}


def problems(root: Path) -> list[str]:
    """What is wrong with the pages' blocks: a block nobody renders, one rendered but on no
    page, one that differs from its data (with a diff)."""
    bodies = render(root)
    out, seen = [], set()
    for page in pages(root):
        text = page.read_text()
        for key in keys(text):
            seen.add(key)
            if key not in bodies and key.split(":")[0] not in ELSEWHERE:
                out.append(f"{page.relative_to(root)}: {key}: no renderer (spectra_lab.pages)")
        out += [f"{page.relative_to(root)}: {line}" for line in differences(text, bodies)]
    out += [f"{key}: rendered but on no page" for key in bodies if key not in seen]
    return out


def write(root: Path) -> list[Path]:
    """Rewrite every block of :data:`BLOCKS` in the pages; the pages changed."""
    from spectra_lab.files import atomic_write

    bodies, changed = render(root), []
    for page in pages(root):
        text = page.read_text()
        new = text
        for key in keys(text):
            if key in bodies:
                new = fill(new, key, bodies[key])
        if new != text:
            atomic_write(page, new)
            changed.append(page)
    return changed


# --------------------------------------------------------------------------- spectra docs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=".", help="the source tree (default: the current folder)")
    p.add_argument("--check", action="store_true",
                   help="write nothing: exit 1, with a diff, where a block differs from its "
                   "data")  # fmt: skip
    p.add_argument(
        "--strays",
        action="store_true",
        help="list the measurements of each page's prose that sit outside a block",
    )


def run(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if not (root / "README.md").is_file():
        raise UserError(f"--root {args.root}: no README.md there (run from the source tree)")
    try:
        if args.strays:
            for page in pages(root):
                for s in stray_numbers(page.read_text()):
                    print(f"{page.relative_to(root)}: {s}")
            return 0
        if args.check:
            found = problems(root)
            print("\n".join(found) or f"all {len(BLOCKS)} blocks agree with their data")
            return 1 if found else 0
        changed = write(root)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    print(f"{len(changed)} page(s) rewritten: {', '.join(str(p) for p in changed) or 'none'}")
    return 0
