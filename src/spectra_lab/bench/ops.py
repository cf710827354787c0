"""``spectra bench ops``: time and accuracy of the spectral operators side by side.

Inputs are synthetic (Adam-like with a spike at σ = 10³·c, sign-like, Gaussian, at the
paper's 124M shapes) and recorded: the AdamW, Signum and AdEMAMix update directions of real
``cpu-small`` runs (:mod:`spectra_lab.bench.inputs`), where σ_max/c is what training
produces. For every input and dtype each method runs on the same matrix; the table reports
the median time over repeats, the ratios to the paper's Algorithm 1 (N_s = 10) in bfloat16
and in float32 measured in the same cell, and the relative Frobenius error against the float64
SVD of the same (dtype-rounded) input. A summary gives each method's median ratios and worst
error, and ``--plot`` draws error against time.

``--sizes N …`` times the same methods on square ``N × N`` synthetic inputs instead (default
kind ``adam_spike``), for the runtime-against-matrix-size comparison of soft spectral clipping
(the paper's Algorithm 1, N_s = 10) with orthogonalization (Muon's 5 Newton–Schulz steps);
``--plot-sizes`` draws median time against N on log-log axes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from spectra.ops import orthogonalize, soft_clip
from spectra.ops._common import single_thread_lapack
from spectra.ops.polar import polar_steps
from spectra.validate import check_int, check_number
from spectra_lab.bench.precision import add_tf32_argument, apply_tf32, device_about
from spectra_lab.bench.tables import markdown_table, text_table
from spectra_lab.files import atomic_write, save_figure

SHAPES: dict[str, tuple[int, ...]] = {
    "768x768": (768, 768),
    "768x3072": (768, 3072),
    "2048x2048": (2048, 2048),
    "8x512x512": (8, 512, 512),
}
QUICK_SHAPES: dict[str, tuple[int, ...]] = {"48x80": (48, 80), "2x32x24": (2, 32, 24)}
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}
INPUTS = ("adam_spike", "sign", "gauss")
CLIP_C = 10.0  # the paper's recommended threshold for unit-RMS updates
SPIKE_OVER_C = 1e3  # σ_spike/c of the Adam-like input: the hardest case of the accuracy target


@dataclass
class Cell:
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


#: The synthetic kind of ``--sizes`` when ``--inputs`` names none.
SIZES_INPUT = "adam_spike"
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


#: ``--paper-bf16 auto`` runs the paper's bf16 method on a matrix only when its estimated
#: time (its flops at the measured bf16 matmul rate of the device) fits the cell budget.
PAPER_BF16_MODES = ("auto", "always", "never")


def make_input(kind: str, shape: tuple[int, ...], seed: int = 0) -> Tensor:
    """A float64 test matrix (batch): Adam-like update with a rank-one spike, sign-like, Gaussian.

    Entries have unit RMS. The Adam-like update is ``g/√v`` with ``v`` an independent
    exponential average of squared gradients (heavy-tailed entries), plus a rank-one spike of
    spectral norm ``SPIKE_OVER_C·CLIP_C``.
    """
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    if kind == "gauss":
        return g
    if kind == "sign":
        return torch.sign(g)
    if kind != "adam_spike":
        raise ValueError(f"unknown input kind {kind!r}")
    z = torch.randn(shape, generator=gen, dtype=torch.float64)
    v = 0.9 * z * z + 0.1 * g * g
    X = g / (v.sqrt() + 1e-3)
    X = X / X.pow(2).mean(dim=(-2, -1), keepdim=True).sqrt()
    u = torch.randn((*shape[:-1], 1), generator=gen, dtype=torch.float64)
    w = torch.randn((*shape[:-2], 1, shape[-1]), generator=gen, dtype=torch.float64)
    u = u / torch.linalg.vector_norm(u, dim=-2, keepdim=True)
    w = w / torch.linalg.vector_norm(w, dim=-1, keepdim=True)
    return X + SPIKE_OVER_C * CLIP_C * (u @ w)


def spiked(
    shape: tuple[int, ...],
    c: float,
    spike_over_c: float,
    kind: str = "adam",
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """A stress input: singular values ``c·logspace(0, −3)`` (the bulk, from c down to c/1000)
    with the largest set to ``spike_over_c·c``, and the singular vectors of an Adam-like
    (``"adam"``), sign (``"sign"``) or Gaussian (``"gauss"``) matrix."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    if kind == "sign":
        g = torch.sign(g)
    elif kind == "adam":
        v = 0.9 * torch.randn(shape, generator=gen, dtype=torch.float64) ** 2 + 0.1 * g * g
        g = g / (v.sqrt() + 1e-3)
    elif kind != "gauss":
        raise ValueError(f"unknown spiked kind {kind!r}; expected adam, sign or gauss")
    U, S, Vh = torch.linalg.svd(g, full_matrices=False)
    S = c * torch.logspace(0, -3, S.shape[-1], dtype=torch.float64).expand_as(S).clone()
    S[..., 0] = spike_over_c * c
    return ((U * S.unsqueeze(-2)) @ Vh).to(dtype)


def references(X: Tensor, c: float) -> dict[str, Tensor]:
    """``H_c(X)`` and ``UVᵀ`` from one float64 SVD of X."""
    with single_thread_lapack(X.device):
        U, S, Vh = torch.linalg.svd(X.to(torch.float64), full_matrices=False)
    soft = (U * (S / torch.sqrt(1.0 + (S / c) ** 2)).unsqueeze(-2)) @ Vh
    return {"soft": soft, "orth": U @ Vh, "sigma": S.reshape(-1, S.shape[-1])}


def rel_err(Y: Tensor, ref: Tensor) -> float:
    diff = torch.linalg.vector_norm(Y.to(torch.float64) - ref)
    return float(diff / torch.linalg.vector_norm(ref).clamp_min(1e-300))


def methods(c: float) -> dict[str, tuple[str, Callable[[Tensor], Tensor]]]:
    """name -> (which reference it is compared with, function)."""
    return {
        "auto": ("soft", lambda X: soft_clip(X, c)),
        "eigh": ("soft", lambda X: soft_clip(X, c, method="eigh")),
        "eigh64": ("soft", lambda X: soft_clip(X, c, method="eigh", ns_dtype=torch.float64)),
        "polar": ("soft", lambda X: soft_clip(X, c, method="polar")),
        "mixed": ("soft", lambda X: soft_clip(X, c, method="mixed")),
        "polar_bf16": (
            "soft",
            lambda X: soft_clip(X, c, method="polar", ns_dtype=torch.bfloat16),
        ),
        "paper_bf16": (
            "soft",
            lambda X: soft_clip(X, c, method="paper", ns_dtype=torch.bfloat16),
        ),
        "paper_fp32": ("soft", lambda X: soft_clip(X, c, method="paper", ns_dtype=torch.float32)),
        "svd": ("soft", lambda X: soft_clip(X, c, method="svd")),
        "orth_muon": ("orth", lambda X: orthogonalize(X, method="muon")),
        "orth_muon_fp32": (
            "orth",
            lambda X: orthogonalize(X, method="muon", ns_dtype=torch.float32),
        ),
        "orth_polar_express": ("orth", lambda X: orthogonalize(X, method="polar_express")),
    }


def matmul_rate(dtype: torch.dtype, device: torch.device, size: int = 512) -> float:
    """Measured flop/s of one ``size``-cubed matrix product in ``dtype`` (median of 9, after
    two untimed ones: a single small product is at the mercy of a shared machine).

    bf16 is timed as the operators multiply it (:func:`spectra.ops._common.bf16_matmul`:
    emulated through float32 on CPUs without bf16 units).
    """
    from spectra.ops._common import bf16_matmul

    mm = bf16_matmul if dtype == torch.bfloat16 else torch.matmul
    A = torch.randn(size, size, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    mm(A, A)
    mm(A, A)
    times = []
    for _ in range(9):
        sync()
        t0 = time.perf_counter()
        mm(A, A)
        sync()
        times.append(time.perf_counter() - t0)
    return 2 * size**3 / max(statistics.median(times), 1e-9)


def synthetic_inputs(
    shapes: dict[str, tuple[int, ...]], kinds: tuple[str, ...]
) -> list[tuple[str, str, Tensor]]:
    """``(shape label, input label, float64 matrix)`` for every shape and synthetic kind."""
    return [(name, kind, make_input(kind, shapes[name])) for name in shapes for kind in kinds]


def square_shapes(sizes: list[int]) -> dict[str, tuple[int, ...]]:
    """``{"NxN": (N, N)}`` for each size, in the given order, duplicates dropped."""
    return {f"{n}x{n}": (n, n) for n in sizes}


def square_size(label: str) -> int:
    """N of a square shape label ``"NxN"``; ``ValueError`` for any other label."""
    parts = label.split("x")
    if len(parts) != 2 or parts[0] != parts[1] or not parts[0].isdigit():
        raise ValueError(f"not a square shape label: {label!r}")
    return int(parts[0])


def recorded_inputs(path: str | None = None) -> list[tuple[str, str, Tensor]]:
    """The update directions recorded from real ``cpu-small`` runs (``bench record-inputs``)."""
    from spectra_lab.bench.inputs import DEFAULT_FILE, load

    found = load(path or DEFAULT_FILE)
    return [
        ("x".join(map(str, U.shape)), key, U.to(torch.float64)) for key, U in sorted(found.items())
    ]


def _timed(fn: Callable[[Tensor], Tensor], X: Tensor, repeats: int, budget_s: float):
    sync = torch.cuda.synchronize if X.device.type == "cuda" else (lambda: None)
    if X.device.type == "cuda":
        fn(X)  # warm-up: kernels, workspace
        sync()
    times: list[float] = []
    out = None
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn(X)
        sync()
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s:
            break
    return out, statistics.median(times), len(times)


def run_bench(
    inputs: list[tuple[str, str, Tensor]],
    dtypes: dict[str, torch.dtype],
    repeats: int,
    budget_s: float,
    device: torch.device,
    progress: bool = True,
    only: tuple[str, ...] | None = None,
    paper_bf16: str = "auto",
) -> list[Cell]:
    """Every method on every (input, dtype), side by side; see the module docstring."""
    from tqdm import tqdm

    c = CLIP_C
    table = {k: v for k, v in methods(c).items() if only is None or k in only}
    if paper_bf16 == "never":
        table.pop("paper_bf16", None)
    bf16_rate = matmul_rate(torch.bfloat16, device) if "paper_bf16" in table else math.inf
    cells: list[Cell] = []
    bar = tqdm(total=len(inputs) * len(dtypes) * len(table), disable=not progress, desc="ops")
    for shape_name, kind, X64 in inputs:
        for dtype_name, dtype in dtypes.items():
            X = X64.to(dtype).to(device)
            refs = references(X, c)
            sigma_over_c = float(refs["sigma"].max()) / c if refs["sigma"].numel() else 0.0
            row: list[tuple[str, float, int, float]] = []
            for name, (ref_kind, fn) in table.items():
                bar.set_postfix_str(f"{shape_name} {dtype_name} {kind} {name}")
                bar.update()
                if name == "paper_bf16" and paper_bf16 == "auto":
                    estimate = matmul_flops("paper", tuple(X.shape)) / bf16_rate
                    if estimate > budget_s:
                        continue
                Y, t, n = _timed(fn, X, repeats, budget_s)
                row.append((name, t, n, rel_err(Y, refs[ref_kind])))
            times = {name: t for name, t, _, _ in row}
            t_bf16 = times.get("paper_bf16", math.nan)
            t_fp32 = times.get("paper_fp32", math.nan)
            for name, t, n, err in row:
                cells.append(
                    Cell(
                        shape_name, dtype_name, kind, name, 1e3 * t, n,
                        t / t_bf16, t / t_fp32, err, sigma_over_c,
                    )
                )  # fmt: skip
    bar.close()
    return cells


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


def matmul_flops(method: str, shape: tuple[int, ...], steps: int = 0, fp64_redo: bool = False):
    """Flops of the matrix products of a matmul-only method (2·m·k·n per product).

    ``paper``: Gram + final product (``2m²n`` each) and 3 products of ``m × m`` per step, 10
    steps. ``polar``: the same two ``m²n`` products, ``G²`` and ``4K − 4`` products for ``K ≥ 1``
    steps (plus the float32 Gram matrix and ``G²`` recomputed in float64 when ``α > 1e5``).
    ``orth``: ``K`` steps of ``XXᵀ``, ``A²`` and ``BX``.
    """
    *batch, m, n = shape
    m, n = min(m, n), max(m, n)
    count = math.prod(batch) if batch else 1
    mn, mm = 2 * m * m * n, 2 * m**3
    if method == "paper":
        total = 2 * mn + 30 * mm
    elif method == "polar":
        total = 2 * mn + mm * (1 + max(0, 4 * steps - 4))
        if fp64_redo:
            total += mn + mm
    elif method == "orth":
        total = steps * (2 * mn + mm)
    else:
        raise ValueError(f"no flop count for {method!r}")
    return count * total


def mixed_flops(shape: tuple[int, ...], steps: int, exact: int) -> tuple[int, int]:
    """Flops of ``soft_clip(method="mixed")`` as ``(in the Gram matrix's precision, in bf16)``.

    In the Gram matrix's precision: the Gram matrix and the last product ``K·X`` (``2m²n``
    each), ``G²`` (``2m³``), and with ``e ≥ 1`` exact steps ``4e − 2`` products of ``m × m``
    matrices (the first step is a sum given ``G²``; each later one takes ``E = ZY``, the fused
    ``Q = p(E)``, ``QZ`` and ``YQ``; then ``E = ZY`` once more) and ``K = W·Z`` after bf16 steps.
    In bf16, ``r = K − e`` steps on E take ``4r − 3`` products (the first is one fused product,
    the last skips ``YQ``).
    """
    *batch, m, n = shape
    m, n = min(m, n), max(m, n)
    count = math.prod(batch) if batch else 1
    exact = min(exact, steps)
    rest = steps - exact
    products = 1 + (4 * exact - 2 if exact else 0) + (1 if exact and rest else 0)
    full = 4 * m * m * n + products * 2 * m**3
    half = (4 * rest - 3) * 2 * m**3 if rest else 0
    return count * full, count * half


def flop_table(shapes: dict[str, tuple[int, ...]], inputs: tuple[str, ...]) -> str:
    """Markdown table: GFLOP of the matmul-only methods and polar's steps on each input."""
    rows = []
    for shape_name, shape in shapes.items():
        for kind in inputs:
            X = make_input(kind, shape).to(torch.float32)
            K, wd = polar_steps(X, CLIP_C)
            polar = matmul_flops("polar", shape, K, fp64_redo=wd == torch.float64)
            paper, orth = matmul_flops("paper", shape), matmul_flops("orth", shape, 5)
            precision = str(wd).removeprefix("torch.")
            gflop = [f"{polar / 1e9:.1f}", f"{paper / 1e9:.1f}", f"{polar / paper:.2f}"]
            rows.append([shape_name, kind, f"{K} ({precision})", *gflop, f"{orth / 1e9:.1f}"])
    head = ["shape", "input", "polar steps K (precision)", "polar GFLOP", "paper GFLOP (N_s=10)"]
    return markdown_table([*head, "polar/paper", "orth 5 steps GFLOP"], rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell (median)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--shapes",
        nargs="+",
        choices=list(SHAPES),
        default=None,
        help="subset of shapes of the synthetic inputs (default: all)",
    )
    which.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        default=None,
        metavar="N",
        help="time square N x N synthetic inputs of these sizes instead of --shapes "
        f"(input kind: --inputs, default {SIZES_INPUT})",
    )
    parser.add_argument(
        "--dtypes", nargs="+", choices=list(DTYPES), default=None, help="input dtypes"
    )
    parser.add_argument(
        "--inputs",
        nargs="+",
        choices=(*INPUTS, "recorded"),
        default=None,
        help="synthetic kinds and/or 'recorded' (directions from real cpu-small runs); "
        "default: all",
    )
    parser.add_argument(
        "--inputs-file", default=None, help="recorded directions (default: the shipped file)"
    )
    parser.add_argument(
        "--budget", type=float, default=20.0, help="stop repeating a cell after this many s"
    )
    parser.add_argument(
        "--methods", nargs="+", choices=list(methods(1.0)), default=None, help="subset"
    )
    parser.add_argument(
        "--paper-bf16",
        choices=PAPER_BF16_MODES,
        default="auto",
        help="run the paper's bf16 method: auto (where its estimated time fits --budget), "
        "always, never",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes (unless --sizes), one repeat"
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if any)")
    add_tf32_argument(parser)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (1 is robust to a busy CPU)"
    )
    parser.add_argument("--out", default=None, help="write the table to FILE (.json or .md)")
    parser.add_argument("--plot", default=None, help="write the error-vs-time figure (.png)")
    parser.add_argument(
        "--plot-sizes",
        default=None,
        metavar="FILE",
        help="with --sizes: write the time-against-size figure (.png, log-log)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument(
        "--flops", action="store_true", help="print the matmul flop counts only (no timing)"
    )


def _check(args: argparse.Namespace) -> None:
    """Refuse contradictory or out-of-range options in one line (:class:`CLIError`)."""
    from spectra_lab.errors import CLIError

    try:
        check_int("--repeats", args.repeats, low=1)
        check_number("--budget", args.budget, low=0.0, low_open=True)
        check_int("--threads", args.threads, low=1, none_ok=True)
        for n in args.sizes or ():
            check_int("--sizes", n, low=1)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.plot_sizes and not args.sizes:
        raise CLIError("--plot-sizes needs --sizes")
    if args.sizes and args.inputs and "recorded" in args.inputs:
        raise CLIError("--sizes times synthetic inputs only; 'recorded' ones have their own shapes")
    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_name.startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {device_name}: CUDA is not available")


def _shapes_and_kinds(args: argparse.Namespace) -> tuple[dict[str, tuple[int, ...]], tuple]:
    """The synthetic shapes and the input kinds (``"recorded"`` among them) of the options."""
    if args.sizes:
        shapes = square_shapes(args.sizes)
    elif args.quick:
        shapes = dict(QUICK_SHAPES)
    else:
        shapes = {n: SHAPES[n] for n in args.shapes or list(SHAPES)}
    default_kinds = (SIZES_INPUT,) if args.sizes else (*INPUTS, "recorded")
    return shapes, tuple(args.inputs or default_kinds)


def _inputs(args: argparse.Namespace, shapes: dict, kinds: tuple) -> list[tuple[str, str, Tensor]]:
    """The synthetic matrices and, when asked for, the recorded directions."""
    from spectra_lab.errors import CLIError

    inputs = synthetic_inputs(shapes, tuple(k for k in kinds if k != "recorded"))
    if "recorded" in kinds:
        try:
            inputs += recorded_inputs(args.inputs_file)
        except FileNotFoundError as exc:
            raise CLIError(str(exc)) from None
    return inputs


def _write(args: argparse.Namespace, cells: list[Cell], header: str, about: dict) -> None:
    """The figures and the ``--out`` file (JSON: ``about`` and the cells; else Markdown)."""
    if args.plot:
        pareto_plot(cells, args.plot)
    if args.plot_sizes:
        device = torch.device(about["device"])
        threads, where = about["threads"], about["device"]
        if device.type == "cuda":
            where += f" ({torch.cuda.get_device_name(device)})"
        note = (
            f"{where}, {threads} thread{'s' if threads > 1 else ''}, median of ≤{about['repeats']}"
        )
        sizes_plot(cells, args.plot_sizes, f"{note} runs, c = {CLIP_C:g}")
    if not args.out:
        return
    if args.out.endswith(".json"):
        keys = ("device", "gpu", "float32_matmul_precision", "torch", "threads", "clip_c")
        keys += ("matmul_gflops", "cpu_bf16")
        payload = {**{k: about[k] for k in keys if k in about},
                   "cells": [asdict(cell) for cell in cells]}  # fmt: skip
        atomic_write(args.out, json.dumps(payload, indent=1) + "\n")
    else:
        text = to_markdown(cells) + "\n" + summary(cells)
        atomic_write(
            args.out, header + "\n" + text + ("\n" + sizes_table(cells) if args.sizes else "")
        )


def run(args: argparse.Namespace) -> int:
    """``spectra bench ops``: time the methods, print the tables, write the files asked for."""
    _check(args)
    apply_tf32(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    repeats = 1 if args.quick else args.repeats
    shapes, kinds = _shapes_and_kinds(args)
    dtypes = {n: DTYPES[n] for n in (args.dtypes or list(DTYPES))}
    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device_name)
    if args.flops:
        print(flop_table(shapes, tuple(k for k in kinds if k != "recorded")), end="")
        return 0
    only = tuple(args.methods) if args.methods else None
    cells = run_bench(
        _inputs(args, shapes, kinds), dtypes, repeats, args.budget, device,
        not args.no_progress, only, paper_bf16=args.paper_bf16,
    )  # fmt: skip
    rates = {
        name: matmul_rate(dt, device) / 1e9
        for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32))
    }
    header = (
        f"device={device_name} threads={torch.get_num_threads()} torch={torch.__version__} "
        f"c={CLIP_C} repeats<={repeats} matmul GFLOP/s: bf16 {rates['bf16']:.0f}, "
        f"fp32 {rates['fp32']:.0f}\n"
    )
    print(header + "\n" + terminal_report(cells, sizes=bool(args.sizes)), end="")
    about = {
        "device": device_name, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "clip_c": CLIP_C, "matmul_gflops": rates, "repeats": repeats, **device_about(device),
    }  # fmt: skip
    _write(args, cells, header, about)
    return 0
