"""Every figure about the configs of ``configs/paper/`` is recomputed from the configs.

The memory figures of the files' headers, of ``configs/paper/README.md`` and of the table in
``docs/scale.md`` are ``spectra bench plan``'s (an analytic model, cheap and deterministic), so
they are compared with a fresh plan, as are the stored plans under ``docs/data/``. The μP
figures of ``docs/scale.md`` are compared with the stored runs under ``results/mup/``. Where
a text names the source of a value, the test checks the attributions that once were wrong: the
1.5B model's shape, batch and μP defaults come from the training scripts linked by
"Enhancing LLM Training via Spectral Clipping", not from its text.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spectra_lab.blocks.runs import per_doubling
from spectra_lab.estimate.plan import _duration, plan
from spectra_lab.train.config import TrainConfig, build_config, read_config_file

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "paper"
FILES = sorted(CONFIGS.glob("*.yaml"))
README = CONFIGS / "README.md"
SCALE = ROOT / "docs" / "scale.md"
PLAN_ALL = ROOT / "docs" / "data" / "plan_paper_configs.json"
PLAN_H100X4 = ROOT / "docs" / "data" / "plan_h100x4.json"
#: the plan every stored figure assumes: the paper's 4 GPUs, H100s at 40% MFU
WORLD, GPU, MFU = 4, "h100", 0.4
#: the memory of the H100 the headers plan for, in GB
H100_GB = 80
#: AdamW's step times of the paper's Table "Per-step timing" (tab:timing_combined), in ms
PAPER_STEP_MS = {"160m": 200.7, "780m": 6550.0, "820m": 4412.0}


@functools.cache
def load(name: str) -> TrainConfig:
    path = CONFIGS / name
    return build_config((str(path), read_config_file(path)))


@functools.cache
def _plan(name: str, world_size: int, micro_batch: int) -> dict[str, Any]:
    cfg = dataclasses.replace(load(name), batch_size=micro_batch)
    return plan(cfg, world_size, GPU, MFU)


def plan_of(name: str, world_size: int = WORLD, micro_batch: int | None = None) -> dict:
    """``spectra bench plan``'s row of a file, optionally at another micro-batch."""
    return _plan(name, world_size, micro_batch or load(name).batch_size)


def header(path: Path) -> str:
    """The comment lines before the first key, as one line of text."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def gb(n_bytes: float) -> str:
    """Bytes in GB (10^9 bytes), as ``spectra bench plan`` prints them."""
    return f"{n_bytes / 1e9:.1f}"


def short(lr: float) -> str:
    """``1e-3``, ``3.2e-2``: a learning rate as the headers and the tables write it."""
    mantissa, exponent = f"{lr:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{int(exponent)}"


def printed(value: float, text: str) -> bool:
    """Whether ``text`` is ``value`` rounded to the decimals ``text`` shows."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return math.isclose(round(value, decimals), float(text), abs_tol=1e-9)


def same(a: Any, b: Any) -> bool:
    """Equal JSON values, floats to 1e-9 relative."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


# ------------------------------------------------------------------ the files' headers

MEMORY = re.compile(
    r"(\d+\.\d) GB with micro-batch (\d+) on (\d+) GPUs?(, too much for an 80 GB H100)?"
)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_header_memory_figures_are_bench_plans_of_the_file(path: Path):
    text = header(path)
    cfg = load(path.name)
    assert "GiB" not in text
    figures = MEMORY.findall(text)
    # the file's own micro-batch on the paper's 4 GPUs is always given
    assert (str(cfg.batch_size), str(WORLD)) in {(mb, ws) for _, mb, ws, _ in figures}
    for value, micro_batch, world_size, too_much in figures:
        row = plan_of(path.name, int(world_size), int(micro_batch))
        assert value == gb(row["memory_ddp"]["total"]), (micro_batch, world_size)
        assert (float(value) > H100_GB) == bool(too_much), value
    states = re.findall(r"optimizer state is (\d+\.\d) GB", text)
    for value in states:
        assert value == gb(plan_of(path.name)["memory_ddp"]["optimizer_state"])
    # no other memory figure: every "<number> GB" is one of these or a GPU's size
    sizes = re.findall(r"\b(?:80|96) GB\b", text)
    assert len(re.findall(r"\d GB\b", text)) == len(figures) + len(states) + len(sizes)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_header_tokens_and_lr_are_the_files(path: Path):
    text = header(path)
    cfg = load(path.name)
    row = plan_of(path.name)
    m = re.search(
        r"Tokens: (\d+) x (\d+) = ([\d,]+) per step; ([\d,]+) steps = ([\d,]+) tokens "
        r"\((\d+(?:\.\d+)?)([MB])\)",
        text,
    )
    assert m, "no Tokens line"
    sequences, seq_len, per_step, steps, tokens, abbreviated, unit = m.groups()
    assert int(sequences) == cfg.global_batch_size and int(seq_len) == row["seq_len"]
    assert int(per_step.replace(",", "")) == row["tokens_per_step"]
    assert int(steps.replace(",", "")) == row["steps"] == cfg.steps
    assert int(tokens.replace(",", "")) == row["tokens"]
    assert printed(row["tokens"] / {"M": 1e6, "B": 1e9}[unit], abbreviated)
    # the learning rate the header marks [x] is the file's
    assert f"[{short(cfg.lr)}]" in text
    assert "the table's bold, chosen value" not in text


def test_stored_plan_of_every_config_is_a_fresh_plan():
    stored = json.loads(PLAN_ALL.read_text())
    assert (stored["world_size"], stored["gpu"], stored["mfu"]) == (WORLD, GPU, MFU)
    rows = {row["file"]: row for row in stored["rows"]}
    assert set(rows) == {f"configs/paper/{p.name}" for p in FILES}
    for path in FILES:
        row = rows[f"configs/paper/{path.name}"]
        assert same(row, {"file": row["file"], **plan_of(path.name)}), path.name


# ---------------------------------------------------------------- configs/paper/README.md

TABLE_ROW = re.compile(
    r"^\| \[`([^`]+\.yaml)`\]\([^)]*\) \|[^|]*\|[^|]*\|[^|]*\| ([^|]+) \| ([\d,]+) \| ([\d,]+) "
    r"\| (\d+(?:\.\d+)?)([MB]) \|",
    re.M,
)


def test_readme_tables_give_each_files_lr_and_tokens():
    rows = TABLE_ROW.findall(README.read_text())
    assert {name for name, *_ in rows} == {p.name for p in FILES}
    for name, lr, per_step, steps, tokens, unit in rows:
        cfg, row = load(name), plan_of(name)
        assert lr.strip() == short(cfg.lr), name
        assert int(per_step.replace(",", "")) == row["tokens_per_step"], name
        assert int(steps.replace(",", "")) == cfg.steps, name
        assert printed(row["tokens"] / {"M": 1e6, "B": 1e9}[unit], tokens), name


def test_readme_figures_are_the_configs():
    text = " ".join(README.read_text().split())
    # the largest memory per GPU of any file
    m = re.search(r"the largest is (\d+\.\d) GB \(`([^`]+)`", text)
    assert m
    largest = max(FILES, key=lambda p: plan_of(p.name)["memory_ddp"]["total"])
    assert m.groups() == (gb(plan_of(largest.name)["memory_ddp"]["total"]), largest.name)
    # parameter counts of the five model sizes
    m = re.search(r"have ([\d.,]+)M, ([\d.,]+)M, ([\d.,]+)M, ([\d.,]+)M and ([\d.,]+)M param", text)
    assert m
    examples = ("124m-cos-adamw-diagnostics", "160m-wsd-adamw", "780m-wsd-adamw")
    examples += ("820m-wsd-adamw", "1.5b-mup-wsd-soap")
    for count, stem in zip(m.groups(), examples, strict=True):
        assert count == f"{plan_of(stem + '.yaml')['parameters'] / 1e6:,.1f}", stem
    # every file pads GPT-2's vocabulary to the paper's 50,304 rows
    assert {load(p.name).vocab_multiple for p in FILES} == {64}
    assert "50,304 rows" in text and "the 47 extra rows" in text and 50304 - 50257 == 47
    # evaluation and checkpoint intervals
    m = re.search(r"Evaluation every (\d+) to (\d+) steps.*?checkpoints every (\d+) to (\d+)", text)
    assert m
    evals = [load(p.name).eval_interval for p in FILES]
    ckpts = [load(p.name).checkpoint_interval for p in FILES]
    assert tuple(map(int, m.groups())) == (min(evals), max(evals), min(ckpts), max(ckpts))
    # the longest runs of each dataset
    m = re.search(
        r"longest FineWeb-Edu runs read ([\d.]+)B tokens \(780M, ([\d,]+) steps\) and "
        r"([\d.]+)B \(160M\); the SlimPajama runs at most ([\d.]+)B",
        text,
    )
    assert m
    longest = {}
    for p in FILES:
        key = (load(p.name).dataset, p.name.split("-")[0])
        longest[key] = max(longest.get(key, 0), plan_of(p.name)["tokens"])
    assert printed(longest["fineweb-edu", "780m"] / 1e9, m[1])
    assert int(m[2].replace(",", "")) == max(load(p.name).steps for p in FILES if "780m" in p.name)
    assert printed(longest["fineweb-edu", "160m"] / 1e9, m[3])
    slim = max(v for (dataset, _), v in longest.items() if dataset == "slimpajama")
    assert printed(slim / 1e9, m[4])


# ------------------------------------------------------------------------- docs/scale.md


def test_scale_plan_table_and_its_json_are_fresh_plans():
    stored = json.loads(PLAN_H100X4.read_text())
    assert (stored["world_size"], stored["gpu"], stored["mfu"]) == (WORLD, GPU, MFU)
    text = SCALE.read_text()
    command = re.search(
        r"spectra bench plan ((?:configs/paper/[\w.-]+\.yaml[\s\\]*)+)--world-size 4 "
        r"--json docs/data/plan_h100x4\.json",
        text,
    )
    assert command
    files = re.findall(r"configs/paper/([\w.-]+\.yaml)", command[1])
    assert [row["file"] for row in stored["rows"]] == [f"configs/paper/{f}" for f in files]
    table = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and f"{cells[0]}.yaml" in files:
            table[cells[0]] = cells[1:]
    assert set(table) == {f.removesuffix(".yaml") for f in files}
    for row in stored["rows"]:
        name = row["file"].removeprefix("configs/paper/")
        fresh = plan_of(name)
        assert same(row, {"file": row["file"], **fresh}), name
        params, per_step, steps, tokens, step, run, ddp, fsdp2 = table[name.removesuffix(".yaml")]
        assert params == f"{fresh['parameters'] / 1e6:.1f}M"
        assert per_step == f"{fresh['tokens_per_step']:,}" and steps == f"{fresh['steps']:,}"
        assert tokens.endswith("B") and printed(fresh["tokens"] / 1e9, tokens[:-1])
        assert (step, run) == (_duration(fresh["step_s"]), _duration(fresh["total_s"]))
        assert ddp == gb(fresh["memory_ddp"]["total"])
        assert fsdp2 == gb(fresh["memory_fsdp2"]["total"])
        # the activations are more than half the memory of every run but the 820M and 1.5B
        share = fresh["memory_ddp"]["activations"] / fresh["memory_ddp"]["total"]
        assert (share > 0.5) == (fresh["preset"] not in ("820m", "1.5b")), name


def test_scale_mfu_of_the_papers_step_times():
    text = " ".join(SCALE.read_text().split())
    m = re.search(
        r"are <!-- paper -->([\d.]+) ms at 160M, ([\d.]+) ms at 780M and ([\d.]+) ms at 820M"
        r"<!-- /paper -->: longer than the table's steps, <!-- data:paper-mfu -->(\d+)%, (\d+)% "
        r"and (\d+)% MFU by the same FLOP count, so expect the runs to take ([\d.]+)–([\d.]+)×",
        text,
    )
    assert m
    times = dict(zip(("160m", "780m", "820m"), map(float, m.groups()[:3]), strict=True))
    assert times == PAPER_STEP_MS
    stems = {"160m": "160m-wsd-adamw", "780m": "780m-wsd-adamw", "820m": "820m-wsd-adamw"}
    mfus = [MFU * plan_of(f"{stems[s]}.yaml")["step_s"] / (times[s] / 1e3) for s in times]
    assert [f"{100 * x:.0f}" for x in mfus] == list(m.groups()[3:6])
    slowdowns = [MFU / x for x in mfus]
    assert printed(min(slowdowns), m[7]) and printed(max(slowdowns), m[8])


COORD = ROOT / "results" / "mup" / "coord-check" / "coord_check.json"
LR_TRANSFER = ROOT / "results" / "mup" / "lr-transfer" / "results.json"


def test_scale_coordinate_check_figures_are_the_stored_run():
    from spectra_lab.mup.coord import growth

    results = json.loads(COORD.read_text())
    text = SCALE.read_text()
    flat = " ".join(text.split())
    layer_row = r"^\| (embedding|block 1|block 2|logits) \| ([\d.]+) \| ([\d.]+) \|$"
    rows = re.findall(layer_row, text, re.M)
    assert len(rows) == 4
    ratios = growth(results)
    for layer, standard, mup in rows:
        assert printed(ratios["standard"][layer], standard), layer
        assert printed(ratios["mup"][layer], mup), layer
    widths = results["widths"]
    steps = range(1, results["steps"])

    def spread(param: str, layers: tuple[str, ...]) -> tuple[float, float]:
        runs = results["runs"][param]
        g = [per_doubling(runs, widths, layer, t) for layer in layers for t in steps]
        return min(g), max(g)

    m = re.search(
        r"at steps 1 to 5 is ([\d.]+)–([\d.]+)× \(block 1\), ([\d.]+)–([\d.]+)× \(block 2\) "
        r"and ([\d.]+)–([\d.]+)× \(logits\) with the standard parametrization",
        flat,
    )
    assert m and results["steps"] == 6
    spreads = [spread("standard", (layer,)) for layer in ("block 1", "block 2", "logits")]
    assert all(printed(v, t) for v, t in zip(np.ravel(spreads), m.groups(), strict=True))
    m = re.search(r"With μP it is ([\d.]+)–([\d.]+)× for the blocks and ([\d.]+)–([\d.]+)×", flat)
    assert m
    spreads = [spread("mup", ("block 1", "block 2")), spread("mup", ("logits",))]
    assert all(printed(v, t) for v, t in zip(np.ravel(spreads), m.groups(), strict=True))
    # the widest over the narrowest of any width, at any step after the first
    m = re.search(r"block outputs by up to ([\d.]+)×.*?by up to ([\d.]+)×", flat)
    assert m
    runs = results["runs"]["mup"]

    def wobble(layers: tuple[str, ...]) -> float:
        values = [[runs[str(w)][layer][t] for w in widths] for layer in layers for t in steps]
        return max(max(v) / min(v) for v in values)

    assert printed(wobble(("block 1", "block 2")), m[1]) and printed(wobble(("logits",)), m[2])
    m = re.search(r"\(([\d.]+)× per doubling\), as the 1/m readout", flat)
    assert m and printed(per_doubling(runs, widths, "logits", 0), m[1])


#: the rows of the lr-transfer table in docs/scale.md: (optimizer, parametrization, lr/m)
LR_METHODS = {
    "AdamW, standard": ("adamw", "standard", True),
    "AdamW, μP": ("adamw", "mup", True),
    "Spectra-AdamW, standard": ("spectra-adamw", "standard", True),
    "Spectra-AdamW, μP (lr/m)": ("spectra-adamw", "mup", True),
    "Spectra-AdamW, μP multipliers, one lr": ("spectra-adamw", "mup", False),
}


def test_scale_lr_transfer_figures_are_the_stored_sweep():
    results = json.loads(LR_TRANSFER.read_text())
    best = {}
    for b in results["best"]:
        point = b["point"]
        key = (point["optimizer"], point["parametrization"], point.get("mup_lr_scaling", True))
        best[key, point["d_model"]] = b
    text = SCALE.read_text()
    seen = 0
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] not in LR_METHODS:
            continue
        seen += 1
        for width, cell in zip((64, 128, 256), cells[1:4], strict=True):
            lr, mean, std = re.match(r"([\d.]+e-\d) \(([\d.]+) ± ([\d.]+)", cell).groups()
            b = best[LR_METHODS[cells[0]], width]
            assert math.isclose(b["lr"], float(lr)), (cells[0], width)
            assert printed(b["mean"], mean) and printed(b["std"], std), (cells[0], width)
    assert seen == len(LR_METHODS)
    flat = " ".join(text.split())
    m = re.search(r"two seeds each \((\d+) runs", flat)
    assert m and int(m[1]) == len(results["runs"])
    # SPECTRA's margin over AdamW at each one's best lr, in each parametrization
    m = re.search(r"by ([\d.]+)–([\d.]+) in final loss", flat)
    assert m
    margins = [
        best[("adamw", p, True), w]["mean"] - best[("spectra-adamw", p, s), w]["mean"]
        for w in (64, 128, 256)
        for p, s in (("standard", True), ("mup", True), ("mup", False))
    ]
    assert printed(min(margins), m[1]) and printed(max(margins), m[2])


# ----------------------------------------------------------------------- attributions

#: statements of where a value comes from that the paper's text does not support
WRONG_SOURCES = (
    "The defaults are the paper's",
    "the paper's 1.5B",
    "paper's: 13 x 160",
    "the table's bold, chosen value",
    "the trainer builds the embedding and the head with the tokenizer's 50,257 rows",
)


@pytest.mark.parametrize(
    "path",
    [SCALE, README, ROOT / "src/spectra_lab/train/config.py",
     ROOT / "src/spectra_lab/model/llama.py", *FILES],
    ids=lambda p: p.name,
)  # fmt: skip
def test_values_not_in_the_papers_text_are_not_called_the_papers(path: Path):
    text = header(path) if path.suffix == ".yaml" else " ".join(path.read_text().split())
    for phrase in WRONG_SOURCES:
        assert phrase not in text, phrase
    if path.name.startswith("1.5b-"):
        assert "training scripts linked by the paper" in text
        assert "the paper's text gives none of them" in text
