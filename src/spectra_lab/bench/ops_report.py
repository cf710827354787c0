"""The results of ``spectra bench ops``: one :class:`Cell` per (input, dtype, method), and the
tables and figures made of them (see :mod:`spectra_lab.bench.ops`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from spectra_lab.bench.matrices import CLIP_C, square_size
from spectra_lab.bench.tables import markdown_table, text_table
from spectra_lab.files import save_figure


@dataclass
class Cell:
    """One method on one input matrix in one dtype: its median time, ratios and error."""

    shape: str
    dtype: str
    input: str
    method: str
    time_ms: float
    runs: int
    vs_paper_bf16: float  # nan where the paper's bf16 run was skipped
    vs_paper_fp32: float
    rel_err: float
    sigma_over_c: float  # σ_max/c of the (dtype-rounded) input


#: Legend of the ``--plot-sizes`` figure; other methods appear under their own name.
METHOD_LABELS = {
    "paper_bf16": "SSC, Algorithm 1, N_s=10, bf16",
    "paper_fp32": "SSC, Algorithm 1, N_s=10, fp32",
    "auto": "SSC, soft_clip default (auto)",
    "orth_muon": "orthogonalization, 5 NS steps, bf16",
    "orth_muon_fp32": "orthogonalization, 5 NS steps, fp32",
}
#: (soft clipping, orthogonalization) pairs whose time ratio the ``--sizes`` table reports:
#: Newton–Schulz in the same precision, and our default against the float32 one.
SIZE_RATIOS = (
    ("paper_bf16", "orth_muon"),
    ("paper_fp32", "orth_muon_fp32"),
    ("auto", "orth_muon_fp32"),
)


def pareto_plot(cells: list[Cell], path: str) -> None:
    """Error against time, one colour per method. Time ÷ the paper's bf16 run in the same cell
    where that ran in every cell (on GPUs and CPUs with bf16 units), else ÷ its fp32 run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    bf16 = all(math.isfinite(c.vs_paper_bf16) for c in cells if not c.method.startswith("orth"))
    field, ref = ("vs_paper_bf16", "bf16") if bf16 else ("vs_paper_fp32", "fp32")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = [n for n in dict.fromkeys(c.method for c in cells) if not n.startswith("orth")]
    for name in names:
        pts = [c for c in cells if c.method == name and math.isfinite(getattr(c, field))]
        xs = [getattr(c, field) for c in pts]
        ys = [max(c.rel_err, 1e-9) for c in pts]
        (line,) = ax.plot(xs, ys, "o", alpha=0.35, ms=4)
        if xs:
            ax.plot(
                statistics.median(xs), statistics.median(ys), "*", ms=14,
                color=line.get_color(), markeredgecolor="k", label=name,
            )  # fmt: skip
    ax.axhline(1e-2, color="k", lw=0.8, ls="--", label="accuracy bar: 1% error")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yscale("log")
    ax.set_xlabel(f"time ÷ the paper's Algorithm 1 in {ref} (same matrix)")
    ax.set_ylabel("relative Frobenius error vs float64 SVD")
    ax.set_title("soft clipping: error against time (dots: inputs; stars: medians)")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def sizes_plot(cells: list[Cell], path: str, note: str) -> None:
    """Median time (ms) against N for square ``N × N`` inputs, log-log, one line per method.

    One panel per (dtype, input kind); soft clipping solid, orthogonalization dashed. ``note``
    (device and threads) goes into the title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    groups = list(dict.fromkeys((c.dtype, c.input) for c in cells))
    names = list(dict.fromkeys(c.method for c in cells))
    fig, axes = plt.subplots(
        1, len(groups), figsize=(2 + 5.5 * len(groups), 5), squeeze=False, sharey=True
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (dtype, kind) in zip(axes[0], groups, strict=True):
        for i, name in enumerate(names):
            pts = sorted(
                (square_size(c.shape), c.time_ms)
                for c in cells
                if c.method == name and (c.dtype, c.input) == (dtype, kind)
            )
            if not pts:
                continue
            style = "s--" if name.startswith("orth") else "o-"
            label = METHOD_LABELS.get(name, name)
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, style, color=colours[i % len(colours)], label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        sizes = sorted({square_size(c.shape) for c in cells})
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("matrix size n (n × n input)")
        ax.set_title(f"{dtype} input, {kind}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("median time (ms)")
    axes[0][-1].legend(fontsize=8, loc="upper left")
    fig.suptitle(
        "Runtime against matrix size: soft spectral clipping (Algorithm 1, N_s = 10)\n"
        f"vs orthogonalization (5 Newton–Schulz steps); {note}",
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def _sizes_rows(cells: list[Cell]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the ``--sizes`` table (see :func:`sizes_table`)."""
    names = list(dict.fromkeys(c.method for c in cells))
    pairs = [(a, b) for a, b in SIZE_RATIOS if a in names and b in names]
    head = ["dtype", "input", "n", *(f"{n} ms" for n in names), *(f"{a}/{b}" for a, b in pairs)]
    groups: dict[tuple[str, str, int], dict[str, float]] = {}
    for c in cells:
        groups.setdefault((c.dtype, c.input, square_size(c.shape)), {})[c.method] = c.time_ms
    rows = []
    for (dtype, kind, n), ms in groups.items():
        parts = [f"{ms[name]:.4g}" if name in ms else "skipped" for name in names]
        parts += [f"{ms[a] / ms[b]:.2f}" if a in ms and b in ms else "-" for a, b in pairs]
        rows.append([dtype, kind, str(n), *parts])
    return head, rows


def sizes_table(cells: list[Cell]) -> str:
    """Markdown: one line per (dtype, input, N) with each method's median ms and the
    soft-clipping/orthogonalization time ratios of :data:`SIZE_RATIOS` present in the cells."""
    head, rows = _sizes_rows(cells)
    return markdown_table(head, rows, "llr" + "r" * (len(head) - 3))


def _by_input(cells: list[Cell]) -> dict[tuple[str, str, str], dict[str, Cell]]:
    """The cells grouped by input matrix ``(shape, dtype, input)``, then by method."""
    groups: dict[tuple[str, str, str], dict[str, Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.shape, cell.dtype, cell.input), {})[cell.method] = cell
    return groups


def to_markdown(cells: list[Cell]) -> str:
    """One line per (shape, dtype, input); a method's cell is ``ms (×paper bf16, ×paper fp32)
    error``, with ``-`` where the paper's bf16 run was skipped."""
    names = list(dict.fromkeys(cell.method for cell in cells))
    rows = []
    for (shape, dtype, kind), by_name in _by_input(cells).items():
        parts = []
        for name in names:
            cell = by_name.get(name)
            if cell is None:
                parts.append("skipped")
                continue
            bf = "-" if math.isnan(cell.vs_paper_bf16) else f"{cell.vs_paper_bf16:.3g}"
            parts.append(
                f"{cell.time_ms:.4g} ms (×{bf}, ×{cell.vs_paper_fp32:.2f}) {cell.rel_err:.1e}"
            )
        s_over_c = next(iter(by_name.values())).sigma_over_c
        rows.append([shape, dtype, kind, f"{s_over_c:.3g}", *parts])
    return markdown_table(["shape", "dtype", "input", "σ_max/c", *names], rows)


def _summary_rows(cells: list[Cell]) -> list[list[str]]:
    rows = []
    for name in dict.fromkeys(c.method for c in cells):
        mine = [c for c in cells if c.method == name]
        bf = [c.vs_paper_bf16 for c in mine if not math.isnan(c.vs_paper_bf16)]
        fp = [c.vs_paper_fp32 for c in mine if not math.isnan(c.vs_paper_fp32)]
        med_bf = f"{statistics.median(bf):.3g}" if bf else "-"
        med_fp = f"{statistics.median(fp):.2f}" if fp else "-"
        max_fp = f"{max(fp):.2f}" if fp else "-"
        worst = max(c.rel_err for c in mine)
        rows.append([name, str(len(mine)), med_bf, med_fp, max_fp, f"{worst:.1e}"])
    return rows


def summary(cells: list[Cell]) -> str:
    """Per method: median and worst time ratios and the worst error, over all cells."""
    head = ["method", "cells", "median ×paper bf16", "median ×paper fp32", "max ×paper fp32"]
    return markdown_table([*head, "max error"], _summary_rows(cells), "lrrrrr")


#: the printed tables, one per measure: (title, the cell's value as text, with σ_max/c)
MEASURES: tuple[tuple[str, Callable[[Cell], str], bool], ...] = (
    ("Median time of one call (ms)", lambda c: f"{c.time_ms:.3g}", False),
    (
        "Time ÷ time of paper_fp32 on the same matrix\n"
        "(below 1: faster than the paper's Algorithm 1 with float32 products)",
        lambda c: "-" if math.isnan(c.vs_paper_fp32) else f"{c.vs_paper_fp32:.2f}",
        False,
    ),
    (
        "Relative Frobenius error against the float64 SVD result of the same input",
        lambda c: f"{c.rel_err:.1e}",
        True,
    ),
)


def _two_lines(name: str, longest: int = 9) -> str:
    """A method name as a column header: cut at its last ``_`` when longer than ``longest``."""
    head, sep, tail = name.rpartition("_")
    return f"{head}{sep}\n{tail}" if len(name) > longest and sep else name


LEGEND = """\
Reading the tables: a row is one input matrix: its shape, the dtype it is rounded to and
passed in, and its kind (adam_spike, sign, gauss: synthetic; OPTIMIZER@STEP/LAYER: an update
direction recorded from a cpu-small run); a column is one method (--methods), c = {c:g}.
  paper_fp32, paper_bf16  the paper's Algorithm 1 (N_s = 10) with float32 / bf16 products
  orth_*                  orthogonalization (UVᵀ); their error is against the exact UVᵀ
  error                   ‖Y − ref‖_F / ‖ref‖_F, ref computed in float64 from one SVD of the
                          same (dtype-rounded) input; bf16 rounding alone gives ≈ 1.7e-3,
                          and the accuracy bar is 1e-2
  σ_max/c                 the input's largest singular value over c
  skipped                 not run: paper_bf16's estimated time exceeds --budget
  summary                 per method over all rows: median and max time ÷ paper_bf16 and
                          ÷ paper_fp32 (- where paper_bf16 never ran), and the worst error
"""


def terminal_report(cells: list[Cell], sizes: bool = False) -> str:
    """The tables of a run set for a terminal of ``tables.TERMINAL_WIDTH`` (100) columns: one per
    measure (time, time ratio, error), the per-method summary, with ``sizes`` the
    time-against-size table, and a legend."""
    names = list(dict.fromkeys(cell.method for cell in cells))
    parts = []
    for title, value, with_sigma in MEASURES:
        rows = []
        for (shape, dtype, kind), by_name in _by_input(cells).items():
            keys = [shape, dtype, kind]
            if with_sigma:
                keys.append(f"{next(iter(by_name.values())).sigma_over_c:.3g}")
            rows.append([*keys, *(value(by_name[n]) if n in by_name else "skipped" for n in names)])
        keys = ["shape", "dtype", "input", *(["σ_max/c"] if with_sigma else [])]
        head = [*keys, *map(_two_lines, names)]
        parts.append(f"{title}\n" + text_table(head, rows, keys=len(keys), align="lllr"))
    head = ["method", "rows", "median ÷paper_bf16", "median ÷paper_fp32", "max ÷paper_fp32"]
    summary_table = text_table([*head, "max error"], _summary_rows(cells))
    parts.append("Summary over all rows\n" + summary_table)
    if sizes:
        head, rows = _sizes_rows(cells)
        head = [h.replace(" ms", "\nms").replace("/", "/\n") for h in head]
        title = "Median time (ms) against n, and time ratios (A/B: A's time ÷ B's at that n)"
        parts.append(f"{title}\n" + text_table(head, rows, 3))
    return "\n".join(parts) + "\n" + LEGEND.format(c=CLIP_C)
