"""A run as a careful user meets it: interrupts, divergence, stale results, resumes with
changed settings, mistyped names, and the messages each of them gets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spectra_lab.cli import main
from spectra_lab.data import prepare
from spectra_lab.runs.checkpoint import CheckpointError, list_checkpoints, read_checkpoint
from spectra_lab.runs.layout import RUN_FILES, clear_run
from spectra_lab.train.config import ConfigError, TrainConfig, fixed_on_resume
from spectra_lab.train.signals import Interrupted
from spectra_lab.train.trainer import Diverged, train
from test_train import small_config, write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "markov")


def cli_argv(dataset: Path, out: Path, *extra: str) -> list[str]:
    argv = ["train", "--preset", "tiny", "--dataset", str(dataset), "--out", str(out)]
    argv += ["--optimizer", "torch-adamw", "--lr", "1e-2", "--steps", "12", "--no-progress"]
    argv += ["--set", "eval_interval=6", "--set", "eval_batches=2", "--set", "seq_len=32"]
    argv += ["--set", "warmup_steps=2", "--batch-size", "4", "--device", "cpu"]
    return argv + list(extra)


# ---------------------------------------------------------------------------------------
# interrupts


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_saves_a_checkpoint_at_the_next_step_and_resume_finishes(dataset, tmp_path, signum):
    cfg = small_config(dataset, tmp_path / "run", steps=20, checkpoint_interval=100)

    def send(step: int, record: dict) -> None:
        if step == 7:
            os.kill(os.getpid(), signum)  # handled between two Python bytecodes: now

    with pytest.raises(Interrupted) as caught:
        train(cfg, on_step=send)
    assert caught.value.step == 7 and caught.value.exit_code == 128 + signum
    assert signal.Signals(signum).name in str(caught.value) and "--resume" in str(caught.value)
    assert [step for step, _ in list_checkpoints(cfg.out_dir)] == [7]
    assert not (tmp_path / "run" / "summary.json").exists()  # not a finished run
    # the handlers are the previous ones again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    resumed = train(small_config(dataset, tmp_path / "run", steps=20, resume=True))
    whole = train(small_config(dataset, tmp_path / "whole", steps=20, checkpoint_interval=100))
    assert resumed.step == 20
    assert resumed.val_loss == pytest.approx(whole.val_loss, rel=1e-6)


def test_sigterm_to_the_command_is_one_line_with_exit_code_143(dataset, tmp_path):
    out = tmp_path / "run"
    argv = cli_argv(dataset, out, "--steps", "100000", "--set", "log_interval=1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = "import sys; from spectra_lab.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        for line in proc.stdout:  # the first logged step: the loop runs
            if line.startswith("step"):
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    errors = [ln for ln in err.splitlines() if "error" in ln]
    assert len(errors) == 1 and "SIGTERM: stopped after step" in errors[0], err
    assert "Traceback" not in err
    step = int(errors[0].split("after step ")[1].split(",")[0])
    assert [s for s, _ in list_checkpoints(out)] == [step]


# ---------------------------------------------------------------------------------------
# stale results


def test_overwrite_removes_the_old_runs_files_before_writing_anything(dataset, tmp_path):
    out = tmp_path / "run"
    train(small_config(dataset, out, steps=10, plot=True))
    (out / "eval").mkdir()
    (out / "eval" / "scores.csv").write_text("task,metric\n")
    (out / "notes.txt").write_text("mine")  # not a file of the run: kept
    assert (out / "summary.json").is_file() and (out / "loss.png").is_file()

    def crash(step: int, record: dict) -> None:
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        train(small_config(dataset, out, steps=10, overwrite=True), on_step=crash)
    assert list_checkpoints(out) == []
    for name in ("summary.json", "loss.png", "eval", "ckpt"):
        assert not (out / name).exists(), name
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "config.yaml").is_file()  # the new run's


def test_clear_run_deletes_summary_first(tmp_path):
    assert RUN_FILES[0] == "summary.json"
    for name in RUN_FILES:
        (tmp_path / name).write_text("x")
    (tmp_path / "ckpt").mkdir()
    assert clear_run(tmp_path)[0] == "summary.json"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------
# divergence


def test_a_finite_divergence_finishes_with_summary_and_figure(dataset, tmp_path):
    cfg = small_config(
        dataset, tmp_path / "run", steps=6, eval_interval=3, plot=True, lr=30.0, grad_clip=None,
        warmup_steps=0,
    )  # fmt: skip
    result = train(cfg)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["val_loss"] == pytest.approx(result.val_loss)
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000


#: The one line of ``--lr 1e9`` without gradient clipping: the loss of torch's AdamW turns
#: inf or nan; a spectra optimizer stops at the step whose gradient does, in its own words, to
#: which the line adds the command's advice once (skipping steps cannot save a nan loss).
DIVERGED = {
    "torch-adamw": r"the loss is (nan|inf) at step \d+; try a lower lr \(now 1e\+09; --lr\) "
    r"or gradient clipping \(--set grad_clip=0\.5\)",
    "spectra-adamw": re.escape(
        "AdamW.step() at step 2: a gradient contains inf or nan; no parameter was changed, but "
        "the optimizer state was updated with it; try a lower lr (now 1e+09; --lr), gradient "
        "clipping (--set grad_clip=0.5) or skipping such steps "
        "(--set optimizer_kwargs={nonfinite: skip})"
    ),
}


@pytest.mark.parametrize("optimizer", list(DIVERGED))
def test_a_nonfinite_run_ends_in_one_line_naming_the_step(dataset, tmp_path, capsys, optimizer):
    argv = cli_argv(dataset, tmp_path / "run", "--lr", "1e9", "--optimizer", optimizer)
    assert main([*argv, "--set", "grad_clip=null"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    expected = "spectra train: error: the run diverged: " + DIVERGED[optimizer]
    assert re.fullmatch(expected, err[0]), err[0]
    assert err[0].count("nonfinite") <= 1


def test_diverged_is_raised_by_train(dataset, tmp_path):
    cfg = small_config(dataset, tmp_path / "run", lr=1e9, grad_clip=None, warmup_steps=0)
    with pytest.raises(Diverged, match=r"the loss is (nan|inf) at step \d+"):
        train(cfg)


# ---------------------------------------------------------------------------------------
# resuming with other settings


def test_resume_refuses_a_changed_lr_in_one_line(dataset, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(cli_argv(dataset, out)) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--lr", "1e9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config field 'lr' = 1000000000.0 differs from 0.01" in err[0]
    # what a resumed run may change: it runs longer
    assert main(["train", "--out", str(out), "--resume", "--steps", "14", "--no-progress"]) == 0


def test_fields_fixed_on_resume_are_those_the_checkpoint_holds():
    fixed = set(fixed_on_resume())
    assert {"lr", "weight_decay", "optimizer", "optimizer_kwargs", "seed", "preset"} <= fixed
    assert {"clip_c", "batch_size", "dataset"} <= fixed
    assert not fixed & {"steps", "out_dir", "eval_interval", "device", "loggers", "resume"}


# ---------------------------------------------------------------------------------------
# parsing and names


def test_a_negative_lr_after_a_space_is_a_value(dataset, tmp_path, capsys):
    assert main(cli_argv(dataset, tmp_path / "run", "--lr", "-1e-3")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config field 'lr' = -0.001" in err[0], err


def test_mistyped_optimizer_gets_did_you_mean(capsys):
    assert main(["train", "--optimizer", "spectra_adamw"]) == 2
    assert "(did you mean 'spectra-adamw'?)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"did you mean 'cosine'"):
        TrainConfig(schedule="cosin")
    with pytest.raises(ConfigError, match=r"did you mean 'hidden'"):
        TrainConfig(clip_groups=["hiden"])


def test_config_folder_is_named_as_a_folder(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("steps: 3\n")
    assert main(["train", "--config", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a folder (it holds 1 config files: a.yaml); give one file of it" in err


def test_run_json_autocast_is_null_on_cpu(dataset, tmp_path):
    train(small_config(dataset, tmp_path / "run", steps=4, warmup_steps=1))
    about = json.loads((tmp_path / "run" / "run.json").read_text())
    assert about["autocast"] is None
    # the machine-dependent method behind clip_method "auto", for reading results later
    import torch

    from spectra.ops import soft_clip_method

    assert about["soft_clip_auto"] == soft_clip_method("auto", torch.device("cpu"))
    # and the machine its figures came from: the CPU's model and bf16 support, the threads, the
    # commit (the same record every benchmark's report carries)
    from spectra_lab.machine import cpu_bf16, cpu_model, source_commit

    machine = about["machine"]
    assert (machine["gpu"], machine["cpu"], machine["cpu_bf16"]) == (None, cpu_model(), cpu_bf16())
    assert machine["threads"] == torch.get_num_threads() and machine["commit"] == source_commit()


def test_a_bit_flipped_checkpoint_says_what_to_do(dataset, tmp_path):
    train(small_config(dataset, tmp_path / "run", steps=5))
    _, path = list_checkpoints(tmp_path / "run")[-1]
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch; delete it to resume from an"):
        read_checkpoint(path)


# ---------------------------------------------------------------------------------------
# progress


def test_preparing_a_corpus_says_what_it_does(tmp_path, capsys):
    text = tmp_path / "corpus.jsonl"
    docs = [{"text": f"document {i} " + "word " * 50} for i in range(40)]
    text.write_text("".join(json.dumps(d) + "\n" for d in docs))
    prepare("text", tmp_path / "ds", tokenizer="bpe", vocab_size=300, input=[text], progress=True)
    err = capsys.readouterr().err
    assert "prepare-data: training the bpe tokenizer on" in err


# ---------------------------------------------------------------------------------------
# several processes


def test_a_failure_in_several_processes_is_one_line(dataset, tmp_path):
    out = tmp_path / "run"
    assert main(cli_argv(dataset, out, "--steps", "2", "--set", "warmup_steps=1")) == 0
    argv = cli_argv(dataset, out, "--steps", "2", "--nproc-per-node", "2")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "spectra_lab", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == [
        f"spectra train: error: {out} already holds a run (checkpoint at step 2); "
        "use --resume to continue it or --overwrite to start over"
    ], proc.stderr


def test_sweep_workers_label_their_lines():
    from spectra_lab.sweep.cli import Labelled

    class Sink:
        def __init__(self) -> None:
            self.text = ""

        def write(self, s: str) -> None:
            self.text += s

        def flush(self) -> None:
            pass

    sink = Sink()
    stream = Labelled(sink, "[lr=1e-3] ")
    stream.write("step 1 | loss 3.0\nstep 2")
    stream.write(" | loss 2.9\n")
    stream.write("tail")
    stream.flush()
    assert sink.text == "[lr=1e-3] step 1 | loss 3.0\n[lr=1e-3] step 2 | loss 2.9\n[lr=1e-3] tail"


def test_the_progress_bar_moves_once_per_report(tmp_path):
    """Ten steps reported together move the bar by ten in one update, so that its rate (and
    time left) is that of the ten steps, not of the last one alone."""
    import torch

    from spectra_lab.train.metrics import RunLog
    from spectra_lab.train.trainer import Pending, report

    class Rank0:
        is_main, world_size, device = True, 1, "cpu"

    cfg = TrainConfig(out_dir=str(tmp_path), steps=20, progress=True)
    about = {"parameters": 10, "tokens_per_step": 5}
    with RunLog(tmp_path, cfg, Rank0(), 0, about) as log:
        moves: list[int] = []
        log.bar.update = moves.append
        pending = [
            Pending(
                {"step": s, "tokens": 5 * s, "loss": torch.tensor(2.0), "lr": 1e-3,
                 "grad_norm": torch.tensor(1.0), "tokens_per_s": 100.0},
                {},
            )
            for s in range(1, 11)
        ]  # fmt: skip
        report(pending, log, None, cfg)
    assert moves == [10] and pending == []
