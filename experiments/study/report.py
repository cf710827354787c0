"""The reproduction study's tables, verdicts, figures and the numbers quoted in its prose.

    python experiments/study/report.py            # rewrites the marked blocks of docs/results.md
    python experiments/study/report.py --check    # exits 1, with a diff, where the page differs

Reads ``results/study/<sweep>/results.json`` (written by ``spectra sweep``) and the benchmark
data it quotes (``docs/data/``), and writes:

- the marked blocks of docs/results.md: a table between ``<!-- study:NAME -->`` and
  ``<!-- /study:NAME -->`` on lines of their own, or a number or phrase between the two markers
  inside a line of prose;
- ``docs/figures/study_methods.png``, ``study_ablations.png`` and ``study_signum.png``.

A block whose data file is missing (the ``spectra bench step`` tables before their JSON is
stored) is left as it is, with a line saying so; ``--check`` reports it as not checked.
``--check`` writes nothing and draws no figure.

Every comparison is paired by seed (same seed, same data order and initialisation): for the
per-seed differences d_s = loss(B) − loss(A), their mean, sample std, n and the paired t
statistic t = mean / (std / √n). A difference is called significant when |t| exceeds the
two-sided 95% quantile of Student's t with n − 1 degrees of freedom (4.303 for n = 3).
A verdict follows from that rule alone, so it changes when the numbers do. Every Δ of the page
is labelled with the order of its difference (Δ = B − A).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from spectra_lab import pages

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results" / "study"
DATA = ROOT / "docs" / "data"
DOC = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
FIGURES = ROOT / "docs" / "figures"

#: Two-sided 95% quantiles of Student's t, by degrees of freedom (standard tables).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228}  # fmt: skip

PAIRS = [("adamw", "spectra-adamw"), ("signum", "spectra-signum"),
         ("ademamix", "spectra-ademamix")]  # fmt: skip
BASELINES = ["mars", "dmuon", "soap"]
LABELS = {"adamw": "AdamW", "signum": "Signum", "ademamix": "AdEMAMix", "mars": "MARS",
          "dmuon": "D-Muon", "soap": "SOAP", "spectra-adamw": "Spectra-AdamW",
          "spectra-signum": "Spectra-Signum", "spectra-ademamix": "Spectra-AdEMAMix"}  # fmt: skip
ORDER = ["adamw", "spectra-adamw", "signum", "spectra-signum", "ademamix", "spectra-ademamix",
         "mars", "dmuon", "soap"]  # fmt: skip


def load(sweep: str, results: Path = RESULTS) -> dict | None:
    path = results / sweep / "results.json"
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
    """Paired differences Δ = b − a over the seeds both have (None below two seeds)."""
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


def readme_methods_table(seeds: dict | None, tuned: dict[str, float]) -> str:
    """The README's table: each base optimizer beside its SPECTRA variant (then the baselines),
    with its tuned lr and final validation loss, mean ± std over seeds."""
    left = ["adamw", "signum", "ademamix", "mars", "soap"]
    right = ["spectra-adamw", "spectra-signum", "spectra-ademamix", "dmuon", None]
    lines = ["| method | tuned lr | final val loss | | method | tuned lr | final val loss |",
             "|---|---:|---:|---|---|---:|---:|"]  # fmt: skip

    def cells(name: str | None) -> list[str]:
        if name is None:
            return ["", "", ""]
        lr = f"{tuned[name]:.0e}".replace("e-0", "e-")
        row = [LABELS[name], lr, mean_std(per_seed(seeds, optimizer=name))]
        return [f"**{row[0]}**", row[1], f"**{row[2]}**"] if name.startswith("spectra-") else row

    for a, b in zip(left, right, strict=True):
        lines.append("| " + " | ".join([*cells(a), "", *cells(b)]).rstrip() + " |")
    return "\n".join(lines)


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
    rows = ["| c | final val loss | Δ = loss(c) − loss(c = 10) (paired) |", "|---:|---|---|"]
    diffs = {}
    for c in sorted(values):
        diffs[c] = None if c == 10.0 else paired(ref, values[c])
        rows.append(f"| {c:g} | {mean_std(values[c])} | "
                    f"{'(reference)' if c == 10.0 else fmt_diff(diffs[c])} |")  # fmt: skip
    return "\n".join(rows), {"values": values, "diffs": diffs}


def soft_and_hard(
    opt: str, c: float, hvs: dict | None, seeds: dict | None, cab: dict | None
) -> tuple[dict[int, float], dict[int, float]]:
    """``opt``'s losses by seed with the soft clip and with the hard one at ``c``: the soft runs
    at c = 10 are seeds.yaml's, Spectra-AdamW's at 5 and 20 c-ablation.yaml's."""
    if c == 10.0:
        soft = per_seed(seeds, optimizer=opt)
    elif opt == "spectra-adamw":
        soft = per_seed(cab, clip_c=c)
    else:
        soft = per_seed(hvs, optimizer=opt, clip_c=c, optimizer_kwargs=None)
    return soft, per_seed(hvs, optimizer=opt, clip_c=c, optimizer_kwargs={"post": "hard_clip"})


def hard_table(hvs: dict | None, seeds: dict | None, cab: dict | None) -> str:
    """Hard against soft clipping: final val loss of each, Δ = hard − soft (paired) per
    optimizer and c. The soft runs at c = 10 are seeds.yaml's, Spectra-AdamW's at 5 and 20
    c-ablation.yaml's."""
    rows = ["| optimizer | c | soft `H_c` | hard `min(σ, c)` | Δ = hard − soft (paired) | "
            "verdict |", "|---|---:|---|---|---|---|"]  # fmt: skip
    for opt in ("spectra-adamw", "spectra-signum"):
        for c in (5.0, 10.0, 20.0):
            soft, hard = soft_and_hard(opt, c, hvs, seeds, cab)
            d = paired(soft, hard)
            verdict = difference(d, "soft lower", "hard lower")
            rows.append(f"| {opt} | {c:g} | {mean_std(soft)} | {mean_std(hard)} | "
                        f"{fmt_diff(d)} | {verdict} |")  # fmt: skip
    return "\n".join(rows)


def difference(d: dict | None, lower_name: str, higher_name: str) -> str:
    """Verdict of Δ = b − a: which ends lower when the paired t passes, else no difference."""
    if d is None:
        return "–"
    if not d["sig"]:
        return "no difference"
    return lower_name if d["mean"] > 0 else higher_name


#: The adaptive-preclip sweep's pre-clip settings, by row label (the runs without pre-clipping
#: are signum-stability.yaml's Spectra-Signum runs).
PRECLIP_CASES = [
    ("constant, c = 0.1", {"pre_clip_c": 0.1}),
    ("cosine, c: 10 → 0.01", {"pre_clip_c": 10.0, "pre_clip_schedule": "cosine"}),
    ("adaptive, κ = 0.5", {"pre_clip_kappa": 0.5}),
    ("adaptive, κ = 1", {"pre_clip_kappa": 1.0}),
    ("adaptive, κ = 2", {"pre_clip_kappa": 2.0}),
]


def preclip_table(adp: dict | None, stab: dict | None) -> str:
    """Spectra-Signum at batch 2 without pre-clipping and with the constant, cosine and
    adaptive thresholds: Δ against no pre-clip and against the cosine schedule (paired)."""
    none = per_seed(stab, optimizer="spectra-signum")
    runs = {label: per_seed(adp, **point) for label, point in PRECLIP_CASES}
    cosine = runs["cosine, c: 10 → 0.01"]
    rows = ["| pre-clip | final val loss | Δ = loss − none (paired) | vs none | "
            "Δ = loss − cosine (paired) | vs cosine |", "|---|---|---|---|---|---|",
            f"| none | {mean_std(none)} | (reference) | | | |"]  # fmt: skip
    for label, _ in PRECLIP_CASES:
        vals = runs[label]
        d_none = paired(none, vals)
        row = f"| {label} | {mean_std(vals)} | {fmt_diff(d_none)} | "
        row += f"{difference(d_none, 'none lower', 'lower than none')} | "
        if label.startswith("cosine"):
            row += "(reference) | |"
        else:
            d_cos = paired(cosine, vals)
            row += f"{fmt_diff(d_cos)} | {difference(d_cos, 'cosine lower', 'lower than cosine')} |"
        rows.append(row)
    return "\n".join(rows)


#: longer.yaml's five methods with their points (the tuned lrs of seeds.yaml).
LONGER = [
    ("adamw", {"optimizer": "adamw"}),
    ("spectra-adamw", {"optimizer": "spectra-adamw"}),
    ("spectra-signum", {"optimizer": "spectra-signum"}),
    ("dmuon", {"optimizer": "dmuon"}),
    ("soap", {"optimizer": "soap"}),
]
#: the leaders' lrs re-checked at ×0.5 and ×2 (longer-lr.yaml), around their tuned lr
LONGER_LRS = {"spectra-adamw": (1e-3, 2e-3, 4e-3), "dmuon": (5e-3, 1e-2, 2e-2)}


def longer_runs(longer: dict | None, seeds: dict | None) -> dict[str, tuple[dict, dict]]:
    """Per method: (200-step losses of seeds.yaml, 600-step losses of longer.yaml) by seed."""
    return {
        name: (per_seed(seeds, optimizer=name), per_seed(longer, **point)) for name, point in LONGER
    }


def longer_table(longer: dict | None, seeds: dict | None) -> str:
    """The five methods at 200 and at 600 steps, each at its tuned lr, with its rank; then
    the comparisons of the SPECTRA variants with AdamW, D-Muon and SOAP at both budgets."""
    runs = longer_runs(longer, seeds)

    def ranks(i: int) -> dict[str, int]:
        means = {n: statistics.fmean(v[i].values()) for n, v in runs.items() if v[i]}
        return {n: k + 1 for k, n in enumerate(sorted(means, key=means.get))}

    r200, r600 = ranks(0), ranks(1)
    rows = ["| method | 200 steps (0.4M tokens) | rank | 600 steps (1.2M tokens) | rank |",
            "|---|---|---:|---|---:|"]  # fmt: skip
    for name, (short, long) in runs.items():
        rows.append(f"| {name} | {mean_std(short)} | {r200.get(name, '–')} | {mean_std(long)} | "
                    f"{r600.get(name, '–')} |")  # fmt: skip
    rows += ["", "| comparison | Δ at 200 steps (paired) | Δ at 600 steps (paired) | "
             "verdict at 600 |", "|---|---|---|---|"]  # fmt: skip
    for a, b in [("spectra-adamw", "adamw"), ("spectra-adamw", "dmuon"),
                 ("spectra-signum", "dmuon"), ("spectra-adamw", "soap"),
                 ("spectra-signum", "soap")]:  # fmt: skip
        d200 = paired(runs[a][0], runs[b][0])
        d600 = paired(runs[a][1], runs[b][1])
        rows.append(f"| Δ = {b} − {a} | {fmt_diff(d200)} | {fmt_diff(d600)} | "
                    f"{difference(d600, f'{a} lower', f'{b} lower')} |")  # fmt: skip
    return "\n".join(rows)


def longer_lr_table(longer: dict | None, longer_lr: dict | None) -> str:
    """The leaders at ×0.5, ×1 and ×2 their tuned lr for 600 steps: does the tuned lr hold?"""
    rows = ["| method | lr | final val loss (600 steps) | Δ = loss − loss(tuned lr) (paired) | "
            "verdict |", "|---|---:|---|---|---|"]  # fmt: skip
    for name, lrs in LONGER_LRS.items():
        tuned = per_seed(longer, optimizer=name)
        for lr in lrs:
            if lr == lrs[1]:
                rows.append(f"| {name} | {lr:g} (tuned) | {mean_std(tuned)} | (reference) | |")
                continue
            vals = per_seed(longer_lr, optimizer=name, lr=lr)
            d = paired(tuned, vals)
            rows.append(f"| {name} | {lr:g} | {mean_std(vals)} | {fmt_diff(d)} | "
                        f"{difference(d, 'tuned lower', 'lower than tuned')} |")  # fmt: skip
    best = {}
    for name, lrs in LONGER_LRS.items():
        by_lr = {lr: per_seed(longer_lr, optimizer=name, lr=lr) for lr in lrs}
        by_lr[lrs[1]] = per_seed(longer, optimizer=name)
        lr = best_lr({k: v for k, v in by_lr.items() if len(v) == 3})
        if lr is not None:
            best[name] = (lr, by_lr[lr])
    if len(best) == 2:
        (a, (lr_a, va)), (b, (lr_b, vb)) = best.items()
        d = paired(va, vb)
        rows += ["", "| the two at their best lr of the three | Δ (paired) | verdict |",
                 "|---|---|---|",
                 f"| Δ = {b}@{lr_b:g} − {a}@{lr_a:g} | {fmt_diff(d)} | "
                 f"{difference(d, f'{a} lower', f'{b} lower')} |"]  # fmt: skip
    return "\n".join(rows)


#: recheck-lr.yaml's methods and the points that select their runs (D-Muon with float32
#: Newton–Schulz, as in longer.yaml)
RECHECK = {
    name: {"optimizer": name} for name in ("dmuon", "spectra-adamw", "spectra-signum", "soap")
}
#: the seeds an lr is picked on, apart from the comparison's (0, 1, 2)
PICK_SEEDS = (3, 4, 5)


def picked_lrs(
    recheck: dict | None, names: tuple[str, ...] = tuple(RECHECK)
) -> dict[str, tuple[float, dict[float, dict[int, float]]]]:
    """Per method of the re-check (``names``): its lr with the lowest mean loss over the picking
    seeds, and every lr's losses by seed. ``Missing`` until every lr has all its picking
    seeds."""
    out = {}
    for name in names:
        point = RECHECK[name]
        lrs = sorted({r["point"]["lr"] for r in (recheck or {}).get("runs", [])
                      if all(r["point"].get(k) == v for k, v in point.items())})  # fmt: skip
        by_lr = {lr: per_seed(recheck, **point, lr=lr) for lr in lrs}
        if not lrs or any(sorted(v) != list(PICK_SEEDS) for v in by_lr.values()):
            raise Missing(f"recheck-lr: {name} has not run every lr on seeds {PICK_SEEDS}")
        out[name] = (best_lr(by_lr), by_lr)
    return out


def compared_at(name: str, lr: float, sweeps: dict[str, dict | None]) -> dict[int, float]:
    """The comparison seeds' losses of ``name`` at ``lr`` (600 steps), from whichever sweep ran
    them: longer.yaml (the 200-step tuned lrs), longer-lr.yaml (×0.5, ×2 of the leaders') or
    recheck-compare.yaml (the rest)."""
    for sweep in ("longer", "longer-lr", "recheck-compare"):
        runs = (sweeps.get(sweep) or {}).get("runs", [])
        vals = {r["seed"]: r["val_loss"] for r in runs
                if r["point"].get("optimizer") == name and r["val_loss"] is not None
                and math.isclose(r["point"].get("lr", math.nan), lr)}  # fmt: skip
        if vals:
            return vals
    return {}


def recheck_table(recheck: dict | None, sweeps: dict[str, dict | None]) -> str:
    """Every method of the re-check at its own best lr, picked on seeds 3-5 and compared on
    seeds 0-2, with the paired Δ against D-Muon at its own. A method still being picked or
    compared is a row that says so, with the lrs it has run so far."""
    ((ref_lr, _),) = picked_lrs(recheck, ("dmuon",)).values()
    ref = compared_at("dmuon", ref_lr, sweeps)
    if sorted(ref) != [0, 1, 2]:
        raise Missing(f"dmuon at lr {ref_lr:g} has not run on seeds 0-2")
    rows = ["| method | lrs tried (seeds 3-5: mean loss) | picked lr | final val loss, seeds 0-2 "
            "| Δ = loss − D-Muon's (paired) | verdict |", "|---|---|---:|---|---|---|"]  # fmt: skip
    for name, point in RECHECK.items():
        lrs = sorted({r["point"]["lr"] for r in (recheck or {}).get("runs", [])
                      if all(r["point"].get(k) == v for k, v in point.items())})  # fmt: skip
        by_lr = {lr: per_seed(recheck, **point, lr=lr) for lr in lrs}
        tried = ", ".join(
            f"{x:g}: " + (f"{statistics.fmean(v.values()):.3f}" if v else "–")
            + ("" if sorted(v) == list(PICK_SEEDS) else f" ({len(v)} of {len(PICK_SEEDS)} seeds)")
            for x, v in by_lr.items()
        )  # fmt: skip
        if not lrs or any(sorted(v) != list(PICK_SEEDS) for v in by_lr.values()):
            rows.append(f"| {name} | {tried or 'not run yet'} | being picked | – | – | |")
            continue
        lr = best_lr(by_lr)
        vals = compared_at(name, lr, sweeps)
        picked = f"{lr:g}" + (" (the grid's edge)" if lr in (lrs[0], lrs[-1]) else "")
        if sorted(vals) != [0, 1, 2]:
            rows.append(f"| {name} | {tried} | {picked} | seeds 0-2 not run yet | – | |")
            continue
        d = None if name == "dmuon" else paired(ref, vals)
        diff = "(reference)" if d is None else fmt_diff(d)
        verdict = "" if d is None else difference(d, "D-Muon lower", f"{name} lower")
        rows.append(f"| {name} | {tried} | {picked} | {mean_std(vals)} | {diff} | {verdict} |")
    return "\n".join(rows)


#: the soft orthogonalization's κ axis (soft-muon-lr.yaml), from near Muon to near SGD-M
SOFT_KAPPAS = (0.03, 0.1, 0.3, 1.0, 3.0)
#: ...and its lr grid (soft-muon-lr.yaml): a κ is picked once it has run them all, or once three
#: lrs or more put its best inside those it ran
SOFT_LRS = (6.25e-4, 1.25e-3, 2.5e-3, 5e-3, 1e-2)


def soft_kappa_of(run: dict) -> float | None:
    return (run["point"].get("optimizer_kwargs") or {}).get("soft_kappa")


def soft_muon_pick(
    select: dict | None, kappa: float
) -> tuple[dict[float, float], float | None, bool]:
    """κ's lr selection (soft-muon-lr.yaml, seed 3): its losses by lr, the lr picked (None while
    it is being picked: its whole grid has not run and fewer than three lrs put the best
    inside them) and whether that pick is the edge of the lrs tried."""
    tried = {r["point"]["lr"]: r["val_loss"] for r in (select or {}).get("runs", [])
             if soft_kappa_of(r) == kappa and r["val_loss"] is not None}  # fmt: skip
    if not tried:
        return tried, None, False
    lr = min(tried, key=tried.get)
    whole = all(any(math.isclose(x, g) for x in tried) for g in SOFT_LRS)
    edge = lr in (min(tried), max(tried))
    if not whole and (len(tried) < 3 or edge):
        return tried, None, edge
    return tried, lr, edge


def soft_muon_compared(compare: dict | None, kappa: float, lr: float) -> dict[int, float]:
    """κ's final losses on the comparison seeds at its picked lr (soft-muon.yaml)."""
    return {r["seed"]: r["val_loss"] for r in (compare or {}).get("runs", [])
            if soft_kappa_of(r) == kappa and r["val_loss"] is not None
            and math.isclose(r["point"].get("lr", math.nan), lr)}  # fmt: skip


def soft_muon_table(select: dict | None, compare: dict | None, dmuon: dict[int, float]) -> str:
    """The soft-Muon axis: for each κ, the lr picked on seed 3 (soft-muon-lr.yaml) and the
    final loss on seeds 0-2 at it (soft-muon.yaml), paired against D-Muon at its best lr."""
    rows = ["| κ | lrs tried (seed 3: loss) | picked lr | final val loss, seeds 0-2 | "
            "Δ = loss − D-Muon's (paired) | verdict |", "|---:|---|---:|---|---|---|"]  # fmt: skip
    for kappa in SOFT_KAPPAS:
        tried, lr, edge = soft_muon_pick(select, kappa)
        if not tried:  # a row that says what is pending, so that the finished ones show
            rows.append(f"| {kappa:g} | not run yet | – | – | – | |")
            continue
        listed = ", ".join(f"{x:g}: {v:.3f}" for x, v in sorted(tried.items()))
        if lr is None:
            rows.append(f"| {kappa:g} | {listed} | being picked | – | – | |")
            continue
        edge_note = " (the grid's edge)" if edge else ""
        vals = soft_muon_compared(compare, kappa, lr)
        if sorted(vals) != [0, 1, 2]:
            rows.append(
                f"| {kappa:g} | {listed} | {lr:g}{edge_note} | seeds 0-2 not run yet | – | |"
            )
            continue
        d = paired(dmuon, vals)
        verdict = difference(d, "D-Muon lower", f"κ = {kappa:g} lower")
        rows.append(f"| {kappa:g} | {listed} | {lr:g}{edge_note} | {mean_std(vals)} | "
                    f"{fmt_diff(d)} | {verdict} |")  # fmt: skip
    if select is None:
        raise Missing("soft-muon-lr has not run")
    return "\n".join(rows)


def listing(labels: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def soft_muon_final(select: dict | None, compare: dict | None, kappa: float) -> tuple:
    """κ's picked lr (None while being picked) and its final losses on seeds 0-2 there."""
    _, lr, _ = soft_muon_pick(select, kappa)
    return lr, (soft_muon_compared(compare, kappa, lr) if lr else {})


def soft_muon_prose(select: dict | None, compare: dict | None, dmuon: dict[int, float]) -> str:
    """The soft-Muon axis in a sentence: the κs D-Muon ends significantly lower than, level
    with and higher than (each at its picked lr, paired on seeds 0-2), and how many are pending."""
    by: dict[str, list[str]] = {"lower": [], "level": [], "higher": []}
    for kappa in SOFT_KAPPAS:
        vals = soft_muon_final(select, compare, kappa)[1]
        if sorted(vals) != [0, 1, 2]:
            continue
        d = paired(dmuon, vals)
        key = "level" if not d["sig"] else ("lower" if d["mean"] > 0 else "higher")
        by[key].append(f"{kappa:g}")

    def kappas(values: list[str]) -> str:
        return f"κ = {listing(values)}"

    parts = []
    if by["lower"]:
        parts.append(f"D-Muon ends significantly lower than {kappas(by['lower'])}")
    if by["level"]:
        parts.append(f"level with {kappas(by['level'])}")
    if by["higher"]:
        parts.append(f"significantly higher than {kappas(by['higher'])}")
    pending = len(SOFT_KAPPAS) - sum(len(v) for v in by.values())
    if not pending and not by["higher"]:
        parts.append("no κ ends significantly lower than D-Muon")
    tail = f"; {pending} of the {len(SOFT_KAPPAS)} κs still running" if pending else ""
    return ("; ".join(parts) or "no κ compared yet") + tail


def dmuon_reference(results: Path = RESULTS) -> tuple[float, dict[int, float]]:
    """D-Muon's best lr of the re-check and its losses there on the comparison seeds 0-2."""
    lr, _ = picked_lrs(load("recheck-lr", results), ("dmuon",))["dmuon"]
    sweeps = {s: load(s, results) for s in ("longer", "longer-lr", "recheck-compare")}
    return lr, compared_at("dmuon", lr, sweeps)


def dmuon_best(results: Path = RESULTS) -> dict[int, float]:
    """D-Muon at its best lr of the re-check, on the comparison seeds 0-2."""
    return dmuon_reference(results)[1]


#: dmuon-preclip.yaml's cases, by row label
DMUON_PRECLIP_CASES = [("cosine, c from 10 to 0.01", {"pre_clip_schedule": "cosine"}),
                       ("adaptive, κ = 1", {"pre_clip_kappa": 1.0}),
                       ("adaptive, κ = 2", {"pre_clip_kappa": 2.0})]  # fmt: skip


def dmuon_preclip_table(preclip: dict | None, dmuon: dict[int, float]) -> str:
    """D-Muon with SPECTRA's pre-clip (dmuon-preclip.yaml) against D-Muon alone, paired; a
    case still running is a row that says how many of its seeds have finished."""
    if preclip is None:
        raise Missing("dmuon-preclip has not run")
    rows = ["| pre-clip | final val loss, seeds 0-2 | Δ = loss − D-Muon's (paired) | verdict |",
            "|---|---|---|---|",
            f"| none (D-Muon) | {mean_std(dmuon)} | (reference) | |"]  # fmt: skip
    for label, point in DMUON_PRECLIP_CASES:
        vals = per_seed(preclip, **point)
        if sorted(vals) != [0, 1, 2]:
            rows.append(f"| {label} | {len(vals)} of 3 seeds run | – | |")
            continue
        d = paired(dmuon, vals)
        rows.append(f"| {label} | {mean_std(vals)} | {fmt_diff(d)} | "
                    f"{difference(d, 'D-Muon alone lower', 'pre-clipped lower')} |")  # fmt: skip
    return "\n".join(rows)


#: the row label of dmuon-bf16.yaml's runs (all of them: bf16 Newton–Schulz at D-Muon's lr)
DMUON_BF16_LABEL = "bf16 (torch's Muon, D-Muon's default)"


def dmuon_bf16_compared(bf16: dict | None, dmuon: dict[int, float]) -> tuple[dict, dict | None]:
    """dmuon-bf16.yaml's final losses by seed, and Δ against float32 (None until seeds 0-2)."""
    vals = per_seed(bf16)
    return vals, (paired(dmuon, vals) if sorted(vals) == [0, 1, 2] else None)


def dmuon_bf16_table(bf16: dict | None, dmuon: dict[int, float]) -> str:
    """D-Muon with bf16 Newton–Schulz (dmuon-bf16.yaml) against the study's float32 iteration at
    the same lr, paired; while it runs, a row that says how many seeds have finished."""
    if bf16 is None:
        raise Missing("dmuon-bf16 has not run")
    rows = ["| Newton–Schulz | final val loss, seeds 0-2 | Δ = loss − float32's (paired) | "
            "verdict |", "|---|---|---|---|",
            f"| float32 (the study's D-Muon) | {mean_std(dmuon)} | (reference) | |"]  # fmt: skip
    vals, d = dmuon_bf16_compared(bf16, dmuon)
    if d is None:
        rows.append(f"| {DMUON_BF16_LABEL} | {len(vals)} of 3 seeds run | – | |")
    else:
        rows.append(f"| {DMUON_BF16_LABEL} | {mean_std(vals)} | {fmt_diff(d)} | "
                    f"{difference(d, 'float32 lower', 'bf16 lower')} |")  # fmt: skip
    return "\n".join(rows)


def dmuon_bf16_prose(bf16: dict | None, dmuon: dict[int, float]) -> str:
    """The bf16 Newton–Schulz check in a phrase, for the cautions."""
    vals, d = dmuon_bf16_compared(bf16, dmuon)
    if d is None:
        return f"its bf16 iteration is still running ({len(vals)} of 3 seeds)"
    verdict = difference(d, "float32 lower", "bf16 lower")
    if verdict == "no difference":
        verdict = "no difference within three seeds"
    return (
        f"with bf16 Newton–Schulz at the same lr it ends at {mean_std(vals)}, "
        f"Δ = {fmt_diff(d)} against float32: {verdict}"
    )


#: the re-check's SPECTRA variants and SOAP, by the name the answer table gives them
MUON_RIVALS = {"spectra-adamw": "Spectra-AdamW", "spectra-signum": "Spectra-Signum",
               "soap": "SOAP"}  # fmt: skip


def muon_rivals(results: Path) -> tuple[float, dict[int, float], list[dict]]:
    """D-Muon's re-checked lr and its losses on seeds 0-2, and each rival's row against it:
    ``label``, ``lr`` (None while being picked), ``vals`` (seeds 0-2) and the paired ``d``
    (None until all three have run). The rivals: the re-check's methods at their picked lrs,
    the soft-Muon κ that ends lowest on seeds 0-2 (of those compared), and the pre-clip of
    D-Muon that does (of the three)."""
    recheck = load("recheck-lr", results)
    sweeps = {s: load(s, results) for s in ("longer", "longer-lr", "recheck-compare")}
    ref_lr, ref = dmuon_reference(results)
    if sorted(ref) != [0, 1, 2]:
        raise Missing(f"dmuon at lr {ref_lr:g} has not run on seeds 0-2")

    def row(label: str, lr: float | None, vals: dict[int, float], pending: str = "") -> dict:
        done = sorted(vals) == [0, 1, 2]
        pending = pending or ("lr being picked" if lr is None else "seeds 0-2 not run yet")
        return {"label": label, "lr": lr, "vals": vals, "pending": pending,
                "d": paired(ref, vals) if done else None}  # fmt: skip

    rows = []
    for name, label in MUON_RIVALS.items():
        try:
            lr, _ = picked_lrs(recheck, (name,))[name]
        except Missing:
            lr = None
        rows.append(row(label, lr, compared_at(name, lr, sweeps) if lr else {}))
    select, compare = load("soft-muon-lr", results), load("soft-muon", results)
    softs = []
    for kappa in SOFT_KAPPAS:
        lr, vals = soft_muon_final(select, compare, kappa)
        if sorted(vals) == [0, 1, 2]:
            softs.append(row(f"D-Muon's soft clip (κ = {kappa:g})", lr, vals))
    rows.append(lowest(softs) or row("D-Muon's soft clip", None, {}, "no κ compared yet"))
    preclip = load("dmuon-preclip", results)
    pre = [row(f"D-Muon + pre-clip ({label})", ref_lr, per_seed(preclip, **point))
           for label, point in DMUON_PRECLIP_CASES]  # fmt: skip
    done = [r for r in pre if r["d"] is not None]
    rows.append(lowest(done) or row("D-Muon + pre-clip", ref_lr, {}, "no case finished yet"))
    return ref_lr, ref, rows


def lowest(rows: list[dict]) -> dict | None:
    """The row whose seeds end lowest on average (None for no rows)."""
    return min(rows, key=lambda r: statistics.fmean(r["vals"].values()), default=None)


def muon_table(results: Path) -> str:
    """SPECTRA or Muon: D-Muon at its re-checked lr against each rival at its own, seeds 0-2."""
    ref_lr, ref, rivals = muon_rivals(results)
    rows = ["| at 600 steps, seeds 0-2 | lr | final val loss | Δ = loss − D-Muon's (paired) | "
            "verdict |", "|---|---:|---|---|---|",
            f"| D-Muon | {ref_lr:g} | {mean_std(ref)} | (reference) | |"]  # fmt: skip
    for r in rivals:
        if r["d"] is None:
            lr = "–" if r["lr"] is None else f"{r['lr']:g}"
            rows.append(f"| {r['label']} | {lr} | {r['pending']} | – | |")
            continue
        verdict = difference(r["d"], "D-Muon lower", f"{r['label']} lower")
        rows.append(f"| {r['label']} | {r['lr']:g} | {mean_std(r['vals'])} | {fmt_diff(r['d'])} "
                    f"| {verdict} |")  # fmt: skip
    return "\n".join(rows)


def muon_answer_prose(results: Path) -> str:
    """The answer so far: how many of the rivals compared D-Muon ends below, level with or
    above, and which are still running."""
    _, _, rivals = muon_rivals(results)
    done = [r for r in rivals if r["d"] is not None]
    below = [r["label"] for r in done if r["d"]["sig"] and r["d"]["mean"] > 0]
    level = [r["label"] for r in done if not r["d"]["sig"]]
    above = [r["label"] for r in done if r["d"]["sig"] and r["d"]["mean"] < 0]

    parts = []
    if below:
        parts.append(f"D-Muon ends significantly lower than {listing(below)}")
    if level:
        parts.append(f"level with {listing(level)}, within the noise of three seeds")
    if above:
        parts.append(f"significantly higher than {listing(above)}")
    pending = len(rivals) - len(done)
    verb = "is" if pending == 1 else "are"
    tail = f"; {pending} of the {len(rivals)} comparisons {verb} still running" if pending else ""
    return ("; ".join(parts) or "no comparison has finished yet") + tail


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
    rows = ["| operator | final val loss | Δ = it − paper N_s = 10 bf16 (paired) "
            "| median step (s) |", "|---|---|---|---:|"]  # fmt: skip
    diffs = {}
    for name, vals in values.items():
        is_ref = name == "paper, N_s = 10, bf16"
        diffs[name] = None if is_ref else paired(base, vals)
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


def ours_verdict(p: dict | None) -> str:
    """Which operator trains to the lower loss, for Δ = loss(ours) − loss(paper's)."""
    if p is None:
        return "inconclusive (not run)"
    if not p["sig"]:
        return "no significant difference"
    return "ours lower" if p["mean"] < 0 else "ours higher"


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
    add("(our question) the accurate clip trains better than the paper's bf16 N_s = 10 "
        "(Δ = ours − paper)", p, ours_verdict(p))  # fmt: skip
    for steps in (210, 220, 240):
        p = fx["diffs"][steps]
        add(f"AdamW with {steps / 200:g}x the steps is no better than Spectra-AdamW (Δ = "
            "AdamW − Spectra)", p, no_lower(p))  # fmt: skip
    return "\n".join(rows)


def tuned_lrs(results: Path = RESULTS) -> dict[str, float]:
    out = {}
    for sweep in ("lr-adam", "lr-sign"):
        rep = load(sweep, results)
        for b in (rep or {}).get("best", []):
            out[b["point"]["optimizer"]] = b["lr"]
    return out


# ----- numbers quoted in the prose -------------------------------------------------------


class Missing(Exception):
    """What a block is computed from is missing: the block is left as it is."""


def mean_of(values: dict[int, float], what: str) -> float:
    if not values:
        raise Missing(f"no runs of {what}")
    return statistics.fmean(values.values())


def span(lo: float, hi: float, fmt: Callable[[float], str], unit: str = "") -> str:
    """``lo–hi`` formatted by ``fmt`` (one number where both print the same)."""
    a, b = fmt(lo), fmt(hi)
    return f"{a}{unit}" if a == b else f"{a}–{b}{unit}"


def more_or_less(x: float) -> str:
    """A relative difference in words: ``17% more``, ``5% less``."""
    return f"{abs(x):.0%} {'more' if x >= 0 else 'less'}"


def step_times(seeds: dict | None, *names: str) -> list[float]:
    times = [step_time(seeds, optimizer=name) for name in names]
    missing = [name for name, t in zip(names, times, strict=True) if t is None]
    if missing:
        raise Missing(f"no step times of {', '.join(missing)}")
    return times  # type: ignore[return-value]


def c50_prose(c: dict, seeds: dict | None) -> str:
    """How far c = 50 moves Spectra-AdamW's mean loss from c = 10 towards AdamW's (same lr):
    (loss(c=50) − loss(c=10)) / (loss(AdamW) − loss(c=10))."""
    c10 = mean_of(c["values"][10.0], "spectra-adamw (c = 10)")
    c50 = mean_of(c["values"][50.0], "c = 50")
    adamw = mean_of(per_seed(seeds, optimizer="adamw"), "adamw")
    return (f"{(c50 - c10) / (adamw - c10):.0%} of the way there ({c50:.3f}, from {c10:.3f} at "
            f"c = 10 towards AdamW's {adamw:.3f})")  # fmt: skip


NAMES = {"adamw": "AdamW", "signum": "Signum", "ademamix": "AdEMAMix"}


def gaps_prose(seeds: dict | None) -> str:
    """Each base optimizer's mean paired gap to its Spectra twin, smallest first."""
    gaps = {}
    for base, spectra in PAIRS:
        p = paired(per_seed(seeds, optimizer=spectra), per_seed(seeds, optimizer=base))
        if p is None:
            raise Missing(f"fewer than two paired seeds of {base} and {spectra}")
        gaps[base] = p["mean"]
    order = sorted(gaps, key=gaps.get)
    return ", ".join(
        f"{gaps[b]:.2f}{' nats' if i == 0 else ''} for {NAMES[b]}" for i, b in enumerate(order)
    )


def dmuon_ratio_prose(seeds: dict | None) -> str:
    adamw, dmuon = step_times(seeds, "adamw", "dmuon")
    return f"{more_or_less(dmuon / adamw - 1)} than AdamW's"


def dmuon_step_prose(seeds: dict | None) -> str:
    adamw, dmuon = step_times(seeds, "adamw", "dmuon")
    return f"{dmuon:.3f} s, {more_or_less(dmuon / adamw - 1)} than AdamW's {adamw:.3f} s"


def soap_step_prose(seeds: dict | None) -> str:
    adamw, soap = step_times(seeds, "adamw", "soap")
    return f"{soap / adamw:.1f}× AdamW's ({soap:.3f} s against {adamw:.3f} s)"


def gaps_range_prose(seeds: dict | None) -> str:
    """The smallest and largest mean paired gap of a base optimizer to its Spectra twin."""
    gaps = [paired(per_seed(seeds, optimizer=s), per_seed(seeds, optimizer=b)) for b, s in PAIRS]
    if None in gaps:
        raise Missing("fewer than two paired seeds of a base optimizer and its Spectra twin")
    return span(min(g["mean"] for g in gaps), max(g["mean"] for g in gaps), lambda x: f"{x:.2f}",
                " nats")  # fmt: skip


def means(seeds: dict | None, *names: str) -> dict[str, float]:
    return {n: mean_of(per_seed(seeds, optimizer=n), n) for n in names}


SPECTRA_VARIANTS = ("spectra-adamw", "spectra-signum", "spectra-ademamix")


def variants_spread_prose(seeds: dict | None) -> str:
    """How far apart the three SPECTRA variants' mean losses end."""
    m = means(seeds, *SPECTRA_VARIANTS).values()
    return f"within {max(m) - min(m):.2f}"


def baselines_prose(seeds: dict | None) -> str:
    """D-Muon's mean loss and its distance below the SPECTRA variants; SOAP's mean loss."""
    m = means(seeds, "dmuon", "soap", *SPECTRA_VARIANTS)
    below = [m[v] - m["dmuon"] for v in SPECTRA_VARIANTS]
    return (f"({m['dmuon']:.3f}, {span(min(below), max(below), lambda x: f'{x:.2f}')} below the "
            f"SPECTRA variants) and SOAP is level with them ({m['soap']:.3f})")  # fmt: skip


def dmuon_closest_prose(seeds: dict | None) -> str:
    """The SPECTRA variant whose paired gap to D-Muon has the largest |t|, and that t."""
    dmuon = per_seed(seeds, optimizer="dmuon")
    ts = {v: paired(dmuon, per_seed(seeds, optimizer=v)) for v in SPECTRA_VARIANTS}
    if None in ts.values():
        raise Missing("fewer than two paired seeds of D-Muon and a SPECTRA variant")
    v = max(ts, key=lambda k: abs(ts[k]["t"]))
    who = "ahead of" if ts[v]["mean"] > 0 else "behind"
    return f"D-Muon is {who} {LABELS[v]} with t = {-ts[v]['t']:.1f}".replace("= -", "= −")


def repeat_prose(seeds: dict | None, lr_adam: dict | None) -> str:
    """AdamW's seed-0 loss in the seeds sweep and in the lr sweep's run of the same point."""
    lr = tuned_lrs()["adamw"]
    a = per_seed(seeds, optimizer="adamw").get(0)
    b = per_seed(lr_adam, optimizer="adamw", lr=lr).get(0)
    if a is None or b is None:
        raise Missing("AdamW's seed 0 is missing from the seeds or the lr sweep")
    if f"{a:.5f}" != f"{b:.5f}":
        raise Missing(f"AdamW's seed 0 differs between the sweeps ({a:.5f}, {b:.5f})")
    return f"AdamW {a:.5f} in both"


def signum_prose(stab: dict | None) -> dict[str, str]:
    """Batch 2: how far Signum at the large lr ends above Spectra-Signum; Signum's best lr of
    the three with its loss; and Spectra-Signum's paired gap to that best."""
    spectra, signum = signum_runs(stab)
    best = best_lr(signum)
    if best is None or not signum[3e-3] or not spectra:
        raise Missing("signum-stability has not run")
    gap = mean_of(signum[3e-3], "signum") - mean_of(spectra, "spectra-signum")
    beat = paired(spectra, signum[best])
    if beat is None:
        raise Missing("fewer than two paired seeds of Signum and Spectra-Signum at batch 2")
    return {"signum-gap": f"{gap:.2f} nats",
            "signum-best": f"{lr_text(best)} ({mean_std(signum[best]).split(' (')[0]})",
            "signum-beat": f"{beat['mean']:.2f} ± {beat['std']:.2f} nats"}  # fmt: skip


def lr_text(x: float) -> str:
    mantissa, exp = f"{x:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exp)}"


def recorded_sigma_prose(data: Path, c: float) -> str:
    """σ_max/c of the AdamW directions recorded from a cpu-small run (the recorded-input cells
    of bench ops, measured at c = 10), rescaled to the threshold ``c``."""
    cells = [x for x in ops_cells(data, "bench_ops_cpu_recorded.json")
             if x["input"].startswith("adamw@")]  # fmt: skip
    if not cells:
        raise Missing("no AdamW recorded cells in bench_ops_cpu_recorded.json")
    r = [x["sigma_over_c"] * 10 / c for x in cells]
    fmt = (lambda x: f"{x:.0f}") if c == 10 else (lambda x: f"{x:.1f}")
    return span(min(r), max(r), fmt)


def hard_soft_prose(hvs: dict | None, seeds: dict | None, cab: dict | None) -> str:
    """The largest |Δ| between hard and soft clipping at c = 5 and 10, over both optimizers."""
    worst = 0.0
    for opt in ("spectra-adamw", "spectra-signum"):
        for c in (5.0, 10.0):
            d = paired(*soft_and_hard(opt, c, hvs, seeds, cab))
            if d is None:
                raise Missing(f"hard-vs-soft: {opt} at c = {c:g} has not run")
            worst = max(worst, abs(d["mean"]))
    return f"within {worst:.3f} nats"


def preclip_prose(adp: dict | None, stab: dict | None) -> dict[str, str]:
    """The adaptive-preclip sweep: the largest |Δ| of a pre-clip rule against no pre-clip or
    the cosine schedule, and the range of the rows' std over seeds."""
    none = per_seed(stab, optimizer="spectra-signum")
    runs = {label: per_seed(adp, **point) for label, point in PRECLIP_CASES}
    cosine = runs["cosine, c: 10 → 0.01"]
    ds = [paired(none, v) for v in runs.values()]
    ds += [paired(cosine, v) for label, v in runs.items() if not label.startswith("cosine")]
    if None in ds:
        raise Missing("adaptive-preclip has not run on every seed")
    sds = [statistics.stdev(v.values()) for v in [none, *runs.values()]]
    return {"preclip-within": f"within {max(abs(d['mean']) for d in ds):.3f} nats",
            "preclip-spread": span(min(sds), max(sds), lambda x: f"{x:.2f}")}  # fmt: skip


MOE_LABELS = {"adamw": "AdamW", "matrices": "per expert", "tensors": "whole stack"}


def moe_prose(lr_sweep: dict | None, seeds: dict | None) -> dict[str, str]:
    """The MoE comparison in words: each method's lr picked at seed 0 in the lr check, the
    per-expert gap to the whole stack and both gaps to AdamW (paired, three seeds), and the
    two clip layouts at the same lr, 2e-3, in the lr check."""
    if lr_sweep is None or seeds is None:
        raise Missing("results/moe is missing")
    picked, at = [], {}
    lrs = sorted({r["point"]["lr"] for r in lr_sweep["runs"]})
    for _, point in MOE_METHODS:
        by_lr = {lr: per_seed(lr_sweep, **point, lr=lr) for lr in lrs}
        best = best_lr(by_lr)
        layout = point.get("clip_layout", "adamw")
        picked.append(f"{MOE_LABELS[layout]} {lr_text(best)}")
        at[layout] = by_lr.get(2e-3, {}).get(0)
    per_expert, stack = (per_seed(seeds, **MOE_METHODS[i][1]) for i in (1, 2))
    adamw = per_seed(seeds, **MOE_METHODS[0][1])
    gap = paired(per_expert, stack)
    vs = [paired(x, adamw) for x in (per_expert, stack)]
    if gap is None or None in vs or None in at.values():
        raise Missing("results/moe has not run every method")
    return {
        "moe-lrs": f"lr {lr_text(lrs[0])} … {lr_text(lrs[-1])}: {', '.join(picked)}",
        "moe-gap": f"{gap['mean']:.2f} nats",
        "moe-vs-adamw": f"per expert by {vs[0]['mean']:.2f} nats, the whole stack by "
        f"{vs[1]['mean']:.2f}",
        "moe-same-lr": f"{at['matrices']:.3f} against {at['tensors']:.3f}",
    }


def ssc_prose(data: Path) -> str:
    """The paper's Algorithm 1 in float32 and our default against 5 float32 Newton–Schulz
    steps, by time, over the sizes of the SSC-vs-orth benchmark."""
    path = data / "bench_ssc_vs_orth_cpu.json"
    if not path.is_file():
        raise Missing("docs/data/bench_ssc_vs_orth_cpu.json is missing")
    cells = json.loads(path.read_text())["cells"]
    t = {(c["shape"], c["method"]): c["time_ms"] for c in cells}
    shapes = sorted({s for s, _ in t}, key=lambda s: int(s.split("x")[0]))
    paper = [t[s, "paper_fp32"] / t[s, "orth_muon_fp32"] for s in shapes]
    ours = [t[s, "auto"] / t[s, "orth_muon_fp32"] for s in shapes]
    first, last = shapes[0].split("x")[0], shapes[-1].split("x")[0]
    f2 = lambda x: f"{x:.2f}"  # noqa: E731
    return (f"takes {span(min(paper), max(paper), f2)}× the time of 5 Newton–Schulz steps from "
            f"{first}² to {last}², as its matrix-product flops (`64n³` against `30n³`) predict; "
            f"our default takes {span(min(ours), max(ours), f2)}×")  # fmt: skip


def longer_prose(longer: dict | None, longer_lr: dict | None, seeds: dict | None) -> dict:
    """The figures of the paragraph under the longer-budget tables: what three times the steps
    bought each method, the leaders at 600 steps, the lr re-check of longer-lr.yaml."""
    runs = longer_runs(longer, seeds)
    if any(len(v[1]) < 3 for v in runs.values()):
        raise Missing("longer.yaml has not run every method on three seeds")
    m200 = {n: statistics.fmean(v[0].values()) for n, v in runs.items()}
    m600 = {n: statistics.fmean(v[1].values()) for n, v in runs.items()}
    gain = [m200[n] - m600[n] for n in runs]
    f3 = lambda x: f"{x:.3f}"  # noqa: E731
    vs_dmuon = paired(runs["spectra-adamw"][1], runs["dmuon"][1])
    dmuon_200 = paired(runs["spectra-adamw"][0], runs["dmuon"][0])
    tuned = runs["spectra-adamw"][1]
    off = [paired(tuned, per_seed(longer_lr, optimizer="spectra-adamw", lr=lr)) for lr in
           (LONGER_LRS["spectra-adamw"][0], LONGER_LRS["spectra-adamw"][2])]  # fmt: skip
    half = per_seed(longer_lr, optimizer="dmuon", lr=LONGER_LRS["dmuon"][0])
    best = paired(half, tuned)
    if None in (vs_dmuon, dmuon_200, best, *off):
        raise Missing("longer-lr.yaml has not run every lr on three seeds")
    return {
        "longer-gains": span(min(gain), max(gain), lambda x: f"{x:.1f}", " nats"),
        "longer-leaders": f"SOAP ({f3(m600['soap'])}) and Spectra-AdamW "
        f"({f3(m600['spectra-adamw'])})",
        "longer-vs-dmuon": f"by {f3(vs_dmuon['mean'])}",
        "longer-adamw": f"{m600['adamw'] - m600['spectra-adamw']:.2f}",
        "longer-lr-holds": span(min(d["mean"] for d in off), max(d["mean"] for d in off),
                                lambda x: f"{x:.2f}") + " higher",
        "longer-dmuon-half": f3(statistics.fmean(half.values())),
        "longer-best-gap": f"{best['mean']:.3f} ± {best['std']:.3f}",
        "longer-gap-200": f"{abs(dmuon_200['mean']):.3f}, "
        + ("significant" if dmuon_200["sig"] else "not significant"),
    }  # fmt: skip


def study_size_prose(results: Path = RESULTS) -> str:
    """How many runs the study's sweeps hold, and in how many sweeps."""
    reports = [load(p.parent.name, results) for p in sorted(results.glob("*/results.json"))]
    runs = sum(1 for r in reports for x in (r or {}).get("runs", []) if x["status"] == "done")
    return f"the study holds {runs} finished runs in {len(reports)} sweeps"


def overhead_prose(seeds: dict | None) -> str:
    """The range of the overhead column of the overhead table."""
    over = []
    for base, spectra in PAIRS:
        a, b = step_times(seeds, base, spectra)
        over.append(b / a - 1)
    return span(min(over), max(over), lambda x: f"{x:+.0%}").replace("–", " to ")


def ops_cells(data: Path, name: str) -> list[dict]:
    path = data / name
    if not path.is_file():
        raise Missing(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} is missing")
    return json.loads(path.read_text())["cells"]


def paper_error_prose(data: Path) -> str:
    """Relative Frobenius error of the paper's bf16 Algorithm 1 on the recorded training
    directions (float32 input), as a percentage range."""
    errs = [c["rel_err"] for c in ops_cells(data, "bench_ops_cpu_recorded.json")
            if c["method"] == "paper_bf16" and c["dtype"] == "fp32"]  # fmt: skip
    if not errs:
        raise Missing("no paper_bf16 cells in bench_ops_cpu_recorded.json")
    return span(100 * min(errs), 100 * max(errs), lambda x: f"{x:.2g}", "%")


def paper_spike_prose(data: Path) -> str:
    """The same on the spiked synthetic inputs at the 124M shapes (σ_max/c = 10³)."""
    errs = [c["rel_err"] for c in ops_cells(data, "bench_ops_cpu_synthetic.json")
            if c["method"] == "paper_bf16" and c["dtype"] == "fp32"
            and c["input"] == "adam_spike"]  # fmt: skip
    if not errs:
        raise Missing("no paper_bf16 adam_spike cells in bench_ops_cpu_synthetic.json")
    return span(100 * min(errs), 100 * max(errs), lambda x: f"{x:.0f}", "%")


def catch_up(fx: dict) -> dict:
    """Where AdamW would reach Spectra-AdamW's 200-step mean loss, extrapolated linearly from
    its longest run at the slowest and at the fastest gain per step between consecutive runs.

    ``gains``: mean loss bought per 10 extra steps between consecutive step counts; ``gap``:
    the longest run's mean loss minus Spectra-AdamW's; ``steps``: (fewest, most) total steps,
    i.e. the longest run's steps plus gap / gain, fastest gain first (None where a gain is not
    positive, since no linear extrapolation reaches the target then).
    """
    spectra = mean_of(fx["spectra"], "spectra-adamw")
    means = {n: statistics.fmean(v.values()) for n, v in fx["runs"].items() if v}
    if len(means) < 2:
        raise Missing("fewer than two AdamW step counts run")
    counts = sorted(means)
    gains = [10 * (means[a] - means[b]) / (b - a) for a, b in itertools.pairwise(counts)]
    last = counts[-1]
    gap = means[last] - spectra
    fast, slow = max(gains), min(gains)
    steps = tuple(last + 10 * gap / g if g > 0 else None for g in (fast, slow))
    return {"gains": gains, "last": last, "gap": gap, "steps": steps}


def wrap(text: str) -> str:
    """A generated paragraph wrapped like the page's prose."""
    return textwrap.fill(text, 95, break_on_hyphens=False, break_long_words=False)


def fixed_prose(fx: dict, seeds: dict | None) -> str:
    """The paragraph under the fixed-time table."""
    return wrap(fixed_text(fx, seeds))


def fixed_text(fx: dict, seeds: dict | None) -> str:
    adamw_s, spectra_s = step_times(seeds, "adamw", "spectra-adamw")
    ratio = spectra_s / adamw_s
    cu = catch_up(fx)
    last, gap = cu["last"], cu["gap"]
    k = last / 200
    verdict = no_lower(fx["diffs"][last])
    opening = (
        "The paper's fixed-time claim holds here"
        + (" with room to spare" if verdict == "held" and fx["diffs"][last]["sig"] else "")
        if verdict == "held"
        else "The paper's fixed-time claim is not confirmed here"
    )
    wall = ", about the same wall time," if abs(k - ratio) <= 0.05 else ""
    text = (
        f"{opening}: Spectra-AdamW's median step costs {ratio:.2f}× AdamW's on this machine "
        f"(timing below), and AdamW given {k:g}× the steps{wall} ends "
        f"{abs(gap):.2f} nats {'higher' if gap > 0 else 'lower'} (means over seeds)."
    )
    if gap <= 0:
        return text
    gains = span(min(cu["gains"]), max(cu["gains"]), lambda x: f"{x:.3f}")
    counts = sorted(fx["runs"])
    text += (
        f" Between consecutive runs ({', '.join(f'{a}→{b}' for a, b in itertools.pairwise(counts))}"
        f" steps) each extra 10 steps bought AdamW {gains} nats of mean loss."
    )
    fewest, most = cu["steps"]
    if fewest is None or most is None:
        return text + " Not every gain is positive, so no linear extrapolation is given."
    return text + (
        f" Going on linearly from its {last} steps, at the fastest of these gains and at the "
        f"slowest, it would reach Spectra-AdamW's loss after about "
        f"{span(fewest, most, lambda x: f'{x:.0f}')} steps in all, "
        f"{span(fewest / 200, most / 200, lambda x: f'{x:.2f}')}× Spectra-AdamW's 200 (an "
        "extrapolation, not run)."
    )


# ----- the spectra bench step tables ------------------------------------------------------

#: Block name -> the ``spectra bench step --json`` file it is rendered from (in docs/data).
STEP_FILES = {"step": "bench_step_cpu.json", "step-baselines": "bench_step_cpu_baselines.json"}


def step_report(data: Path, block: str) -> dict:
    path = data / STEP_FILES[block]
    if not path.is_file():
        raise Missing(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} is missing")
    return json.loads(path.read_text())


def step_table(report: dict) -> str:
    """A ``spectra bench step --json`` report as the command prints it, in a code block."""
    from spectra_lab.bench.step import format_report

    return "```\n" + format_report(report) + "```"


def step_rows(report: dict) -> tuple[dict[str, dict], list[tuple[dict, dict]], list[tuple]]:
    """(rows by label, [(Spectra-X row, X row)], [(X + pre-clip row, X row)])."""
    rows = {r["optimizer"]: r for r in report["rows"]}
    clipped, pre = [], []
    for r in report["rows"]:
        label = r["optimizer"]
        name = label.split(" + pre-clip ")[0]
        base = rows.get(r["base"])
        if base is None or base is r:
            continue
        if " + pre-clip " not in label and name != r["base"]:
            clipped.append((r, base))
        elif " + pre-clip " in label and name == r["base"]:
            pre.append((r, base))
    return rows, clipped, pre


def step_clip_prose(report: dict) -> str:
    """What the clip and pre-clipping add to the optimizer step: Spectra-X's optimizer step
    minus X's, and X + pre-clip's minus X's."""
    _, clipped, pre = step_rows(report)
    if not clipped:
        raise Missing("no Spectra-X row with its X in the step table")
    clip = [r["optimizer_ms"] - b["optimizer_ms"] for r, b in clipped]
    share = [(r["optimizer_ms"] - b["optimizer_ms"]) / r["total_ms"] for r, b in clipped]
    text = (
        f"{span(min(clip), max(clip), lambda x: f'{x:.0f}')} ms a step here (SPECTRA's optimizer "
        f"step minus the base's; {span(100 * min(share), 100 * max(share), lambda x: f'{x:.0f}')}"
        "% of the SPECTRA step)"
    )
    if pre:
        cost = [r["optimizer_ms"] - b["optimizer_ms"] for r, b in pre]
        text += (
            f", and pre-clipping {span(min(cost), max(cost), lambda x: f'{x:.0f}')} ms "
            "(X + pre-clip's optimizer step minus X's)"
        )
    return text


def step_fb_prose(reports: list[dict]) -> str:
    """The range of forward and backward times (total minus optimizer step) over the rows of
    the step tables, and AdamW's total in each."""
    fb = [r["total_ms"] - r["optimizer_ms"] for rep in reports for r in rep["rows"]]
    adamw = [r["total_ms"] for rep in reports for r in rep["rows"] if r["optimizer"] == "adamw"]
    text = f"{span(min(fb), max(fb), lambda x: f'{x:.0f}')} ms from one row to the next"
    if len(adamw) == 2:
        text += (f" (AdamW's total is {adamw[0]:.0f} ms in the first run and {adamw[1]:.0f} ms "
                 "in the second)")  # fmt: skip
    return text


def step_dmuon_prose(report: dict) -> str:
    rows, _, _ = step_rows(report)
    if "dmuon" not in rows:
        raise Missing("no dmuon row in the baselines' step table")
    r = rows["dmuon"]
    return f"{r['optimizer_ms']:.0f} ms an optimizer step ({r['total_ms']:.0f} ms the whole step)"


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


def plot_signum(stab: dict | None, path: Path, results: Path = RESULTS) -> bool:
    """Training loss of the Signum-stability runs, a line per seed (needs the run directories)."""
    runs_dir = results / "signum-stability" / "runs"
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
    from spectra_lab.files import save_figure

    save_figure(fig, path, dpi=120)


# ----- per-expert clipping on a mixture of experts (results/moe) ---------------------------

MOE = ROOT / "results" / "moe"
MOE_METHODS = [
    ("adamw", {"optimizer": "adamw"}),
    ("spectra-adamw, per expert", {"optimizer": "spectra-adamw", "clip_layout": "matrices"}),
    ("spectra-adamw, whole stack", {"optimizer": "spectra-adamw", "clip_layout": "tensors"}),
]


def moe_table(seeds: dict | None) -> str:
    """Each method at its tuned lr (the lr of its runs in ``seeds``), and whether clipping each
    expert apart beats it: Δ = its loss − the per-expert loss, paired by seed."""
    if seeds is None:
        raise Missing("results/moe/seeds/results.json is missing")
    rows = ["| method | tuned lr | final val loss (mean ± std over seeds) "
            "| Δ = loss − per expert (paired) | per expert beats it | median step (s) |",
            "|---|---:|---|---|---|---:|"]  # fmt: skip
    per_expert = per_seed(seeds, **MOE_METHODS[1][1])
    for name, point in MOE_METHODS:
        vals = per_seed(seeds, **point)
        lrs = sorted({r["point"]["lr"] for r in seeds["runs"]
                      if all(r["point"].get(k) == v for k, v in point.items())})  # fmt: skip
        st = step_time(seeds, **point)
        if point == MOE_METHODS[1][1]:
            diff, verdict = "(reference)", ""
        else:
            p = paired(per_expert, vals)
            diff, verdict = fmt_diff(p), lower(p)
        rows.append(f"| {name} | {', '.join(f'{lr:g}' for lr in lrs) or '–'} | {mean_std(vals)} "
                    f"| {diff} | {verdict} | {f'{st:.3f}' if st else '–'} |")  # fmt: skip
    return "\n".join(rows)


# ----- the page ---------------------------------------------------------------------------

PREFIX = "study"


def extract(text: str, name: str) -> str | None:
    """The body of the (first) block ``study:name`` of ``text``; None where there is none."""
    return pages.extract(text, f"{PREFIX}:{name}")


def fill(text: str, name: str, body: str) -> str:
    """``text`` with every block ``study:name`` holding ``body`` (see
    :func:`spectra_lab.pages.fill`)."""
    return pages.fill(text, f"{PREFIX}:{name}", body)


def names(text: str) -> list[str]:
    """The study's blocks of ``text``."""
    return [k.split(":", 1)[1] for k in pages.keys(text) if k.startswith(f"{PREFIX}:")]


def compute(results: Path = RESULTS, data: Path = DATA) -> tuple[dict, dict, dict]:
    """``(bodies, missing, parts)``: the body of every block that can be computed, the reason
    for each one that cannot (left as it is), and the parts the figures are drawn from; the
    block ``sources`` lists the stored files they were computed from, with their machines."""
    (bodies, missing, parts), files = pages.traced(ROOT, lambda: blocks_of(results, data))
    if (results, data) == (RESULTS, DATA):
        bodies["sources"] = sources_table(files)
    else:
        missing["sources"] = "the blocks were computed from files outside the repository"
    return bodies, missing, parts


def sources_table(files: list[str]) -> str:
    """The stored files the study's blocks read, and the machine each names."""
    from spectra_lab.bench.machines import machine_at

    rows = ["| stored file | measured on |", "|---|---|"]
    rows += [f"| `{f}` | {machine_at(ROOT, f)} |" for f in sorted(files)]
    return "\n".join(rows)


def blocks_of(results: Path, data: Path) -> tuple[dict, dict, dict]:
    seeds, stab = load("seeds", results), load("signum-stability", results)
    cab = load("c-ablation", results)
    c_md, c = c_table(cab, seeds)
    ns_md, ns = ns_table(load("ns-ablation", results), seeds)
    fx_md, fx = fixed_table(load("fixed-time", results), seeds)

    def step_reports() -> list[dict]:
        return [step_report(data, block) for block in STEP_FILES]

    makers: dict[str, Callable[[], str]] = {
        "summary": lambda: summary_table(seeds, stab, c, ns, fx),
        "methods": lambda: methods_table(seeds, tuned_lrs(results)),
        "readme-methods": lambda: readme_methods_table(seeds, tuned_lrs(results)),
        "pairs": lambda: pairs_table(seeds),
        "signum": lambda: signum_table(stab),
        "c": lambda: c_md,
        "hard-vs-soft": lambda: hard_table(load("hard-vs-soft", results), seeds, cab),
        "adaptive-preclip": lambda: preclip_table(load("adaptive-preclip", results), stab),
        "moe": lambda: moe_table(load("seeds", MOE)),
        "longer": lambda: longer_table(load("longer", results), seeds),
        "longer-lr": lambda: longer_lr_table(load("longer", results), load("longer-lr", results)),
        "recheck": lambda: recheck_table(
            load("recheck-lr", results),
            {s: load(s, results) for s in ("longer", "longer-lr", "recheck-compare")},
        ),
        "soft-muon": lambda: soft_muon_table(
            load("soft-muon-lr", results), load("soft-muon", results), dmuon_best(results)
        ),
        "soft-muon-verdict": lambda: soft_muon_prose(
            load("soft-muon-lr", results), load("soft-muon", results), dmuon_best(results)
        ),
        "dmuon-preclip": lambda: dmuon_preclip_table(
            load("dmuon-preclip", results), dmuon_best(results)
        ),
        "dmuon-bf16": lambda: dmuon_bf16_table(load("dmuon-bf16", results), dmuon_best(results)),
        "dmuon-bf16-verdict": lambda: dmuon_bf16_prose(
            load("dmuon-bf16", results), dmuon_best(results)
        ),
        "muon": lambda: muon_table(results),
        "muon-answer": lambda: muon_answer_prose(results),
        "ns": lambda: ns_md,
        "fixed": lambda: fx_md,
        "overhead": lambda: overhead_table(seeds),
        "gaps": lambda: gaps_prose(seeds),
        "gaps-range": lambda: gaps_range_prose(seeds),
        "variants-spread": lambda: variants_spread_prose(seeds),
        "baselines-200": lambda: baselines_prose(seeds),
        "dmuon-closest": lambda: dmuon_closest_prose(seeds),
        "repeat": lambda: repeat_prose(seeds, load("lr-adam", results)),
        **lazy(lambda: signum_prose(stab), ("signum-gap", "signum-best", "signum-beat")),
        "recorded-sigma": lambda: recorded_sigma_prose(data, 10.0),
        "recorded-sigma-c50": lambda: recorded_sigma_prose(data, 50.0),
        "hard-soft-within": lambda: hard_soft_prose(load("hard-vs-soft", results), seeds, cab),
        **lazy(
            lambda: preclip_prose(load("adaptive-preclip", results), stab),
            ("preclip-within", "preclip-spread"),
        ),
        **lazy(
            lambda: moe_prose(load("lr", MOE), load("seeds", MOE)),
            ("moe-lrs", "moe-gap", "moe-vs-adamw", "moe-same-lr"),
        ),
        "ssc-vs-orth": lambda: ssc_prose(data),
        **lazy(
            lambda: longer_prose(load("longer", results), load("longer-lr", results), seeds),
            (
                "longer-gains",
                "longer-leaders",
                "longer-vs-dmuon",
                "longer-adamw",
                "longer-lr-holds",
                "longer-dmuon-half",
                "longer-best-gap",
                "longer-gap-200",
            ),
        ),
        "study-size": lambda: study_size_prose(results),
        "dmuon-ratio": lambda: dmuon_ratio_prose(seeds),
        "c50": lambda: c50_prose(c, seeds),
        "paper-bf16-error": lambda: paper_error_prose(data),
        "paper-bf16-spike": lambda: paper_spike_prose(data),
        "fixed-prose": lambda: fixed_prose(fx, seeds),
        "overhead-range": lambda: overhead_prose(seeds),
        "dmuon-step": lambda: dmuon_step_prose(seeds),
        "soap-step": lambda: soap_step_prose(seeds),
        "step": lambda: step_table(step_report(data, "step")),
        "step-baselines": lambda: step_table(step_report(data, "step-baselines")),
        "step-fb": lambda: step_fb_prose(step_reports()),
        "step-clip": lambda: step_clip_prose(step_report(data, "step")),
        "step-dmuon": lambda: step_dmuon_prose(step_report(data, "step-baselines")),
    }
    bodies, missing = {}, {}
    for name, make in makers.items():
        try:
            bodies[name] = make()
        except Missing as exc:
            missing[name] = str(exc)
    return bodies, missing, {"seeds": seeds, "stab": stab, "c": c, "ns": ns, "fx": fx}


def lazy(make: Callable[[], dict[str, str]], keys: tuple[str, ...]) -> dict:
    """One maker per key of the phrases ``make`` returns together (computed once)."""
    cache: dict[str, str] = {}

    def one(key: str) -> Callable[[], str]:
        def get() -> str:
            if not cache:
                cache.update(make())
            return cache[key]

        return get

    return {key: one(key) for key in keys}


def render(text: str, bodies: dict[str, str]) -> str:
    """``text`` with each of its study blocks rendered from ``bodies``."""
    for name in names(text):
        if name in bodies:
            text = fill(text, name, bodies[name])
    return text


def check(texts: dict[str, str], bodies: dict[str, str], missing: dict[str, str]) -> int:
    """Print each block of the pages ``texts`` (name → text) that differs from ``bodies``
    (with a short diff), each marker nobody computes and each computed block on no page; 1 if
    there is any, else 0. ``missing`` blocks are not checked."""
    bad = []
    for page, text in texts.items():
        for name in names(text):
            if name not in bodies and name not in missing:
                print(f"{page}: {name}: unknown block (report.py computes no such block)")
                bad.append(name)
        found = pages.differences(text, {f"{PREFIX}:{n}": b for n, b in bodies.items()})
        for line in found:
            print(f"{page}: {line}" if not line.startswith(" ") else line)
        bad += [line.split(":")[1] for line in found if not line.startswith(" ")]
    shown = {n for text in texts.values() for n in names(text)}
    for name in bodies:
        if name not in shown:
            print(f"{name}: no block <!-- study:{name} --> … <!-- /study:{name} --> on any page")
            bad.append(name)
    checked = len(bodies) - len({n for n in bad if n in bodies})
    print(f"{checked} of {len(bodies) + len(missing)} blocks agree with the data"
          + (f", {len(missing)} not checked" if missing else ""))  # fmt: skip
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write the reproduction study's tables, verdicts and quoted numbers into "
        "docs/results.md, and its figures."
    )
    parser.add_argument("--check", action="store_true",
                        help="write nothing: exit 1, with a diff, where a block of the page "
                        "differs from what the data give")  # fmt: skip
    parser.add_argument("--doc", type=Path, nargs="+", default=[DOC, README],
                        help="the pages (docs/results.md and README.md)")  # fmt: skip
    parser.add_argument("--no-figures", action="store_true", help="write the page only")
    args = parser.parse_args(argv)

    bodies, missing, parts = compute()
    texts = {doc: doc.read_text() for doc in args.doc}
    for name, why in missing.items():
        print(f"{name}: {'not checked' if args.check else 'left as it is'} ({why})")
    if args.check:
        return check({str(doc): text for doc, text in texts.items()}, bodies, missing)

    from spectra_lab.files import atomic_write

    for doc, text in texts.items():
        try:
            new = render(text, bodies)
        except ValueError as exc:
            raise SystemExit(f"{doc}: {exc}") from None
        if new != text:
            atomic_write(doc, new)
    if not args.no_figures:
        seeds, stab = parts["seeds"], parts["stab"]
        plot_methods(seeds, FIGURES / "study_methods.png")
        plot_ablations(parts["c"], parts["ns"], parts["fx"], FIGURES / "study_ablations.png")
        if not plot_signum(stab, FIGURES / "study_signum.png"):
            print("study_signum.png not drawn: results/study/signum-stability/runs is missing")
    for name, body in bodies.items():
        print(f"## {name}\n{body}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
