"""What the trainer logs about its hardware: tokens per second per device, MFU and peak memory,
recomputed from the records; the step loop reads its device scalars on report steps only; the
table of GPU peaks.

Tiny runs on the synthetic token stream of ``test_train``.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from spectra_lab.model import flops_per_token, model_config
from spectra_lab.train.config import ConfigError, TrainConfig
from spectra_lab.train.metrics import TRAIN_COLUMNS, read_jsonl
from spectra_lab.train.throughput import GPUS, gpu_of, matmul_precision, peak_flops
from spectra_lab.train.trainer import Diverged, train
from test_train import VOCAB, small_config, write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def train_dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "markov", n_train=8000, n_val=2048)


def train_records(run: Path) -> list[dict]:
    return [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


def test_logged_mfu_is_flops_per_token_times_tokens_per_s_per_device_over_the_peak(
    train_dataset, tmp_path, capsys
):
    cfg = small_config(train_dataset, tmp_path / "run", steps=6, log_interval=3, peak_tflops=0.5)
    train(cfg)
    flops = flops_per_token(model_config("tiny", VOCAB, seq_len=32))
    about = json.loads((tmp_path / "run" / "run.json").read_text())
    assert about["flops_per_token"] == flops and about["peak_tflops"] == 0.5
    rows = train_records(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 7))
    for r in rows:
        assert r["tokens_per_s"] == pytest.approx(8 * 32 / r["t_step"])
        assert r["tokens_per_s_per_device"] == r["tokens_per_s"]  # one process
        assert r["mfu"] == pytest.approx(flops * r["tokens_per_s_per_device"] / 0.5e12)
        assert r["peak_mem_gb"] > 0  # the process's peak RSS on a CPU
    with (tmp_path / "run" / "train.csv").open() as f:
        table = list(csv.DictReader(f))
    assert tuple(table[0]) == TRAIN_COLUMNS
    assert float(table[-1]["mfu"]) == pytest.approx(rows[-1]["mfu"], rel=1e-12)
    lines = [line for line in capsys.readouterr().out.splitlines() if "tok/s" in line]
    assert len(lines) == 2 and " | mfu " in lines[0] and " GB" in lines[0]


def test_mfu_is_null_on_a_cpu_without_peak_tflops(train_dataset, tmp_path):
    train(small_config(train_dataset, tmp_path / "run", steps=2, warmup_steps=0))
    assert all(r["mfu"] is None for r in train_records(tmp_path / "run"))
    assert json.loads((tmp_path / "run" / "run.json").read_text())["peak_tflops"] is None
    with (tmp_path / "run" / "train.csv").open() as f:
        assert [row["mfu"] for row in csv.DictReader(f)] == ["", ""]


class StepCount:
    """An observer of the steps (``train(watch=...)``) that knows the step being taken."""

    def __init__(self, ctx) -> None:
        self.step = ctx.start

    def before_step(self) -> None:
        self.step += 1

    def after_step(self) -> None:
        """The step count moves in before_step; nothing to record after it."""


def test_step_loop_reads_device_scalars_on_report_steps_only(train_dataset, tmp_path, monkeypatch):
    # Every host read of a tensor the training run's modules make (.item(), .tolist(), float(),
    # int(), bool()) is recorded with the step in progress: on CUDA each one waits for the device.
    from spectra_lab.train import build, evaluate, parallel, resume

    loop = sys.modules[train.__module__]
    trainer_files = {str(Path(m.__file__)) for m in (loop, build, evaluate, parallel, resume)}
    counter: list[StepCount] = []
    reads: list[int] = []

    def spy(real):
        def read(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename in trainer_files:
                reads.append(counter[0].step)
            return real(self, *args, **kwargs)

        return read

    def watch(ctx):
        counter.append(StepCount(ctx))
        return counter[0]

    cfg = small_config(
        train_dataset, tmp_path / "lazy", steps=12, log_interval=4, eval_interval=100,
        checkpoint_interval=0,
    )  # fmt: skip
    with monkeypatch.context() as patch:
        for name in ("item", "tolist", "__float__", "__int__", "__bool__"):
            patch.setattr(torch.Tensor, name, spy(getattr(torch.Tensor, name)))
        train(cfg, watch=watch)
    # reports at steps 4, 8 and 12 (the last step also evaluates and saves)
    assert sorted(set(reads)) == [4, 8, 12]

    # The records are those of a run that reads every step (log_interval 1).
    eager = small_config(train_dataset, tmp_path / "eager", steps=12, log_interval=1)
    train(eager)
    lazy_rows, eager_rows = train_records(tmp_path / "lazy"), train_records(tmp_path / "eager")
    assert [r["step"] for r in lazy_rows] == list(range(1, 13))
    for key in ("loss", "grad_norm", "lr", "tokens"):
        assert [r[key] for r in lazy_rows] == [r[key] for r in eager_rows], key


def test_a_nonfinite_loss_stops_the_run_at_its_step_after_logging_the_steps_before(
    train_dataset, tmp_path
):
    cfg = small_config(train_dataset, tmp_path / "run", steps=8, log_interval=4, lr=1e30)
    with pytest.raises(Diverged, match=r"loss is (nan|inf) at step \d") as info:
        train(cfg)
    bad = int(re.search(r"at step (\d+)", str(info.value)).group(1))
    assert 1 < bad < 4  # a step whose predecessors wait for the report of step 4
    assert [r["step"] for r in train_records(tmp_path / "run")] == list(range(1, bad))


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpu_names_map_to_their_datasheet_peaks(name, key):
    assert gpu_of(name) == key


def test_peak_flops_is_the_given_value_or_the_table_in_the_runs_precision(monkeypatch):
    cpu = torch.device("cpu")
    assert peak_flops(cpu, None) is None and peak_flops(cpu, torch.bfloat16) is None
    assert peak_flops(cpu, None, peak_tflops=2.5) == 2.5e12
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak_flops(gpu, torch.bfloat16) == GPUS["h100"].bf16 * 1e12 == 989.5e12
    assert peak_flops(gpu, torch.bfloat16, peak_tflops=900.0) == 900e12
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert matmul_precision(None) == "fp32" and peak_flops(gpu, None) == 67e12
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert matmul_precision(None) == "tf32" and peak_flops(gpu, None) == 494.5e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    assert peak_flops(gpu, torch.bfloat16) is None


@pytest.mark.parametrize("value", [0, -1.0])
def test_peak_tflops_must_be_positive(value):
    with pytest.raises(ConfigError, match="peak_tflops"):
        TrainConfig(peak_tflops=value)
