"""The trainer's spectral monitor and loggers: ``monitor`` records in metrics.jsonl, cut back on
resume; TensorBoard event files and an offline W&B run read back with the logged values; the
monitor on DDP and FSDP2 processes; one-line errors for bad settings and missing packages.

Tiny runs on the synthetic token stream of ``test_train``.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from spectra_lab.cli import main
from spectra_lab.runs.checkpoint import read_checkpoint
from spectra_lab.runs.records import read_jsonl
from spectra_lab.train.config import ConfigError
from spectra_lab.train.optimizers import group_of
from spectra_lab.train.trainer import train
from test_train import small_config, write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def train_dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "markov")


def records(run: Path, kind: str) -> list[dict]:
    return [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == kind]


def test_monitor_records_its_steps_without_changing_the_run(train_dataset, tmp_path):
    plain = small_config(train_dataset, tmp_path / "plain", steps=10, optimizer="spectra-adamw")
    train(plain)
    cfg = dataclasses.replace(plain, out_dir=str(tmp_path / "mon"), monitor_every=3)
    result = train(cfg)
    # the same trajectory, bit for bit
    assert [r["loss"] for r in records(tmp_path / "mon", "train")] == [
        r["loss"] for r in records(tmp_path / "plain", "train")
    ]
    mon = records(tmp_path / "mon", "monitor")
    # monitored: the steps whose 0-based index is a multiple of 3, i.e. steps 1, 4, 7, 10
    assert [r["step"] for r in mon] == [1, 4, 7, 10]
    assert [r["spectral/step"] for r in mon] == [0.0, 3.0, 6.0, 9.0]
    # every weight matrix is watched (monitor_groups' default), vectors are not
    matrices = {n: p for n, p in result.model.named_parameters() if p.dim() >= 2}
    names = {k.split("/")[1] for k in mon[0] if k.count("/") == 2}
    assert names == set(matrices)
    wq = "spectral/layers.0.attn.wq.weight/"
    assert 0 < mon[-1][wq + "step_norm_over_bound"] <= 1 + 1e-6  # a clipped group
    assert wq + "clip_c" in mon[-1] and "spectral/tok_embeddings.weight/clip_c" not in mon[-1]
    # the last record's weight norms are the final weights' (float64, from the checkpoint)
    state = read_checkpoint(tmp_path / "mon" / "ckpt" / "step_0000010.pt")["model"]
    fro = sum(torch.linalg.vector_norm(state[n].double()).item() for n in matrices)
    linf = sum(state[n].double().abs().max().item() for n in matrices)
    assert mon[-1]["spectral/sum_weight_fro"] == pytest.approx(fro, rel=1e-12)
    assert mon[-1]["spectral/sum_weight_linf"] == pytest.approx(linf, rel=1e-12)
    # its time is a phase of the step: present on every step, large on monitored ones
    rows = records(tmp_path / "mon", "train")
    assert all(0 <= r["t_monitor"] <= r["t_step"] for r in rows)
    csv_header = (tmp_path / "mon" / "train.csv").read_text().splitlines()[0]
    assert "t_monitor" in csv_header.split(",")
    assert "t_monitor" not in records(tmp_path / "plain", "train")[0]


def test_monitor_groups_choose_the_watched_matrices(train_dataset, tmp_path):
    cfg = small_config(train_dataset, tmp_path / "run", steps=2, eval_interval=2, warmup_steps=1,
                       monitor_every=1, monitor_groups=["attn"])  # fmt: skip
    result = train(cfg)
    names = {k.split("/")[1] for k in records(tmp_path / "run", "monitor")[0] if k.count("/") == 2}
    want = {n for n, p in result.model.named_parameters() if group_of(n, p) == "attn"}
    assert names == want and len(want) == 8


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_resume_cuts_monitor_records_back_and_tensorboard_hides_the_lost_steps(
    train_dataset, tmp_path
):
    common = dict(steps=12, optimizer="spectra-adamw", monitor_every=2, loggers=["tensorboard"])
    full = small_config(train_dataset, tmp_path / "full", **common)
    train(full)
    cfg = small_config(train_dataset, tmp_path / "cut", **common)

    def interrupt(step, record):
        if step == 8:  # after the checkpoint at step 5: steps 6-8 are logged, then lost
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, on_step=interrupt)
    assert [r["step"] for r in records(tmp_path / "cut", "monitor")] == [1, 3, 5, 7]
    train(dataclasses.replace(cfg, resume=True))
    a, b = records(tmp_path / "full", "monitor"), records(tmp_path / "cut", "monitor")
    assert [r["step"] for r in b] == [1, 3, 5, 7, 9, 11]  # step 7 once, from the resumed run
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        values = [k for k in ra if k != "kind"]
        np.testing.assert_allclose([rb[k] for k in values], [ra[k] for k in values], rtol=1e-5)

    # TensorBoard: two event files (two starts); the purge hides steps 6-8 of the first one
    assert len(list((tmp_path / "cut" / "tensorboard").iterdir())) == 2
    tb = tensorboard_scalars(tmp_path / "cut")
    losses = [(r["step"], r["loss"]) for r in records(tmp_path / "cut", "train")]
    assert [s for s, _ in tb["train/loss"]] == list(range(1, 13))
    np.testing.assert_allclose([v for _, v in tb["train/loss"]], [v for _, v in losses], rtol=1e-6)
    key = "spectral/layers.1.mlp.w2.weight/update_sigma_max"
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in tb[key]] == [(r["step"], r[key]) for r in b]
    evals = records(tmp_path / "cut", "eval")
    assert [(s, pytest.approx(v, rel=1e-6)) for s, v in tb["eval/val_loss"]] == [
        (r["step"], r["val_loss"]) for r in evals
    ]
    assert "spectral/step" not in tb and "train/clip_c" in tb


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    """W&B with no network: offline mode, no git/code/system-stats collection, no error
    reports, its config and cache in the test's folder, and a base URL nothing listens on."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    env = dict(
        WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true", WANDB_X_DISABLE_STATS="true", WANDB_ERROR_REPORTING="false",
        WANDB_BASE_URL="http://127.0.0.1:9", WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"), WANDB_DATA_DIR=str(tmp_path / "wandb-data"),
        WANDB_PROJECT="spectra-tests",
    )  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def wandb_history(path: Path) -> dict[int, dict[str, float]]:
    """``{step: {key: value}}`` of the history records of a ``.wandb`` file.

    The file is W&B's LevelDB-style log: a 7-byte header (``:W&B``, magic, version), then
    32 KiB blocks of chunks, each with a 7-byte header (CRC-32, length, type: 1 full, 2 first,
    3 middle, 4 last) and a piece of a serialized ``Record`` protobuf.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, pending, history = 7, b"", {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = {  # keys with "/" are stored split at the slashes
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
                history[record.history.step.num] = items
    return history


@pytest.mark.usefixtures("wandb_offline")
def test_wandb_offline_run_holds_the_logged_scalars(train_dataset, tmp_path):
    cfg = small_config(train_dataset, tmp_path / "run", steps=4, eval_interval=2, warmup_steps=1,
                       monitor_every=2, loggers=["wandb"])  # fmt: skip
    train(cfg)
    import wandb

    wandb.teardown()  # the service writes the .wandb file; wait until it has exited
    run_id = json.loads((tmp_path / "run" / "run.json").read_text())["wandb_id"]
    (offline,) = (tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id}")
    history = wandb_history(offline / f"run-{run_id}.wandb")
    assert sorted(history) == [1, 2, 3, 4]
    for r in records(tmp_path / "run", "train"):
        assert history[r["step"]]["train/loss"] == pytest.approx(r["loss"], rel=1e-12)
        assert history[r["step"]]["train/lr"] == pytest.approx(r["lr"], rel=1e-12)
    for r in records(tmp_path / "run", "eval"):
        assert history[r["step"]]["eval/val_loss"] == pytest.approx(r["val_loss"], rel=1e-12)
    key = "spectral/layers.0.mlp.w1.weight/grad_sigma_max"
    for r in records(tmp_path / "run", "monitor"):
        assert history[r["step"]][key] == pytest.approx(r[key], rel=1e-12)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--monitor-every", "-1"], "config field 'monitor_every' = -1: monitor_every must be"),
        (["--log", "tensorbord"], "config field 'loggers' = ['tensorbord']: loggers must be one"),
        (["--set", "monitor_groups=[norm]"], "monitor_groups must be one of"),
        (["--monitor-every", "5", "--set", "monitor_groups=[]"], "the monitor would watch"),
    ],
)
def test_bad_monitor_and_logger_settings_are_one_line_errors(argv, needle, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_a_missing_logger_package_names_the_extra(train_dataset, tmp_path, monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name)
    )
    with pytest.raises(ConfigError, match=r"wandb needs the package 'wandb'.*\.\[log\]"):
        train(small_config(train_dataset, tmp_path / "run", loggers=["wandb"]))
    argv = ["train", "--dataset", str(train_dataset), "--out", str(tmp_path / "r"), "--log",
            "tensorboard,wandb"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install -e ".[log]"' in err
    assert not (tmp_path / "r").exists()  # reported before anything ran


def test_monitor_on_ddp_and_fsdp2_processes_matches_one_process(train_dataset, tmp_path,
                                                               monkeypatch):  # fmt: skip
    from test_train_distributed import _spawn

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    common = dict(steps=4, grad_accum=2, eval_interval=4, warmup_steps=1, monitor_every=2,
                  optimizer="spectra-adamw")  # fmt: skip
    runs = [
        dataclasses.asdict(small_config(train_dataset, tmp_path / mode, parallel=mode, **common))
        for mode in ("ddp", "fsdp2")
    ]
    _spawn(runs, tmp_path)
    ref = small_config(train_dataset, tmp_path / "ref", batch_size=16, eval_batch_size=8, **common)
    train(ref)
    want = records(tmp_path / "ref", "monitor")
    for mode in ("ddp", "fsdp2"):
        got = records(tmp_path / mode, "monitor")  # rank 0's, written once
        assert [r["step"] for r in got] == [r["step"] for r in want] == [1, 3]
        for g, w in zip(got, want, strict=True):
            assert g.keys() == w.keys()
            for key in g:
                if key.endswith(("sigma_max", "weight_fro", "weight_linf", "step_bound")):
                    assert g[key] == pytest.approx(w[key], rel=2e-3, abs=1e-9), (mode, key)
