"""The Markdown table of a ``spectra bench optim`` report (what the docs quote)."""

from __future__ import annotations

from typing import Any


def format_table(report: dict[str, Any]) -> str:
    """The report as a heading line and a Markdown table (what the docs quote)."""

    def num(x: float | None, fmt: str, scale: float = 1.0) -> str:
        return "–" if x is None else f"{x / scale:{fmt}}"

    muon = any("vs_muon" in r for r in report["rows"])  # a column only where Muon ran
    lines = [
        f"device {report['device']}, {report['dtype']}, {report['num_params'] / 1e6:.1f}M "
        f"parameters in {report['num_tensors']} tensors, median of {report['repeats']} steps, "
        f"{report['threads']} threads, torch {report['torch']}",
        f"memory: {report.get('memory', 'not measured')}",
        "",
        "| method | step (s) | × torch" + (" | × torch Muon" if muon else "")
        + " | × paper bf16 | × paper fp32 | peak MiB | × torch | transient MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if muon else ""),
    ]  # fmt: skip
    for r in report["rows"]:
        cells = [
            f"`{r['method']}`",
            num(r["step_s"], ".3f"),
            num(r.get("time_ratio"), ".2f"),
            *([num(r.get("vs_muon"), ".2f")] if muon else []),
            num(r.get("vs_bf16"), ".3f"),
            num(r.get("vs_fp32"), ".3f"),
            num(r.get("peak_bytes"), ".0f", 1 << 20),
            num(r.get("peak_ratio"), ".3f"),
            num(r.get("transient_bytes"), ".0f", 1 << 20),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for r in report["rows"]:
        if r.get("error"):
            lines.append(f"`{r['method']}` failed: {r['error']}")
    lines += report.get("notes", [])
    return "\n".join(lines)
