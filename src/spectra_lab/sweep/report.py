"""A sweep's results: final validation loss per run, mean ± std over seeds, best lr, curves.

``results.json`` holds one record per run (its point, seed, status, final validation loss,
median step and optimizer-step times and the machine its ``run.json`` records) and one per
group of runs that differ only in seed (mean, sample standard deviation, count, median step
time); ``results.md`` is the same as tables, with the best value of the tuned field (default
``lr``) per method; ``curves.png`` draws each group's validation loss, mean over seeds with a
min–max band. All three are written atomically.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from spectra_lab.files import atomic_write, save_figure
from spectra_lab.runs.records import read_jsonl
from spectra_lab.sweep.grid import Run, label, status, summary


def final_val_loss(run: Run) -> float | None:
    done = summary(run)
    value = done.get("val_loss") if done is not None else None
    return float(value) if value is not None else None


def curve(run: Run) -> list[tuple[int, float]]:
    """The run's ``(step, val_loss)`` evaluations so far."""
    records = read_jsonl(Path(run.config.out_dir) / "metrics.jsonl")
    return [(r["step"], r["val_loss"]) for r in records if r.get("kind") == "eval"]


#: Steps left out of a run's median step time (allocator and cache warm-up).
WARMUP_STEPS = 5


def step_times(run: Run) -> tuple[float | None, float | None]:
    """The median ``t_step`` and ``t_optimizer`` (s) of the run's logged steps after the first
    ``WARMUP_STEPS``; ``None`` where it logged none."""
    records = read_jsonl(Path(run.config.out_dir) / "metrics.jsonl")
    steps = [r for r in records if r.get("kind") == "train" and r.get("step", 0) > WARMUP_STEPS]
    medians = []
    for key in ("t_step", "t_optimizer"):
        values = [float(r[key]) for r in steps if r.get(key) is not None]
        medians.append(statistics.median(values) if values else None)
    return medians[0], medians[1]


def machine(run: Run) -> dict[str, Any] | None:
    """The machine the run's ``run.json`` records (the trainer writes it there), so that the
    sweep's results name it without the run folders."""
    about = Path(run.config.out_dir) / "run.json"
    return json.loads(about.read_text()).get("machine") if about.is_file() else None


def aggregate(runs: list[Run], tune: str = "lr") -> dict[str, Any]:
    """Per-run records, per-group mean ± std over seeds, and the best ``tune`` per method."""
    per_run = []
    groups: dict[str, dict[str, Any]] = {}
    for run in runs:
        loss = final_val_loss(run)
        step_s, optimizer_s = step_times(run)
        per_run.append(
            {"name": run.name, "point": run.point, "seed": run.seed, "status": status(run),
             "val_loss": loss, "step_s": step_s, "optimizer_s": optimizer_s,
             "machine": machine(run)}
        )  # fmt: skip
        g = groups.setdefault(run.group, {"point": run.point, "losses": [], "runs": 0, "steps": []})
        g["runs"] += 1
        if loss is not None:
            g["losses"].append(loss)
        if step_s is not None:
            g["steps"].append(step_s)
    summary = []
    for name, g in groups.items():
        losses = g["losses"]
        summary.append(
            {
                "group": name,
                "point": g["point"],
                "seeds_done": len(losses),
                "seeds": g["runs"],
                "mean": statistics.fmean(losses) if losses else None,
                "std": statistics.stdev(losses) if len(losses) > 1 else None,
                "step_s": statistics.median(g["steps"]) if g["steps"] else None,
            }
        )
    best: dict[str, dict[str, Any]] = {}
    for row in summary:
        if tune not in row["point"] or row["mean"] is None:
            continue
        method = label({k: v for k, v in row["point"].items() if k != tune})
        if method not in best or row["mean"] < best[method]["mean"]:
            best[method] = {"method": method, tune: row["point"][tune], **row}
    return {"tune": tune, "runs": per_run, "groups": summary, "best": list(best.values())}


def _pm(mean: float | None, std: float | None, n: int, total: int) -> str:
    if mean is None:
        return f"– (0/{total} seeds)"
    text = f"{mean:.4f}" + (f" ± {std:.4f}" if std is not None else "")
    return text + (f" ({n}/{total} seeds)" if n < total else f" (n={n})")


def to_markdown(report: dict[str, Any]) -> str:
    tune = report["tune"]
    lines = [
        "| run group | final val loss, mean ± std over seeds | median step (s) |",
        "|---|---|---|",
    ]
    for g in report["groups"]:
        step = f"{g['step_s']:.3f}" if g.get("step_s") is not None else "–"
        lines.append(
            f"| {g['group']} | {_pm(g['mean'], g['std'], g['seeds_done'], g['seeds'])} | {step} |"
        )
    if report["best"]:
        lines += ["", f"| method | best {tune} | final val loss |", "|---|---|---|"]
        for b in report["best"]:
            lines.append(
                f"| {b['method']} | {b[tune]:g} | "
                f"{_pm(b['mean'], b['std'], b['seeds_done'], b['seeds'])} |"
            )
    return "\n".join(lines) + "\n"


#: the widest range of validation loss curves.png shows, from the lowest value up
CURVES_SPAN = 1.5


def plot_curves(runs: list[Run], report: dict[str, Any], path: Path) -> None:
    """Validation loss per group: the mean over its seeds, and a min–max band.

    Where a field is tuned, only each method's best group is drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wanted = {b["group"] for b in report["best"]} or {g["group"] for g in report["groups"]}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    band: list[float] = []
    for group in sorted(wanted):
        curves = [dict(curve(r)) for r in runs if r.group == group]
        steps = sorted(set().union(*curves)) if curves else []
        xs, mean, lo, hi = [], [], [], []
        for s in steps:
            vals = [c[s] for c in curves if s in c]
            if vals:
                xs.append(s)
                mean.append(statistics.fmean(vals))
                lo.append(min(vals))
                hi.append(max(vals))
        if not xs:
            continue
        (line,) = ax.plot(xs, mean, marker="o", ms=3, label=f"{group} (n={len(curves)})")
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
        band += [y for y in lo + hi if math.isfinite(y)]
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss")
    title = "validation loss: mean over seeds, min–max band"
    if band:
        low, high = min(band), max(band)
        top = min(high, low + CURVES_SPAN)  # early, very high losses would flatten the rest
        pad = 0.05 * max(top - low, 1e-3)
        ax.set_ylim(low - pad, top + pad)
        if high > top:
            title += f"\n(losses above {top:.3g} are off the top)"
    ax.set_title(title)
    if ax.lines:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def plot_tuning(report: dict[str, Any], path: Path, lines: str | None = None) -> bool:
    """Final validation loss against the tuned field, mean ± std over seeds.

    One panel per method, or, with ``lines``, one panel per method without that field and one
    line per value of it (e.g. ``lines="d_model"``: does the best lr move with the width?).
    Returns False (and draws nothing) when no group has the tuned field.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tune = report["tune"]
    panels: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
    for row in report["groups"]:
        point = row["point"]
        if tune not in point or row["mean"] is None:
            continue
        rest = {k: v for k, v in point.items() if k not in (tune, lines)}
        line = label({lines: point[lines]}) if lines in point else "loss"
        xs = panels.setdefault(label(rest), {}).setdefault(line, [])
        xs.append((float(point[tune]), row["mean"], row["std"] or 0.0))
    if not panels:
        return False
    cols = min(len(panels), 2)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False,
                             sharey=True)  # fmt: skip
    for ax, (panel, series) in zip(axes.flat, panels.items(), strict=False):
        for name, pts in series.items():
            pts.sort()
            xs, ys, es = zip(*pts, strict=True)
            ax.errorbar(xs, ys, yerr=es, marker="o", ms=3, capsize=2, label=name)
            best = min(pts, key=lambda t: t[1])
            ax.plot([best[0]], [best[1]], marker="*", ms=10, color=ax.lines[-1].get_color())
        values = sorted({x for pts in series.values() for x, _, _ in pts})
        if values[0] > 0:
            ax.set_xscale("log")
            ax.minorticks_off()
        ax.set_xticks(values, [f"{x:g}" for x in values], fontsize=7)
        ax.set_title(panel, fontsize=8)
        ax.set_xlabel(tune)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    axes[0, 0].set_ylabel("final validation loss")
    finite = [y for ax in axes.flat for ln in ax.lines for y in ln.get_ydata()]
    finite = [y for y in finite if math.isfinite(y)]
    if finite:  # diverged runs would flatten the differences that matter
        axes[0, 0].set_ylim(min(finite) - 0.05, min(max(finite), min(finite) + 1.5) + 0.05)
    fig.suptitle(f"final validation loss against {tune} (mean ± std over seeds; * best)",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    return True


def write_report(
    runs: list[Run], out: Path, tune: str = "lr", plot: bool = True, lines: str | None = None
) -> dict:
    """Write ``results.json``, ``results.md`` and (``plot``) ``curves.png`` and ``tuning.png``
    (loss against the tuned field, a line per value of ``lines``) under ``out``."""
    report = aggregate(runs, tune)
    atomic_write(out / "results.json", json.dumps(report, indent=1) + "\n")
    atomic_write(out / "results.md", to_markdown(report))
    if plot:
        plot_curves(runs, report, out / "curves.png")
        plot_tuning(report, out / "tuning.png", lines)
    return report
