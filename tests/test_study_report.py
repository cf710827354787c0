"""experiments/study/report.py: the signs, t statistics and verdicts on hand-made inputs with a
known answer, the generated prose numbers, and ``--check`` against docs/results.md."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "study" / "report.py"

#: Per-seed losses: B is A plus 0.1 plus small noise, so Δ = B − A is about +0.1.
A = {0: 4.50, 1: 4.60, 2: 4.70}
NOISE = {0: 0.010, 1: -0.020, 2: 0.005}
B = {s: A[s] + 0.1 + NOISE[s] for s in A}
#: Hand computation for d = B − A = (0.110, 0.080, 0.105): mean 0.295/3 = 0.098333, sample std
#: sqrt(((0.011667)² + (0.018333)² + (0.006667)²) / 2) = 0.016073, t = mean/(std/√3) = 10.597.
MEAN, STD, T = 0.295 / 3, 0.0160728, 10.597
#: As the tables print Δ = B − A and Δ = A − B.
UP = "+0.098 ± 0.016, t = +10.6 (significant)"
DOWN = "-0.098 ± 0.016, t = -10.6 (significant)"


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("study_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sweep(*groups: tuple[dict, dict[int, float], float | None]) -> dict:
    """A ``results.json`` of a sweep: (point, loss by seed, step seconds) per group."""
    return {
        "runs": [
            {"point": point, "seed": seed, "val_loss": loss, "step_s": step_s, "status": "done"}
            for point, losses, step_s in groups
            for seed, loss in losses.items()
        ]
    }


def row_of(table: str, start: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(start))


def test_paired_is_b_minus_a_with_the_hand_computed_t(report):
    p = report.paired(A, B)
    assert p["n"] == 3
    assert p["mean"] == pytest.approx(MEAN)
    assert p["std"] == pytest.approx(STD, rel=1e-4)
    assert p["t"] == pytest.approx(T, rel=1e-3)
    assert p["sig"]  # |t| > 4.303, the 95% quantile for two degrees of freedom
    q = report.paired(B, A)
    assert q["mean"] == pytest.approx(-MEAN) and q["t"] == pytest.approx(-T, rel=1e-3)
    assert report.fmt_diff(p) == UP and report.fmt_diff(q) == DOWN
    # only the seeds both have count; fewer than two give no comparison
    assert report.paired(A, {0: 5.0, 9: 1.0}) is None
    # no spread: t is infinite with the mean's sign, and significant
    flat = report.paired({0: 1.0, 1: 2.0}, {0: 1.5, 1: 2.5})
    assert flat["std"] == 0 and flat["t"] == math.inf and flat["sig"]


def test_verdicts_follow_the_sign_of_b_minus_a_and_the_threshold(report):
    up, down = report.paired(A, B), report.paired(B, A)
    # lower: the claim that b − a > 0, i.e. that a is lower
    assert report.lower(up) == "held" and report.lower(down) == "not held"
    # no_lower: the claim that b is no lower than a
    assert report.no_lower(up) == "held" and report.no_lower(down) == "not held"
    assert report.same(up) == "not held" and report.same(down) == "not held"
    # d = +0.10, −0.10, +0.05: mean +0.017, t = +0.28, not significant
    noisy = report.paired(A, {0: 4.60, 1: 4.50, 2: 4.75})
    assert noisy["t"] == pytest.approx(0.277, abs=1e-3) and not noisy["sig"]
    assert report.lower(noisy) == "inconclusive"
    assert report.no_lower(noisy) == "held"  # b higher on average
    assert report.no_lower(report.paired({0: 4.60, 1: 4.50, 2: 4.75}, A)) == "inconclusive"
    assert report.same(noisy) == "held (no significant difference)"
    assert report.ours_verdict(noisy) == "no significant difference"
    for verdict in (report.lower, report.no_lower, report.same, report.ours_verdict):
        assert verdict(None) == "inconclusive (not run)"


def test_pairs_and_fixed_time_rows_are_labelled_as_computed(report):
    """Pairs: Δ = base − Spectra, positive when Spectra is lower; fixed time: Δ = AdamW −
    Spectra-AdamW, negative when AdamW with more steps is lower."""
    seeds = sweep(({"optimizer": "adamw"}, B, 1.0), ({"optimizer": "spectra-adamw"}, A, 1.2))
    pairs = report.pairs_table(seeds)
    assert "Δ = base − Spectra" in pairs
    assert row_of(pairs, "| spectra-adamw beats adamw |").endswith(f"| {UP} | held |")
    adamw_240 = {s: v - 0.1 - NOISE[s] for s, v in A.items()}  # lower than Spectra-AdamW
    md, fx = report.fixed_table(
        sweep(({"optimizer": "adamw", "steps": 240}, adamw_240, 1.0)), seeds
    )
    assert "Δ = AdamW − Spectra-AdamW@200" in md
    assert row_of(md, "| AdamW ×1 |").endswith(f"| {UP} | held |")
    assert row_of(md, "| AdamW ×1.2 |").endswith(f"| {DOWN} | not held |")
    assert fx["diffs"][240]["mean"] == pytest.approx(-MEAN)


def test_c_deltas_are_loss_at_c_minus_loss_at_c10(report):
    seeds = sweep(({"optimizer": "spectra-adamw"}, A, None))
    md, c = report.c_table(sweep(({"clip_c": 1.0}, B, None)), seeds)
    assert "Δ = loss(c) − loss(c = 10)" in md
    assert row_of(md, "| 1 |").endswith(f"| {UP} |")
    assert report.lower(c["diffs"][1.0]) == "held"  # "c = 1 degrades"


def test_ns_deltas_are_it_minus_the_papers_and_ours_lower_reads_so(report):
    cases = dict(report.NS_CASES)
    ours = {s: v - 0.1 - NOISE[s] for s, v in A.items()}  # ours is 0.1 lower than paper N_s = 10
    nsab = sweep(
        ({"optimizer_kwargs": cases["paper, N_s = 5, bf16"]}, B, None),  # 0.1 higher
        ({"optimizer_kwargs": cases["paper, N_s = 10, bf16"]}, A, None),
    )
    seeds = sweep(({"optimizer": "spectra-adamw"}, ours, None))
    md, ns = report.ns_table(nsab, seeds)
    assert "Δ = it − paper N_s = 10 bf16" in md
    assert f"| {UP} |" in row_of(md, "| paper, N_s = 5, bf16 |")
    assert f"| {DOWN} |" in row_of(md, "| ours, auto (accurate) |")
    assert ns["diffs"]["ours, auto (accurate)"]["mean"] == pytest.approx(-MEAN)

    _, c = report.c_table(None, seeds)
    _, fx = report.fixed_table(None, seeds)
    summary = report.summary_table(seeds, None, c, ns, fx)
    assert row_of(summary, "| paper, N_s = 5, bf16 on par").endswith(f"| {UP} | not held |")
    ours_row = row_of(summary, "| (our question)")
    assert "(Δ = ours − paper)" in ours_row
    assert ours_row.endswith(f"| {DOWN} | ours lower |")
    # and the other way round
    higher = report.paired(A, {s: v + 0.1 + NOISE[s] for s, v in A.items()})
    assert report.ours_verdict(higher) == "ours higher"


def test_prose_numbers_from_hand_made_runs(report):
    """c = 50's share of the way to AdamW, and the fixed-time extrapolation."""
    spectra = {0: 4.58, 1: 4.58}
    seeds = sweep(
        ({"optimizer": "spectra-adamw"}, spectra, 1.2),
        ({"optimizer": "adamw"}, {0: 5.00, 1: 5.00}, 1.0),
        ({"optimizer": "dmuon"}, {0: 4.5, 1: 4.5}, 1.17),
    )
    _, c = report.c_table(sweep(({"clip_c": 50.0}, {0: 4.90, 1: 4.90}, None)), seeds)
    # (4.90 − 4.58) / (5.00 − 4.58) = 0.32 / 0.42
    assert report.c50_prose(c, seeds).startswith("76% of the way there (4.900, from 4.580")
    assert report.dmuon_ratio_prose(seeds) == "17% more than AdamW's"
    # AdamW at 200/210/220/240 steps: gains per 10 steps 0.02, 0.04, 0.02; at 240 steps it is
    # 0.32 above Spectra-AdamW: 240 + 10 · 0.32 / 0.04 = 320 and 240 + 10 · 0.32 / 0.02 = 400.
    fixed = sweep(
        ({"optimizer": "adamw", "steps": 210}, {0: 4.98, 1: 4.98}, 1.0),
        ({"optimizer": "adamw", "steps": 220}, {0: 4.94, 1: 4.94}, 1.0),
        ({"optimizer": "adamw", "steps": 240}, {0: 4.90, 1: 4.90}, 1.0),
    )
    _, fx = report.fixed_table(fixed, seeds)
    cu = report.catch_up(fx)
    assert cu["gains"] == pytest.approx([0.02, 0.04, 0.02])
    assert cu["gap"] == pytest.approx(0.32) and cu["steps"] == pytest.approx((320, 400))
    text = " ".join(report.fixed_prose(fx, seeds).split())
    assert "costs 1.20× AdamW's" in text and "1.2× the steps, about the same wall time" in text
    assert "0.020–0.040 nats" in text and "320–400 steps in all, 1.60–2.00×" in text


def step_report(rows: list[tuple[str, float, float]]) -> dict:
    """A ``spectra bench step --json`` report of (label, total ms, optimizer-step ms) rows."""
    from spectra_lab.bench.step import base_of

    out = []
    for label, total, opt in rows:
        out.append({"optimizer": label, "base": base_of(label.split(" + pre-clip ")[0]),
                    "total_ms": total, "optimizer_ms": opt, "share": opt / total,
                    "overhead": 0.0, "parameters": 3_000_000})  # fmt: skip
    return {
        "command": "spectra bench step",
        "args": {"preset": "cpu-small", "batch_size": 8, "device": "cpu", "steps": 8},
        "torch": "x",
        "threads": 2,
        "parameters": 3_000_000,
        "rows": out,
        "no_pre_clip": [],
    }


def test_step_blocks_come_from_bench_step_json_and_are_not_checked_without_it(
    report, tmp_path, capsys
):
    from spectra_lab.bench.step import format_report

    main = step_report([("adamw", 500.0, 20.0), ("adamw + pre-clip 0.1", 650.0, 170.0),
                        ("spectra-adamw", 640.0, 140.0), ("signum", 400.0, 10.0),
                        ("spectra-signum", 500.0, 110.0)])  # fmt: skip
    baselines = step_report([("adamw", 450.0, 15.0), ("dmuon", 3600.0, 3100.0)])
    (tmp_path / "bench_step_cpu.json").write_text(json.dumps(main))
    (tmp_path / "bench_step_cpu_baselines.json").write_text(json.dumps(baselines))
    bodies, missing, _ = report.compute(data=tmp_path)
    assert bodies["step"] == "```\n" + format_report(main) + "```"
    assert bodies["step-baselines"] == "```\n" + format_report(baselines) + "```"
    # clip: 140 − 20 and 110 − 10 ms (19% and 20% of the Spectra step); pre-clip: 170 − 20
    assert bodies["step-clip"] == (
        "100–120 ms a step here (SPECTRA's optimizer step minus the base's; 19–20% of the "
        "SPECTRA step), and pre-clipping 150 ms (X + pre-clip's optimizer step minus X's)"
    )
    assert bodies["step-fb"] == (
        "390–500 ms from one row to the next (AdamW's total is 500 ms in the first run and "
        "450 ms in the second)"
    )
    assert bodies["step-dmuon"] == "3100 ms an optimizer step (3600 ms the whole step)"
    assert "paper-bf16-error" in missing  # no ops data in tmp_path

    # without the data files those blocks are not checked, and the rest still agree
    bodies, missing, _ = report.compute(data=tmp_path / "none")
    assert {"step", "step-baselines", "step-fb", "step-clip", "step-dmuon"} <= set(missing)
    capsys.readouterr()
    texts = {str(doc): doc.read_text() for doc in (report.DOC, report.README)}
    assert report.check(texts, bodies, missing) == 0
    assert "not checked" in capsys.readouterr().out


def test_fill_and_extract_handle_line_and_inline_blocks(report):
    text = "a <!-- study:x -->1%<!-- /study:x --> b\n<!-- study:t -->\n| 1 |\n<!-- /study:t -->\n"
    assert report.extract(text, "x") == "1%" and report.extract(text, "t") == "| 1 |"
    out = report.fill(report.fill(text, "x", "2%"), "t", "| 2 |\n| 3 |\n")
    assert out == "a <!-- study:x -->2%<!-- /study:x --> b\n<!-- study:t -->\n| 2 |\n| 3 |\n" \
        "<!-- /study:t -->\n"  # fmt: skip
    with pytest.raises(ValueError, match="line breaks"):
        report.fill(text, "x", "1\n2")
    with pytest.raises(ValueError, match="no block"):
        report.fill(text, "y", "1")
    assert report.extract(text, "y") is None


def test_check_passes_on_the_page_as_written(report, capsys):
    assert report.main(["--check"]) == 0
    assert "blocks agree with the data" in capsys.readouterr().out


def test_check_fails_on_a_changed_number_and_writes_nothing(report, tmp_path, capsys):
    text = report.DOC.read_text()
    changed = text.replace("| adamw | 0.002 | 4.943 ± 0.059 (n=3) |",
                           "| adamw | 0.002 | 4.944 ± 0.059 (n=3) |")  # fmt: skip
    changed = changed.replace("<!-- study:c50 -->83%", "<!-- study:c50 -->60%")
    changed += "\n<!-- study:nobody -->\n<!-- /study:nobody -->\n"
    assert changed.count("4.944") == 1 and "study:c50 -->60%" in changed
    page = tmp_path / "results.md"
    page.write_text(changed)
    capsys.readouterr()
    assert report.main(["--check", "--doc", str(page)]) == 1
    out = capsys.readouterr().out
    assert "methods: differs from the data" in out and "+| adamw | 0.002 | 4.943" in out
    assert "c50: differs from the data" in out and "-60% of the way" in out
    assert "nobody: unknown block" in out
    assert "pairs: differs" not in out
    assert page.read_text() == changed
    # the plain run writes the blocks back (here without figures)
    page.write_text(changed.replace("<!-- study:nobody -->\n<!-- /study:nobody -->\n", ""))
    assert report.main(["--doc", str(page), "--no-figures"]) == 0
    assert page.read_text() == text + "\n"


def test_hard_vs_soft_deltas_are_hard_minus_soft_from_the_three_sweeps(report):
    hard = {"post": "hard_clip"}
    seeds = sweep(
        ({"optimizer": "spectra-adamw"}, A, None), ({"optimizer": "spectra-signum"}, A, None)
    )
    cab = sweep(({"clip_c": 5.0}, A, None), ({"clip_c": 20.0}, A, None))
    hvs = sweep(
        ({"optimizer": "spectra-adamw", "clip_c": 10.0, "optimizer_kwargs": hard}, B, None),
        ({"optimizer": "spectra-signum", "clip_c": 5.0, "optimizer_kwargs": hard}, A, None),
        ({"optimizer": "spectra-signum", "clip_c": 5.0}, B, None),
    )
    md = report.hard_table(hvs, seeds, cab)
    assert row_of(md, "| spectra-adamw | 10 |").endswith(f"| {UP} | soft lower |")
    assert row_of(md, "| spectra-signum | 5 |").endswith(f"| {DOWN} | hard lower |")
    # c = 5 for Spectra-AdamW: its soft runs are c-ablation's, the hard ones not run yet
    assert row_of(md, "| spectra-adamw | 5 |").endswith("| – (fewer than 2 paired seeds) | – |")


def test_moe_deltas_are_each_method_minus_per_expert_at_its_tuned_lr(report):
    per_expert = {"optimizer": "spectra-adamw", "clip_layout": "matrices", "lr": 0.004}
    whole = {"optimizer": "spectra-adamw", "clip_layout": "tensors", "lr": 0.002}
    # B: 4.610, 4.680, 4.805 (mean 4.6983, sample std 0.0988)
    seeds = sweep(({"optimizer": "adamw", "lr": 0.002}, B, 0.5), (per_expert, A, 0.7),
                  (whole, A, 0.6))  # fmt: skip
    table = report.moe_table(seeds)
    assert row_of(table, "| adamw |") == (
        f"| adamw | 0.002 | 4.698 ± 0.099 (n=3) | {UP} | held | 0.500 |"
    )
    assert "| spectra-adamw, per expert | 0.004 | 4.600 ± 0.100 (n=3) | (reference) |" in table
    assert row_of(table, "| spectra-adamw, whole stack |").endswith(
        "| +0.000 ± 0.000, t = +0.0 | inconclusive | 0.600 |"
    )
    with pytest.raises(report.Missing):
        report.moe_table(None)


def test_recheck_picks_each_lr_on_its_own_seeds_and_compares_on_the_others(report):
    pick = {3: 4.0, 4: 4.1, 5: 4.2}
    worse = {s: v + 0.05 for s, v in pick.items()}

    def picking(name, best, other):
        return [({"optimizer": name, "lr": best}, pick, None),
                ({"optimizer": name, "lr": other}, worse, None)]  # fmt: skip

    names = ("dmuon", "spectra-adamw", "spectra-signum", "soap")
    recheck = sweep(*[g for n in names for g in picking(n, 1e-3, 2e-3)])
    assert {n: lr for n, (lr, _) in report.picked_lrs(recheck).items()} == dict.fromkeys(
        names, 1e-3
    )
    # the comparison seeds at the picked lr, from whichever sweep ran them: B − A = +0.098
    longer = sweep(({"optimizer": "dmuon", "lr": 1e-3}, A, None),
                   ({"optimizer": "spectra-adamw", "lr": 1e-3}, B, None))  # fmt: skip
    compare = sweep(({"optimizer": "spectra-signum", "lr": 1e-3}, A, None),
                    ({"optimizer": "soap", "lr": 1e-3}, B, None))  # fmt: skip
    table = report.recheck_table(recheck, {"longer": longer, "recheck-compare": compare})
    assert row_of(table, "| dmuon |").endswith("| (reference) |  |")
    assert f"| {UP} | D-Muon lower |" in row_of(table, "| spectra-adamw |")
    # a pick at the edge of the lrs tried says so
    assert "| 0.001: 4.100, 0.002: 4.150 | 0.001 (the grid's edge) |" in row_of(table, "| soap |")
    # a picking seed or a comparison seed missing: the block waits
    with pytest.raises(report.Missing, match="soap has not run every lr"):
        report.picked_lrs(sweep(*[g for n in names[:3] for g in picking(n, 1e-3, 2e-3)]))
    # a method whose comparison seeds have not run, or still being picked: a row that says so
    table = report.recheck_table(recheck, {"longer": longer})
    assert "| 0.001 (the grid's edge) | seeds 0-2 not run yet | – | |" in row_of(
        table, "| spectra-signum |"
    )
    partial = sweep(*[g for n in names[:3] for g in picking(n, 1e-3, 2e-3)],
                    ({"optimizer": "soap", "lr": 2e-3}, {3: 4.0}, None))  # fmt: skip
    table = report.recheck_table(partial, {"longer": longer, "recheck-compare": compare})
    assert (
        row_of(table, "| soap |")
        == "| soap | 0.002: 4.000 (1 of 3 seeds) | being picked | – | – | |"
    )
    with pytest.raises(report.Missing, match="dmuon has not run every lr"):
        report.recheck_table(sweep(), {"longer": longer})


def test_soft_muon_and_dmuon_preclip_tables_pair_against_dmuon(report):
    def soft(kappa, lr, losses):
        return ({"optimizer": "dmuon", "optimizer_kwargs": {"soft_kappa": kappa}, "lr": lr},
                losses, None)  # fmt: skip

    # the second lr of the grid does best, inside the grid
    losses = [4.3, 4.1] + [4.2 + 0.1 * k for k in range(len(report.SOFT_LRS) - 2)]
    tried = tuple(zip(report.SOFT_LRS, losses, strict=True))
    best = report.SOFT_LRS[1]
    select = sweep(*[soft(k, lr, {3: loss}) for k in report.SOFT_KAPPAS[:-1] for lr, loss in tried],
                   soft(3.0, best, {3: 4.5}))  # fmt: skip
    compare = sweep(*[soft(k, best, B) for k in report.SOFT_KAPPAS])
    table = report.soft_muon_table(select, compare, A)
    row = row_of(table, "| 0.3 |")
    listed = ", ".join(f"{lr:g}: {loss:.3f}" for lr, loss in tried)
    assert f"| {listed} | {best:g} |" in row and f"| {UP} | D-Muon lower |" in row
    # a κ whose grid has not all run is still being picked, unless three lrs or more put its
    # best inside them; one not compared yet says so
    assert row_of(table, "| 3 |") == f"| 3 | {best:g}: 4.500 | being picked | – | – | |"
    inside = sweep(*[soft(0.03, lr, {3: loss}) for lr, loss in tried[:3]])
    assert f"| {best:g} | seeds 0-2 not run yet |" in row_of(
        report.soft_muon_table(inside, None, A), "| 0.03 |"
    )
    at_edge = sweep(*[soft(0.03, lr, {3: loss}) for lr, loss in tried[1:4]])
    assert "| being picked |" in row_of(report.soft_muon_table(at_edge, None, A), "| 0.03 |")
    table = report.soft_muon_table(select, None, A)
    assert f"| {best:g} | seeds 0-2 not run yet | – | |" in row_of(table, "| 0.3 |")
    with pytest.raises(report.Missing, match="soft-muon-lr has not run"):
        report.soft_muon_table(None, None, A)
    pre = sweep(({"pre_clip_schedule": "cosine"}, B, None), ({"pre_clip_kappa": 1.0}, B, None),
                ({"pre_clip_kappa": 2.0}, A, None))  # fmt: skip
    table = report.dmuon_preclip_table(pre, A)
    assert f"| {UP} | D-Muon alone lower |" in row_of(table, "| adaptive, κ = 1 |")
    # identical losses: no difference
    assert row_of(table, "| adaptive, κ = 2 |").endswith("| no difference |")


def test_the_soft_muon_verdict_sorts_the_compared_kappas_and_counts_the_rest(report):
    def soft(kappa, lr, losses):
        return ({"optimizer": "dmuon", "optimizer_kwargs": {"soft_kappa": kappa}, "lr": lr},
                losses, None)  # fmt: skip

    level = {s: v + 0.001 * (-1) ** s for s, v in A.items()}  # Δ ±0.001: no difference
    below = {s: v - 0.2 for s, v in A.items()}
    lr = report.SOFT_LRS[1]
    select = sweep(*[soft(k, x, {3: 4.0 + abs(x - lr)}) for k in report.SOFT_KAPPAS
                     for x in report.SOFT_LRS])  # fmt: skip
    # κ = 0.03 level, 0.1 and 0.3 above D-Muon (Δ = B − A > 0), 1 and 3 not compared yet
    compare = sweep(soft(0.03, lr, level), soft(0.1, lr, B), soft(0.3, lr, B))
    assert report.soft_muon_prose(select, compare, A) == (
        "D-Muon ends significantly lower than κ = 0.1 and 0.3; level with κ = 0.03; "
        "2 of the 5 κs still running"
    )
    # every κ compared, none lower than D-Muon: the sentence says so
    done = sweep(soft(0.03, lr, level), *[soft(k, lr, B) for k in report.SOFT_KAPPAS[1:]])
    assert report.soft_muon_prose(select, done, A) == (
        "D-Muon ends significantly lower than κ = 0.1, 0.3, 1 and 3; level with κ = 0.03; "
        "no κ ends significantly lower than D-Muon"
    )
    # one κ lower than D-Muon: named, and no claim that none is
    some = sweep(soft(0.03, lr, below), *[soft(k, lr, B) for k in report.SOFT_KAPPAS[1:]])
    assert report.soft_muon_prose(select, some, A) == (
        "D-Muon ends significantly lower than κ = 0.1, 0.3, 1 and 3; "
        "significantly higher than κ = 0.03"
    )
    nothing = report.soft_muon_prose(select, None, A)
    assert nothing == "no κ compared yet; 5 of the 5 κs still running"


def test_dmuon_with_bf16_newton_schulz_pairs_against_the_float32_runs(report):
    bf16 = sweep(({}, B, None))
    table = report.dmuon_bf16_table(bf16, A)
    assert row_of(table, "| float32").endswith("| (reference) | |")
    assert row_of(table, "| bf16").endswith(f"| {UP} | float32 lower |")
    assert report.dmuon_bf16_prose(bf16, A) == (
        f"with bf16 Newton–Schulz at the same lr it ends at {report.mean_std(B)}, "
        f"Δ = {UP} against float32: float32 lower"
    )
    level = sweep(({}, {s: v + 0.001 * (-1) ** s for s, v in A.items()}, None))
    assert report.dmuon_bf16_prose(level, A).endswith(": no difference within three seeds")
    partial = sweep(({}, {0: 4.0}, None))
    assert row_of(report.dmuon_bf16_table(partial, A), "| bf16").endswith(
        "| 1 of 3 seeds run | – | |"
    )
    assert report.dmuon_bf16_prose(partial, A) == (
        "its bf16 iteration is still running (1 of 3 seeds)"
    )
    with pytest.raises(report.Missing, match="dmuon-bf16 has not run"):
        report.dmuon_bf16_table(None, A)


def test_dmuon_preclip_rows_fill_in_case_by_case(report):
    table = report.dmuon_preclip_table(sweep(({"pre_clip_kappa": 1.0}, {0: 4.0}, None)), A)
    assert row_of(table, "| adaptive, κ = 1 |") == "| adaptive, κ = 1 | 1 of 3 seeds run | – | |"
    with pytest.raises(report.Missing, match="dmuon-preclip has not run"):
        report.dmuon_preclip_table(None, A)


def test_the_muon_answer_pairs_each_rival_against_dmuon_and_names_what_is_pending(report, tmp_path):
    pick = {3: 4.0, 4: 4.1, 5: 4.2}
    level = {s: v + 0.001 * (-1) ** s for s, v in A.items()}  # Δ ±0.001: no difference
    below = {s: v - 0.2 for s, v in A.items()}  # the rival lower by 0.2 on every seed
    soft = lambda k, lr, losses: ({"optimizer": "dmuon", "optimizer_kwargs": {"soft_kappa": k},  # noqa: E731
                                   "lr": lr}, losses, None)  # fmt: skip
    sweeps = {
        # SOAP still being picked: one of its picking seeds has run
        "recheck-lr": sweep(*[({"optimizer": n, "lr": 1e-3}, pick, None)
                              for n in ("dmuon", "spectra-adamw", "spectra-signum")],
                            ({"optimizer": "soap", "lr": 1e-3}, {3: 4.0}, None)),
        "longer": sweep(({"optimizer": "dmuon", "lr": 1e-3}, A, None),
                        ({"optimizer": "spectra-adamw", "lr": 1e-3}, B, None)),
        "recheck-compare": sweep(({"optimizer": "spectra-signum", "lr": 1e-3}, below, None)),
        "soft-muon-lr": sweep(*[soft(k, lr, {3: 4.0 + abs(lr - 2.5e-3)})
                                for k in (0.03, 0.1) for lr in report.SOFT_LRS]),
        "soft-muon": sweep(soft(0.03, 2.5e-3, B), soft(0.1, 2.5e-3, level)),
        "dmuon-preclip": sweep(({"pre_clip_kappa": 1.0}, {0: 4.0}, None)),
    }  # fmt: skip
    for name, data in sweeps.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(data))
    table = report.muon_table(tmp_path)
    assert row_of(table, "| D-Muon |").endswith("| (reference) | |")
    assert f"| {UP} | D-Muon lower |" in row_of(table, "| Spectra-AdamW |")
    assert row_of(table, "| Spectra-Signum |").endswith("| Spectra-Signum lower |")
    assert row_of(table, "| SOAP |") == "| SOAP | – | lr being picked | – | |"
    # of the κs compared, the one that ends lowest: κ = 0.1 (level), not κ = 0.03 (+0.098)
    assert row_of(table, "| D-Muon's soft clip").startswith("| D-Muon's soft clip (κ = 0.1) |")
    assert row_of(table, "| D-Muon + pre-clip") == (
        "| D-Muon + pre-clip | 0.001 | no case finished yet | – | |"
    )
    assert report.muon_answer_prose(tmp_path) == (
        "D-Muon ends significantly lower than Spectra-AdamW; level with D-Muon's soft clip "
        "(κ = 0.1), within the noise of three seeds; significantly higher than "
        "Spectra-Signum; 2 of the 5 comparisons are still running"
    )
