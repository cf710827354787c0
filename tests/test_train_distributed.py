"""The trainer on several processes with FSDP2 (``parallel="fsdp2"``): 2 gloo processes on CPU.

* A sharded run takes the same steps as one process with the same global batch.
* Its checkpoints are DCP directories: an interrupted run resumed from one equals the
  uninterrupted run, a save killed before its rename leaves the last good checkpoint, and
  ``spectra sample`` reads them in one process.

The DDP counterpart is ``test_ddp_two_processes_match_one_process_with_the_global_batch`` in
``test_train.py``; the data and config helpers are that module's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spectra_lab.cli import main
from spectra_lab.runs.checkpoint import (
    TRAINER_FILE,
    CheckpointError,
    list_checkpoints,
    read_checkpoint,
)
from spectra_lab.runs.model import load_model
from spectra_lab.runs.records import read_jsonl
from spectra_lab.train.config import ConfigError
from spectra_lab.train.trainer import train
from test_train import small_config as _small_config
from test_train import write_dataset

WORLD = 2


def small_config(dataset: Path, out: Path, **kw):
    """test_train's config, with the exact clip for SPECTRA's optimizers: a sharded run then
    equals one process up to the summation order of its gradients and Gram matrices, which
    "mixed" (the default for float32 on CPUs with bf16 units) would carry into its bf16
    roundings; its Gram route against one process is tested in test_sharded.py."""
    if str(kw.get("optimizer", "")).startswith("spectra-"):
        extra = dict(kw.get("optimizer_kwargs") or {})
        kw["optimizer_kwargs"] = {"clip_method": "eigh", **extra}
    return _small_config(dataset, out, **kw)


@pytest.fixture(autouse=True)
def one_thread_no_stray_env(monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    yield
    torch.set_num_threads(threads)
    assert not dist.is_initialized()


@pytest.fixture(scope="module")
def train_dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "markov")


def fsdp_config(dataset: Path, out: Path, **kw) -> dict:
    """``small_config``'s fields for a short FSDP2 run (a dict: it crosses process borders)."""
    values = dict(steps=4, grad_accum=2, eval_interval=4, warmup_steps=1, parallel="fsdp2")
    values.update(kw)
    return dataclasses.asdict(small_config(dataset, out, **values))


def _spawn(runs: list[dict], tmp: Path, world: int = WORLD) -> None:
    mp.spawn(_worker, args=(runs, str(tmp), world), nprocs=world, join=True)


def _worker(rank: int, runs: list[dict], tmp: str, world: int = WORLD) -> None:
    """Train each config of ``runs`` in turn, each over its own process group; a run with
    ``stop_at`` is interrupted after that step, as a killed job would be."""
    from spectra_lab.train.config import TrainConfig

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    # DTensor's warnings about redistributions, kept for the tests to read
    logged = logging.FileHandler(Path(tmp) / f"redistribute_{rank}.log")
    logging.getLogger("torch.distributed.tensor._redistribute").addHandler(logged)
    for i, run in enumerate(runs):
        run = dict(run)
        stop_at = run.pop("stop_at", None)

        def interrupt(step, record, stop_at=stop_at):
            if step == stop_at:
                raise KeyboardInterrupt

        # train() finds the process group started and destroys it when it returns.
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp}/pg{i}", rank=rank, world_size=world
        )
        try:
            train(TrainConfig(**run), on_step=interrupt)
        except KeyboardInterrupt:
            assert stop_at is not None
        assert not dist.is_initialized()


def train_losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, **tol) -> None:
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(q, p, msg=name, **tol)


def test_fsdp2_two_processes_match_one_process_with_the_global_batch(train_dataset, tmp_path):
    optimizers = ("spectra-adamw", "spectra-signum")
    _spawn([fsdp_config(train_dataset, tmp_path / name, optimizer=name) for name in optimizers],
           tmp_path)  # fmt: skip
    for name in optimizers:
        out = tmp_path / name
        # a DCP directory per checkpoint: each rank's shards, DCP's index, the trainer's file
        ckpt = out / "ckpt" / "step_0000004"
        assert [p for _, p in list_checkpoints(out)] == [ckpt]
        assert {".metadata", "__0_0.distcp", "__1_0.distcp", TRAINER_FILE} <= {
            p.name for p in ckpt.iterdir()
        }
        state = read_checkpoint(ckpt)
        assert state["world_size"] == 2 and state["sharded"] == ["model", "optimizer"]
        assert "model" not in state and state["config"]["parallel"] == "fsdp2"
        rows = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
        assert rows[0]["tokens"] == 2 * 2 * 8 * 32 and np.isfinite(rows[0]["grad_norm"])

        # One process drawing the whole global batch (2 ranks x 8 sequences): the ranks'
        # reduce-scattered gradients average to its gradient, up to summation order.
        ref_cfg = small_config(
            train_dataset, tmp_path / f"ref-{name}", optimizer=name, steps=4, grad_accum=2,
            batch_size=16, eval_batch_size=8, eval_interval=4, warmup_steps=1,
        )  # fmt: skip
        ref = train(ref_cfg)
        np.testing.assert_allclose(train_losses(out), train_losses(Path(ref_cfg.out_dir)),
                                   rtol=1e-5)  # fmt: skip
        sharded, _ = load_model(out)  # the shards read whole, in this one process
        assert_same_weights(ref.model, sharded, rtol=1e-3, atol=1e-4)
        # evaluation of the sharded model (split across ranks) equals the whole model's
        val = [r["val_loss"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"]
        assert val[-1] == pytest.approx(ref.val_loss, rel=1e-4)


def test_fsdp2_interrupted_and_resumed_run_equals_uninterrupted(train_dataset, tmp_path):
    common = dict(steps=8, checkpoint_interval=3, eval_interval=4, optimizer="spectra-adamw")
    full = fsdp_config(train_dataset, tmp_path / "full", **common)
    cut = fsdp_config(train_dataset, tmp_path / "cut", **common)
    # eval batches are 5: rank 0 evaluates 3, rank 1 two (and one more forward)
    full["eval_batches"] = cut["eval_batches"] = 5
    resumed = {**cut, "resume": True}
    _spawn([full, {**cut, "stop_at": 7}, resumed], tmp_path)

    assert [s for s, _ in list_checkpoints(tmp_path / "cut")] == [3, 6, 8]
    a, b = train_losses(tmp_path / "full"), train_losses(tmp_path / "cut")
    assert len(a) == len(b) == 8
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    evals = [
        [r["val_loss"] for r in read_jsonl(tmp_path / run / "metrics.jsonl") if r["kind"] == "eval"]
        for run in ("full", "cut")
    ]
    np.testing.assert_allclose(evals[1], evals[0], rtol=0, atol=1e-6)
    assert_same_weights(load_model(tmp_path / "full")[0], load_model(tmp_path / "cut")[0],
                        rtol=0, atol=1e-6)  # fmt: skip


def test_fsdp2_killed_save_leaves_the_last_good_checkpoint(
    train_dataset, tmp_path, monkeypatch, capsys, char_tokenizer
):
    # One process: FSDP2 over a process group of one, the same checkpoint code.
    import spectra_lab.runs.checkpoint as checkpoint

    cfg = small_config(train_dataset, tmp_path / "run", steps=9, checkpoint_interval=3,
                       eval_interval=9, optimizer="spectra-adamw", parallel="fsdp2")  # fmt: skip
    train(dataclasses.replace(cfg, out_dir=str(tmp_path / "full")))

    rename = os.rename

    def killed_at_step_6(src, dst):  # the job dies once the shards are written
        if Path(dst).name == "step_0000006":
            raise KeyboardInterrupt
        rename(src, dst)

    monkeypatch.setattr(checkpoint.os, "rename", killed_at_step_6)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.setattr(checkpoint.os, "rename", rename)
    ckpt = tmp_path / "run" / "ckpt"
    left = [p.name for p in ckpt.iterdir() if p.name.startswith("step_0000006.tmp-")]
    assert len(left) == 1 and (ckpt / left[0] / ".metadata").is_file()
    (ckpt / "step_0000007").mkdir()  # a directory without DCP's index and the trainer's file
    (ckpt / "step_0000007" / "__0_0.distcp").write_bytes(b"partial")
    assert [s for s, _ in list_checkpoints(cfg.out_dir)] == [3]

    assert main(["train", "--out", cfg.out_dir, "--resume", "--no-progress"]) == 0
    assert "steps 3->9" in capsys.readouterr().out
    np.testing.assert_allclose(train_losses(tmp_path / "run"), train_losses(tmp_path / "full"),
                               rtol=0, atol=1e-6)  # fmt: skip
    full = load_model(tmp_path / "full")[0]
    assert_same_weights(full, load_model(cfg.out_dir)[0], rtol=0, atol=1e-6)
    # the next save deleted the killed one's directory
    assert not any(".tmp-" in p.name for p in ckpt.iterdir())
    assert [s for s, _ in list_checkpoints(cfg.out_dir)] == [3, 6, 9]

    # spectra sample reads a directory checkpoint, given itself or its run directory
    for where in (cfg.out_dir, str(ckpt / "step_0000006")):
        assert main(["sample", "--ckpt", where, "--prompt", "abc", "--tokens", "4"]) == 0
        assert len(capsys.readouterr().out.rstrip("\n")) == 7
    assert main(["sample", "--ckpt", str(ckpt / "step_0000007")]) == 2
    assert "incomplete" in capsys.readouterr().err

    # a checkpoint of the other layout is refused in one line
    with pytest.raises(
        CheckpointError, match="parallel=fsdp2, tp or 2d run; resume it with one of those"
    ):
        train(dataclasses.replace(cfg, steps=12, resume=True, parallel="ddp"))


def test_parallel_is_checked_before_anything_runs(capsys):
    with pytest.raises(ConfigError, match="parallel must be one of 'ddp', 'fsdp2'"):
        small_config(Path("nowhere"), Path("nowhere"), parallel="fsdp")
    assert main(["train", "--parallel", "zero3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config field 'parallel'" in err


def test_fsdp2_resumes_on_another_number_of_processes(train_dataset, tmp_path):
    """2 → 1 and 1 → 2 processes: DCP reshards the model and optimizer, the sampler's position
    in the global order is the same on every rank, and the global batch (16 sequences) is kept
    by global_batch_size, so the resumed run takes the uninterrupted run's steps."""
    common = dict(steps=6, checkpoint_interval=3, eval_interval=6, optimizer="spectra-adamw",
                  global_batch_size=16, grad_accum=1, batch_size=8)  # fmt: skip
    two_full = fsdp_config(train_dataset, tmp_path / "two-full", **common)
    two_cut = fsdp_config(train_dataset, tmp_path / "two-cut", **common)
    one_cut = fsdp_config(train_dataset, tmp_path / "one-cut", **common)
    # 2 processes: the uninterrupted run, a run stopped after step 4 (checkpoint at 3), and
    # the 1-process run's checkpoint resumed on 2
    from spectra_lab.train.config import TrainConfig

    train(TrainConfig(**{**one_cut, "out_dir": str(tmp_path / "one-full")}))
    with pytest.raises(KeyboardInterrupt):

        def interrupt(step, record):
            if step == 4:
                raise KeyboardInterrupt

        train(TrainConfig(**one_cut), on_step=interrupt)
    _spawn([two_full, {**two_cut, "stop_at": 4}, {**one_cut, "resume": True}], tmp_path)
    # ... and the 2-process checkpoint resumed on 1
    train(TrainConfig(**{**two_cut, "resume": True}))

    for cut, full in (("two-cut", "two-full"), ("one-cut", "one-full")):
        state = read_checkpoint(tmp_path / cut / "ckpt" / "step_0000006")
        assert state["world_size"] == (1 if cut == "two-cut" else 2)  # resumed elsewhere
        a, b = train_losses(tmp_path / full), train_losses(tmp_path / cut)
        assert len(a) == len(b) == 6
        # one process accumulates two micro-batches where two ranks reduce-scatter: the same
        # sequences, summed in another order
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-5)
        assert_same_weights(load_model(tmp_path / full)[0], load_model(tmp_path / cut)[0],
                            rtol=0, atol=1e-4)  # fmt: skip
    # without global_batch_size the global batch would change: refused in one line
    # (two-cut's last checkpoint was written by one process)
    plain = {**two_cut, "global_batch_size": None, "grad_accum": 2, "resume": True}
    with pytest.raises(CheckpointError, match="set global_batch_size = 16"):
        _spawn_one_error(plain, tmp_path)


def _spawn_one_error(run: dict, tmp: Path) -> None:
    """Resume ``run`` on 2 processes and re-raise the first rank's error here."""
    err = tmp / "error.txt"
    mp.spawn(_error_worker, args=(run, str(tmp), str(err)), nprocs=WORLD, join=True)
    if err.exists():
        raise CheckpointError(err.read_text())


def _error_worker(rank: int, run: dict, tmp: str, err: str) -> None:
    from spectra_lab.train.config import TrainConfig

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg-err", rank=rank, world_size=2)
    try:
        train(TrainConfig(**run))
    except CheckpointError as exc:
        if rank == 0:
            Path(err).write_text(str(exc))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize(("parallel", "world", "tp_size"), [("tp", 2, None), ("2d", 4, 2)])
def test_tensor_parallel_runs_match_one_process(train_dataset, tmp_path, parallel, world, tp_size):
    """``parallel="tp"`` (2 processes: every block's matrices split in two, one data-parallel
    group) and ``"2d"`` (a 2 × 2 mesh: TP within each row, FSDP2 across) take the steps of one
    process with the same global batch, and resume from their DCP checkpoints."""
    dp = world // (tp_size or world)
    run = fsdp_config(train_dataset, tmp_path / parallel, parallel=parallel, tp_size=tp_size,
                      steps=4, grad_accum=1, batch_size=8, checkpoint_interval=2,
                      optimizer="spectra-adamw")  # fmt: skip
    cut = {**run, "out_dir": str(tmp_path / "cut")}
    _spawn([run, {**cut, "stop_at": 3}, {**cut, "resume": True}], tmp_path, world)
    ref_cfg = small_config(train_dataset, tmp_path / "ref", optimizer="spectra-adamw", steps=4,
                           grad_accum=1, batch_size=8 * dp, eval_batch_size=8, eval_interval=4,
                           warmup_steps=1)  # fmt: skip
    ref = train(ref_cfg)
    out = tmp_path / parallel
    np.testing.assert_allclose(train_losses(out), train_losses(Path(ref_cfg.out_dir)), rtol=1e-5)
    assert_same_weights(ref.model, load_model(out)[0], rtol=1e-3, atol=1e-4)
    state = read_checkpoint(out / "ckpt" / "step_0000004")
    assert state["config"]["parallel"] == parallel and state["dp_size"] == dp
    # resumed from the checkpoint of step 2, the same steps
    np.testing.assert_allclose(train_losses(tmp_path / "cut"), train_losses(out), rtol=0, atol=1e-6)
    # no warning from DTensor (2-D: gathers one mesh dimension at a time, a flattened mesh)
    for rank in range(world):
        assert (tmp_path / f"redistribute_{rank}.log").read_text() == ""
