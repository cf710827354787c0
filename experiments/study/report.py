"""The reproduction study's tables, verdicts and figures, from the sweeps' ``results.json``.

    python experiments/study/report.py            # rewrites the marked blocks of docs/results.md

Reads ``results/study/<sweep>/results.json`` (written by ``spectra sweep``), and writes:

- the tables between ``<!-- study:NAME -->`` and ``<!-- /study:NAME -->`` in docs/results.md;
- ``docs/figures/study_methods.png`` and ``docs/figures/study_ablations.png``.

Every comparison is paired by seed (same seed, same data order and initialisation): for the
per-seed differences d_s = loss(B) − loss(A), their mean, sample std, n and the paired t
statistic t = mean / (std / √n). A difference is called significant when |t| exceeds the
two-sided 95% quantile of Student's t with n − 1 degrees of freedom (4.303 for n = 3).
A verdict follows from that rule alone, so it changes when the numbers do.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "study"
DOC = ROOT / "docs" / "results.md"
FIGURES = ROOT / "docs" / "figures"

#: Two-sided 95% quantiles of Student's t, by degrees of freedom (standard tables).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228}  # fmt: skip

PAIRS = [("adamw", "spectra-adamw"), ("signum", "spectra-signum"),
         ("ademamix", "spectra-ademamix")]  # fmt: skip
BASELINES = ["mars", "dmuon", "soap"]
ORDER = ["adamw", "spectra-adamw", "signum", "spectra-signum", "ademamix", "spectra-ademamix",
         "mars", "dmuon", "soap"]  # fmt: skip


def load(sweep: str) -> dict | None:
    path = RESULTS / sweep / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def per_seed(report: dict | None, **point) -> dict[int, float]:
    """Final val loss by seed of the runs whose point contains ``point``."""
    if report is None:
        return {}
    return {
        r["seed"]: r["val_loss"]
        for r in report["runs"]
        if r["val_loss"] is not None and all(r["point"].get(k) == v for k, v in point.items())
    }


def step_time(report: dict | None, **point) -> float | None:
    """Median over runs of each run's median step time (s)."""
    if report is None:
        return None
    times = [
        r["step_s"]
        for r in report["runs"]
        if r.get("step_s") is not None and all(r["point"].get(k) == v for k, v in point.items())
    ]
    return statistics.median(times) if times else None


def mean_std(values: dict[int, float]) -> str:
    if not values:
        return "–"
    xs = list(values.values())
    if len(xs) == 1:
        return f"{xs[0]:.3f} (n=1)"
    return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f} (n={len(xs)})"


def paired(a: dict[int, float], b: dict[int, float]) -> dict | None:
    """Paired differences b − a over the seeds both have."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    d = [b[s] - a[s] for s in seeds]
    mean, sd, n = statistics.fmean(d), statistics.stdev(d), len(d)
    if sd == 0:
        t = 0.0 if mean == 0 else math.copysign(math.inf, mean)
    else:
        t = mean / (sd / math.sqrt(n))
    return {"mean": mean, "std": sd, "n": n, "t": t, "sig": abs(t) > T95[n - 1]}


def fmt_diff(p: dict | None) -> str:
    if p is None:
        return "– (fewer than 2 paired seeds)"
    star = " (significant)" if p["sig"] else ""
    return f"{p['mean']:+.3f} ± {p['std']:.3f}, t = {p['t']:+.1f}{star}"


def lower(p: dict | None) -> str:
    """Verdict for a claim that b − a > 0 (a is lower)."""
    if p is None:
        return "inconclusive (not run)"
    if p["sig"]:
        return "held" if p["mean"] > 0 else "not held"
    return "inconclusive"


def no_lower(p: dict | None) -> str:
    """Verdict for a claim that b is no lower than a (b − a ≥ 0, "on par or worse")."""
    if p is None:
        return "inconclusive (not run)"
    if p["mean"] >= 0:
        return "held"
    # b lower on average: against the claim, significant or not
    return "not held" if p["sig"] else "inconclusive"


# ----- tables -----------------------------------------------------------------------------


def methods_table(seeds: dict | None, tuned: dict[str, float]) -> str:
    rows = ["| method | tuned lr | final val loss (mean ± std over seeds) | median step (s) |",
            "|---|---:|---|---:|"]  # fmt: skip
    for m in ORDER:
        vals = per_seed(seeds, optimizer=m)
        st = step_time(seeds, optimizer=m)
        lr = f"{tuned[m]:g}" if m in tuned else "–"
        rows.append(f"| {m} | {lr} | {mean_std(vals)} | {f'{st:.3f}' if st else '–'} |")
    return "\n".join(rows)


def pairs_table(seeds: dict | None) -> str:
    rows = ["| claim | base | Spectra | Δ = base − Spectra (paired) | verdict |",
            "|---|---|---|---|---|"]  # fmt: skip
    against_baselines = [(base, s) for _, s in PAIRS for base in BASELINES]
    for base, spectra in [*PAIRS, *against_baselines]:
        a, b = per_seed(seeds, optimizer=spectra), per_seed(seeds, optimizer=base)
        p = paired(a, b)
        rows.append(f"| {spectra} beats {base} | {mean_std(b)} | {mean_std(a)} | {fmt_diff(p)} "
                    f"| {lower(p)} |")  # fmt: skip
    return "\n".join(rows)


def signum_runs(stab: dict | None) -> tuple[dict[int, float], dict[float, dict[int, float]]]:
    """Batch 2: Spectra-Signum at 3e-3, and Signum by lr (the 3e-3 case takes the base lr)."""
    signum = {lr: per_seed(stab, optimizer="signum", lr=lr) for lr in (3e-4, 1e-3)}
    signum[3e-3] = {
        r["seed"]: r["val_loss"]
        for r in (stab or {"runs": []})["runs"]
        if r["point"] == {"optimizer": "signum"} and r["val_loss"] is not None
    }
    return per_seed(stab, optimizer="spectra-signum"), signum


def best_lr(by_lr: dict[float, dict[int, float]]) -> float | None:
    """The lr with the lowest mean loss among those run (None if none was)."""
    done = {lr: v for lr, v in by_lr.items() if v}
    return min(done, key=lambda lr: statistics.fmean(done[lr].values())) if done else None


def signum_table(stab: dict | None) -> str:
    """Batch 2: Signum at three lrs against Spectra-Signum at the large one."""
    spectra, signum = signum_runs(stab)
    rows = ["| batch 2 | lr | final val loss | Δ = Signum − Spectra-Signum@3e-3 (paired) |",
            "|---|---:|---|---|",
            f"| Spectra-Signum | 3e-3 | {mean_std(spectra)} | (reference) |"]  # fmt: skip
    for lr, vals in sorted(signum.items()):
        rows.append(f"| Signum | {lr:g} | {mean_std(vals)} | {fmt_diff(paired(spectra, vals))} |")
    best = best_lr(signum)
    if best is not None:
        worst = paired(signum[best], signum[3e-3])
        degrades = (
            "| Signum degrades at the large lr | 3e-3 is Signum's best lr | – | not held |"
            if best == 3e-3
            else f"| Signum degrades at the large lr | Signum@3e-3 − Signum@{best:g} (its best) "
            f"| {fmt_diff(worst)} | {lower(worst)} |"
        )
        rows += [
            "",
            "| claim | comparison | Δ (paired) | verdict |",
            "|---|---|---|---|",
            degrades,
            f"| Spectra-Signum at the large lr beats the best Signum | Signum@{best:g} − "
            f"Spectra-Signum@3e-3 | {fmt_diff(paired(spectra, signum[best]))} | "
            f"{lower(paired(spectra, signum[best]))} |",
        ]
    return "\n".join(rows)


def c_table(cab: dict | None, seeds: dict | None) -> tuple[str, dict]:
    ref = per_seed(seeds, optimizer="spectra-adamw")
    values = {10.0: ref}
    for c in (1.0, 5.0, 20.0, 50.0):
        values[c] = per_seed(cab, clip_c=c)
    rows = ["| c | final val loss | Δ against c = 10 (paired) |", "|---:|---|---|"]
    diffs = {}
    for c in sorted(values):
        diffs[c] = None if c == 10.0 else paired(ref, values[c])
        rows.append(f"| {c:g} | {mean_std(values[c])} | "
                    f"{'(reference)' if c == 10.0 else fmt_diff(diffs[c])} |")  # fmt: skip
    return "\n".join(rows), {"values": values, "diffs": diffs}


NS_CASES = [
    ("paper, N_s = 5, bf16", {"clip_method": "paper", "clip_ns_steps": 5,
                              "clip_ns_dtype": "bfloat16"}),
    ("paper, N_s = 10, bf16", {"clip_method": "paper", "clip_ns_steps": 10,
                               "clip_ns_dtype": "bfloat16"}),
    ("paper, N_s = 15, fp32", {"clip_method": "paper", "clip_ns_steps": 15,
                               "clip_ns_dtype": "float32"}),
]  # fmt: skip


def ns_table(nsab: dict | None, seeds: dict | None) -> tuple[str, dict]:
    ref = per_seed(seeds, optimizer="spectra-adamw")
    values = {name: per_seed(nsab, optimizer_kwargs=kw) for name, kw in NS_CASES}
    values["ours, auto (accurate)"] = ref
    steps = {name: step_time(nsab, optimizer_kwargs=kw) for name, kw in NS_CASES}
    steps["ours, auto (accurate)"] = step_time(seeds, optimizer="spectra-adamw")
    base = values["paper, N_s = 10, bf16"]
    rows = ["| operator | final val loss | Δ against paper N_s = 10 bf16 (paired) "
            "| median step (s) |", "|---|---|---|---:|"]  # fmt: skip
    diffs = {}
    for name, vals in values.items():
        is_ref = name == "paper, N_s = 10, bf16"
        diffs[name] = None if is_ref else paired(vals, base)
        st = steps[name]
        rows.append(f"| {name} | {mean_std(vals)} | "
                    f"{'(reference)' if is_ref else fmt_diff(diffs[name])} | "
                    f"{f'{st:.3f}' if st else '–'} |")  # fmt: skip
    return "\n".join(rows), {"values": values, "diffs": diffs}


def fixed_table(fixed: dict | None, seeds: dict | None) -> tuple[str, dict]:
    spectra = per_seed(seeds, optimizer="spectra-adamw")
    runs = {200: per_seed(seeds, optimizer="adamw")}
    for steps in (210, 220, 240):
        runs[steps] = per_seed(fixed, optimizer="adamw", steps=steps)
    rows = ["| run | steps | final val loss | Δ = AdamW − Spectra-AdamW@200 (paired) | verdict: "
            "AdamW no lower than Spectra |", "|---|---:|---|---|---|"]  # fmt: skip
    rows.append(f"| Spectra-AdamW | 200 | {mean_std(spectra)} | (reference) | |")
    diffs = {}
    for steps, vals in runs.items():
        p = paired(spectra, vals)
        diffs[steps] = p
        rows.append(f"| AdamW ×{steps / 200:g} | {steps} | {mean_std(vals)} | {fmt_diff(p)} | "
                    f"{no_lower(p)} |")  # fmt: skip
    return "\n".join(rows), {"spectra": spectra, "runs": runs, "diffs": diffs}


def overhead_table(seeds: dict | None) -> str:
    rows = ["| Spectra-X | median step X (s) | median step Spectra-X (s) | overhead |",
            "|---|---:|---:|---:|"]  # fmt: skip
    for base, spectra in PAIRS:
        a, b = step_time(seeds, optimizer=base), step_time(seeds, optimizer=spectra)
        if a and b:
            rows.append(f"| {spectra} | {a:.3f} | {b:.3f} | {b / a - 1:+.1%} |")
        else:
            rows.append(f"| {spectra} | – | – | – |")
    return "\n".join(rows)


def same(p: dict | None) -> str:
    """Verdict for a claim of no difference."""
    if p is None:
        return "inconclusive (not run)"
    return "not held" if p["sig"] else "held (no significant difference)"


def summary_table(seeds: dict | None, stab: dict | None, c: dict, ns: dict, fx: dict) -> str:
    rows = ["| claim of the paper | here | verdict |", "|---|---|---|"]

    def add(claim: str, p: dict | None, verdict: str) -> None:
        rows.append(f"| {claim} | {fmt_diff(p)} | {verdict} |")

    for base, spectra in PAIRS:
        p = paired(per_seed(seeds, optimizer=spectra), per_seed(seeds, optimizer=base))
        add(f"{spectra} beats {base} at each one's tuned lr (Δ = {base} − {spectra})", p,
            lower(p))  # fmt: skip
    for base in BASELINES:
        verdicts = []
        for _, spectra in PAIRS:
            p = paired(per_seed(seeds, optimizer=spectra), per_seed(seeds, optimizer=base))
            verdicts.append(f"{spectra}: {lower(p)}")
        rows.append(f"| the SPECTRA variants beat {base} | see the pairs table | "
                    f"{'; '.join(verdicts)} |")  # fmt: skip
    spectra, signum = signum_runs(stab)
    best = best_lr(signum)
    if best is not None:
        p = paired(spectra, signum[best])
        add(f"batch 2: Spectra-Signum at lr 3e-3 beats the best Signum (lr {best:g}; Δ = "
            "Signum − Spectra-Signum)", p, lower(p))  # fmt: skip
    else:
        rows.append("| batch 2: Spectra-Signum at a large lr beats the best Signum | – | "
                    "inconclusive (not run) |")  # fmt: skip
    p1 = c["diffs"].get(1.0)
    add("c = 1 degrades (Δ = loss(c=1) − loss(c=10))", p1, lower(p1))
    for cval in (5.0, 20.0, 50.0):
        p = c["diffs"].get(cval)
        add(f"c = {cval:g} on par with c = 10 (Δ = loss(c={cval:g}) − loss(c=10))", p, same(p))
    for name in ("paper, N_s = 5, bf16", "paper, N_s = 15, fp32"):
        p = ns["diffs"].get(name)
        add(f"{name} on par with paper N_s = 10 bf16 (Δ = it − N_s 10)", p, same(p))
    p = ns["diffs"].get("ours, auto (accurate)")
    if p is None:
        ours = "inconclusive (not run)"
    elif p["sig"]:
        ours = "ours lower" if p["mean"] < 0 else "ours higher"
    else:
        ours = "no significant difference"
    add("(our question) the accurate clip trains better than the paper's bf16 N_s = 10 "
        "(Δ = ours − paper)", p, ours)  # fmt: skip
    for steps in (210, 220, 240):
        p = fx["diffs"][steps]
        add(f"AdamW with {steps / 200:g}x the steps is no better than Spectra-AdamW (Δ = "
            "AdamW − Spectra)", p, no_lower(p))  # fmt: skip
    return "\n".join(rows)


def tuned_lrs() -> dict[str, float]:
    out = {}
    for sweep in ("lr-adam", "lr-sign"):
        rep = load(sweep)
        for b in (rep or {}).get("best", []):
            out[b["point"]["optimizer"]] = b["lr"]
    return out


# ----- figures ----------------------------------------------------------------------------


def plot_methods(seeds: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, m in enumerate(ORDER):
        vals = list(per_seed(seeds, optimizer=m).values())
        if not vals:
            continue
        color = "tab:red" if m.startswith("spectra") else "tab:gray"
        ax.scatter([i] * len(vals), vals, s=12, color=color, alpha=0.5, zorder=3)
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        ax.errorbar([i], [statistics.fmean(vals)], yerr=[sd], fmt="o", color=color, capsize=4,
                    ms=7, zorder=4)  # fmt: skip
    ax.set_xticks(range(len(ORDER)), ORDER, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("final validation loss")
    ax.set_title("cpu-small, 200 steps, each at its tuned lr: mean ± std over seeds (dots: seeds)",
                 fontsize=9)  # fmt: skip
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save(fig, path)


def plot_ablations(c: dict, ns: dict, fx: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))

    def band(ax, vals, x, **kw):
        xs = list(vals.values())
        if xs:
            sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
            ax.errorbar([x], [statistics.fmean(xs)], yerr=[sd], fmt="o", capsize=4, **kw)
            ax.scatter([x] * len(xs), xs, s=10, alpha=0.4, color=kw.get("color", "k"))

    ax = axes[0]
    for cval, vals in c["values"].items():
        band(ax, vals, cval, color="tab:red")
    ax.set_xscale("log")
    ax.set_xticks(sorted(c["values"]), [f"{v:g}" for v in sorted(c["values"])])
    ax.minorticks_off()
    ax.set_xlabel("c")
    ax.set_ylabel("final validation loss")
    ax.set_title("Spectra-AdamW: clip threshold c", fontsize=9)

    ax = axes[1]
    names = list(ns["values"])
    for i, name in enumerate(names):
        band(ax, ns["values"][name], i, color="tab:blue" if "paper" in name else "tab:red")
    ax.set_xticks(range(len(names)), [n.replace(", ", "\n", 1) for n in names], fontsize=7)
    ax.set_title("Spectra-AdamW: the clip operator", fontsize=9)

    ax = axes[2]
    for steps, vals in fx["runs"].items():
        band(ax, vals, steps, color="tab:gray")
    xs = list(fx["spectra"].values())
    if xs:
        m = statistics.fmean(xs)
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        ax.axhspan(m - sd, m + sd, color="tab:red", alpha=0.2)
        ax.axhline(m, color="tab:red", label="Spectra-AdamW, 200 steps")
        ax.legend(fontsize=7)
    ax.set_xlabel("AdamW steps")
    ax.set_title("fixed time: AdamW given more steps", fontsize=9)
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("ablations (mean ± std over seeds; dots: seeds)", fontsize=9)
    fig.tight_layout()
    save(fig, path)


def train_curve(run_dir: Path, beta: float = 0.9) -> tuple[list[int], list[float]]:
    """A run's training loss, smoothed by an exponential moving average (bias-corrected)."""
    steps, losses, avg = [], [], 0.0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "train":
            avg = beta * avg + (1 - beta) * r["loss"]
            steps.append(r["step"])
            losses.append(avg / (1 - beta ** len(steps)))
    return steps, losses


def plot_signum(stab: dict | None, path: Path) -> bool:
    """Training loss of the Signum-stability runs, a line per seed (needs the run directories)."""
    runs_dir = RESULTS / "signum-stability" / "runs"
    if stab is None or not runs_dir.is_dir():
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {}
    for r in stab["runs"]:
        if r["status"] != "done":
            continue
        point = r["point"]
        name = f"{point['optimizer']}, lr {point.get('lr', 3e-3):g}"
        color = colors.setdefault(name, f"C{len(colors)}")
        steps, losses = train_curve(runs_dir / r["name"])
        ax.plot(steps, losses, color=color, lw=1, alpha=0.8,
                label=name if r["seed"] == 0 else None)  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (EMA 0.9)")
    ax.set_ylim(top=8.5)
    ax.set_title("batch 2 x 256 tokens: a line per seed", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save(fig, path)
    return True


def save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    from spectra_lab.files import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


# ----- the page ---------------------------------------------------------------------------


def fill(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- study:{name} -->\n).*?(<!-- /study:{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: no block <!-- study:{name} --> … <!-- /study:{name} -->")
    return pattern.sub(lambda m: m.group(1) + body.rstrip() + "\n" + m.group(2), text)


def main() -> int:
    from spectra_lab.files import atomic_write

    seeds, stab = load("seeds"), load("signum-stability")
    c_md, c = c_table(load("c-ablation"), seeds)
    ns_md, ns = ns_table(load("ns-ablation"), seeds)
    fx_md, fx = fixed_table(load("fixed-time"), seeds)
    blocks = {
        "summary": summary_table(seeds, stab, c, ns, fx),
        "methods": methods_table(seeds, tuned_lrs()),
        "pairs": pairs_table(seeds),
        "signum": signum_table(stab),
        "c": c_md,
        "ns": ns_md,
        "fixed": fx_md,
        "overhead": overhead_table(seeds),
    }
    text = DOC.read_text()
    for name, body in blocks.items():
        text = fill(text, name, body)
    atomic_write(DOC, text)
    plot_methods(seeds, FIGURES / "study_methods.png")
    plot_ablations(c, ns, fx, FIGURES / "study_ablations.png")
    if not plot_signum(stab, FIGURES / "study_signum.png"):
        print("study_signum.png not drawn: results/study/signum-stability/runs is missing")
    for name, body in blocks.items():
        print(f"## {name}\n{body}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
