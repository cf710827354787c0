"""``spectra bench step`` and ``spectra bench memory`` on the tiny preset (no timing asserts)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils._pytree import tree_leaves

from spectra_lab.bench.step import base_of, format_report, run_benchmark
from spectra_lab.cli import main
from spectra_lab.train.optimizers import OPTIMIZERS, StateSize

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rows_hold_shares_and_overheads_against_the_base_optimizer():
    rows = run_benchmark(("adamw", "spectra-adamw"), "tiny", steps=1, warmup=1, pre_clip_c=5.0)
    assert [r["optimizer"] for r in rows] == [
        "adamw",
        "adamw + pre-clip 5",
        "spectra-adamw",
        "spectra-adamw + pre-clip 5",
    ]
    by_name = {r["optimizer"]: r for r in rows}
    base = by_name["adamw"]
    assert base["overhead"] == 0.0
    for r in rows:
        assert 0 < r["optimizer_ms"] < r["total_ms"]
        assert r["share"] == pytest.approx(r["optimizer_ms"] / r["total_ms"])
        assert r["overhead"] == pytest.approx(r["total_ms"] / base["total_ms"] - 1.0)
        own = by_name[r["base"]]
        assert r["optimizer_overhead"] == pytest.approx(
            (r["optimizer_ms"] - own["optimizer_ms"]) / own["total_ms"]
        )
    assert base["optimizer_overhead"] == 0.0
    assert base_of("spectra-signum") == "signum" and base_of("torch-adamw") == "torch-adamw"


def test_optimizers_take_their_steps_in_turn(monkeypatch):
    import spectra_lab.bench.step as step

    order = []
    real = step._step

    def record(run, device, timed):
        order.append((run.name, timed))
        real(run, device, timed)

    monkeypatch.setattr(step, "_step", record)
    run_benchmark(("adamw", "spectra-adamw"), "tiny", steps=2, warmup=1)
    names = [n for n, _ in order]
    assert names == ["adamw", "spectra-adamw"] * 3
    assert [t for _, t in order] == [False, False, True, True, True, True]


def test_cli_prints_the_table_and_rejects_bad_input_in_one_line(capsys):
    argv = ["bench", "step", "--preset", "tiny", "--steps", "1", "--warmup", "0"]
    assert main([*argv, "--optimizer", "adamw"]) == 0
    assert "| adamw |" in capsys.readouterr().out
    # optimizers that cannot pre-clip get no pre-clip row, and the table says so (torch's
    # AdamW: its step is cheap, where SOAP's first takes an eigh of the 4096-row embedding's
    # factor)
    assert main([*argv, "--optimizer", "adamw", "torch-adamw", "--pre-clip", "1"]) == 0
    out = capsys.readouterr().out
    assert "| adamw + pre-clip 1 |" in out and "| torch-adamw |" in out
    assert "torch-adamw + pre-clip" not in out and "no pre-clip row for torch-adamw" in out
    assert main(["bench", "step", "--preset", "huge"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'huge'" in err


def test_json_stores_the_report_the_table_is_printed_from(tmp_path, capsys):
    path = tmp_path / "step.json"
    argv = ["bench", "step", "--preset", "tiny", "--steps", "1", "--warmup", "0", "--device",
            "cpu", "--optimizer", "adamw", "torch-adamw", "--pre-clip", "1",
            "--json", str(path)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    assert report["args"] == {
        "preset": "tiny", "optimizer": ["adamw", "torch-adamw"], "pre_clip": 1.0, "steps": 1,
        "warmup": 0, "batch_size": 8, "device": "cpu", "threads": None,
    }  # fmt: skip
    assert report["torch"] == torch.__version__ and report["threads"] == torch.get_num_threads()
    rows = [r["optimizer"] for r in report["rows"]]
    assert rows == ["adamw", "adamw + pre-clip 1", "torch-adamw"]
    assert report["no_pre_clip"] == ["torch-adamw"]
    assert format_report(report) == out
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_state_memory_equals_the_papers_formula(name, tiny_state):
    r = tiny_state(name)
    assert r["state_elements"] == r["formula_elements"], r


def test_bench_memory_prints_and_stores_its_table(tmp_path, capsys):
    from spectra_lab.bench.memory import format_table, measure

    path = tmp_path / "memory.json"
    assert main(["bench", "memory", "--preset", "tiny", "--optimizer", "adamw", "torch-adamw",
                 "--json", str(path)]) == 0  # fmt: skip
    stored = json.loads(path.read_text())
    assert stored["preset"] == "tiny" and stored["machine"]["cpu"]
    assert [r["optimizer"] for r in stored["rows"]] == ["adamw", "torch-adamw"]
    assert stored["rows"][0] == json.loads(json.dumps(measure("adamw", "tiny")))
    assert format_table(stored["rows"]) in capsys.readouterr().out


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_registered_optimizer_carries_its_state_size(name):
    # The registry's row states the formula; a real instance on small float32 parameters
    # holds that many elements' bytes in optimizer.state after one step (step counters apart).
    from spectra_lab.model import Llama, model_config
    from spectra_lab.train.config import TrainConfig
    from spectra_lab.train.optimizers import build_optimizer
    from spectra_lab.train.schedule import build_lr_lambda

    state = OPTIMIZERS[name].state
    assert isinstance(state, StateSize) and state.words
    torch.manual_seed(0)
    model = Llama(model_config("tiny", 96, seq_len=16))
    cfg = TrainConfig(preset="tiny", optimizer=name, steps=10, warmup_steps=1)
    optimizer = build_optimizer(model, cfg, build_lr_lambda(cfg))
    for p in model.parameters():
        p.grad = 1e-3 * torch.randn_like(p)
    optimizer.step()
    tensors = [
        t
        for s in optimizer.state.values()
        for t in tree_leaves(s)
        if isinstance(t, torch.Tensor) and t.numel() > 1
    ]
    assert sum(t.numel() * t.element_size() for t in tensors) == 4 * state.elements(optimizer)
