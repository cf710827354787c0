"""What ``spectra train`` refuses before it builds or writes anything: a run directory that
cannot be written or that holds something else, a resume that would change what the run
keeps, and sizes that the dataset or the machine cannot hold. Each refusal is one line, and
nothing is left behind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from spectra_lab.cli import main
from spectra_lab.model import Llama, ModelConfig
from spectra_lab.runs.checkpoint import list_checkpoints
from spectra_lab.train import sizes
from spectra_lab.train.build import model_config_of
from spectra_lab.train.config import ConfigError, build_config, read_config_file
from spectra_lab.train.runtime import Runtime
from spectra_lab.train.schedule import build_lr_lambda
from spectra_lab.train.trainer import train

sys.path.insert(0, str(Path(__file__).parent))
from test_bench_plan import LiveTensors
from test_train import small_config, write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")

PAPER = Path(__file__).resolve().parents[1] / "configs" / "paper"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "markov")


@pytest.fixture(scope="module")
def finished(dataset, tmp_path_factory) -> Path:
    """A finished run of 6 steps (checkpoints at 5 and 6), trained by the command."""
    out = tmp_path_factory.mktemp("runs") / "run"
    assert main(argv(dataset, out)) == 0
    return out


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if the run gets as far as its dataset (anything after the checks)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the run went on past its checks")

    monkeypatch.setattr("spectra_lab.train.trainer.prepared_dataset", refuse)


def argv(dataset: Path, out: Path, *extra: str) -> list[str]:
    args = ["train", "--preset", "tiny", "--dataset", str(dataset), "--out", str(out)]
    args += ["--optimizer", "torch-adamw", "--steps", "6", "--no-progress", "--device", "cpu"]
    args += ["--set", "eval_batches=2", "--set", "seq_len=32", "--set", "checkpoint_interval=5"]
    return [*args, "--set", "warmup_steps=1", "--batch-size", "4", *extra]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def snapshot(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` with its modification time."""
    return {str(p): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


# ---------------------------------------------------------------------------------------
# resuming


@pytest.mark.parametrize(
    ("flags", "field", "old", "new"),
    [
        (["--preset", "cpu-small"], "preset", "'tiny'", "'cpu-small'"),
        (["--seed", "1"], "seed", "1337", "1"),
        (["--set", "seq_len=64"], "seq_len", "32", "64"),
    ],
)
def test_resume_with_another_model_seed_or_length_is_refused_before_anything_is_loaded(
    finished, capsys, nothing_built, flags, field, old, new
):
    before = snapshot(finished)
    assert main(["train", "--out", str(finished), "--resume", *flags]) == 2
    line = one_line(capsys)
    assert line.startswith(f"spectra train: error: config field '{field}' = {new} differs from ")
    assert f"differs from {old} in {finished / 'config.yaml'}, which a resumed run keeps" in line
    assert "or start a new run (another --out, or --overwrite)" in line
    assert snapshot(finished) == before


def test_resume_changing_several_fields_names_each_with_its_old_value(finished, capsys):
    flags = ["--seed", "2", "--lr", "1", "--preset", "cpu-small"]
    assert main(["train", "--out", str(finished), "--resume", *flags]) == 2
    line = one_line(capsys)
    for said in ("'seed' = 2 (was 1337)", "'lr' = 1.0 (was 0.002)", "'preset' = 'cpu-small' (was "):
        assert said in line
    assert "resume without changing them" in line


def test_without_config_yaml_the_checkpoint_config_is_compared_before_its_state_loads(
    dataset, tmp_path
):
    out = tmp_path / "run"
    train(small_config(dataset, out, steps=5))
    (out / "config.yaml").unlink()
    # a changed seed: the sampler's state would refuse it, after the model had been loaded
    with pytest.raises(ConfigError, match=r"'seed' = 1 differs from 1337 in the checkpoint "):
        train(small_config(dataset, out, steps=5, seed=1, resume=True))


def test_resume_with_fewer_steps_than_taken_is_refused(finished, capsys, nothing_built):
    before = snapshot(finished)
    assert main(["train", "--out", str(finished), "--resume", "--steps", "3"]) == 2
    line = one_line(capsys)
    assert "config field 'steps' = 3: the run in" in line and "has taken 6 steps" in line
    assert "give --steps 6 or more" in line
    assert snapshot(finished) == before  # summary.json still says step 6


def test_resume_where_there_is_nothing_to_resume(tmp_path, capsys, nothing_built):
    assert main(["train", "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert "--resume: " in one_line(capsys) and not (tmp_path / "none").exists()
    (tmp_path / "early").mkdir()  # a run stopped before its first checkpoint
    (tmp_path / "early" / "run.json").write_text("{}")
    assert main(["train", "--out", str(tmp_path / "early"), "--resume"]) == 2
    line = one_line(capsys)
    assert "has no checkpoint in" in line and "start the run without --resume" in line


def test_a_damaged_config_yaml_is_one_line(finished, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    for text in ("steps: [unclosed\n", "- a list\n"):
        (run / "config.yaml").write_text(text)
        assert main(["train", "--out", str(run), "--resume"]) == 2
        line = one_line(capsys)
        assert f"{run / 'config.yaml'} is damaged" in line and "delete it to resume" in line


# ---------------------------------------------------------------------------------------
# the run directory


def unwritable_places(tmp_path: Path) -> list[tuple[Path, str]]:
    (tmp_path / "file").write_text("x")
    places = [
        (tmp_path / "file", "is a file, not a directory"),
        (tmp_path / "file" / "sub", "is a file, so no directory can be made under it"),
    ]
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        places.append((locked / "run", "is not writable"))
    elif Path("/sys/kernel").is_dir():  # root writes anywhere but in the kernel's folders
        places.append((Path("/sys/kernel/spectra-run"), "is not writable"))
    return places


def test_an_out_that_cannot_be_written_is_one_line_before_anything_is_built(
    dataset, tmp_path, capsys, nothing_built
):
    for out, why in unwritable_places(tmp_path):
        before = snapshot(tmp_path)
        assert main(argv(dataset, out)) == 2
        line = one_line(capsys)
        assert line.startswith(f"spectra train: error: config field 'out_dir' = '{out}': ")
        assert why in line and line.endswith("give another --out")
        assert snapshot(tmp_path) == before  # the probe leaves nothing


def test_a_folder_that_holds_no_run_but_files_a_run_would_delete_is_refused(
    dataset, tmp_path, capsys, nothing_built
):
    folder = tmp_path / "project"
    (folder / "eval").mkdir(parents=True)
    (folder / "eval" / "code.py").write_text("keep me")
    (folder / "train.csv").write_text("mine")
    for extra in ([], ["--overwrite"]):
        assert main(argv(dataset, folder, *extra)) == 2
        line = one_line(capsys)
        assert "holds no run but holds train.csv, eval/, which a run there would delete" in line
    assert (folder / "eval" / "code.py").read_text() == "keep me"
    assert sorted(p.name for p in folder.iterdir()) == ["eval", "train.csv"]


def test_a_folder_of_ones_own_files_or_a_config_beside_the_run_still_works(dataset, tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    (folder / "config.yaml").write_text("eval_interval: 3\n")  # replaced by the resolved one
    assert main(argv(dataset, folder, "--config", str(folder / "config.yaml"))) == 0
    assert (folder / "notes.txt").read_text() == "mine"
    assert [s for s, _ in list_checkpoints(folder)] == [5, 6]
    assert "eval_interval: 3" in (folder / "config.yaml").read_text()


def test_a_path_from_a_file_or_set_that_starts_with_a_tilde_is_in_the_home_folder(tmp_path):
    cfg = build_config(("--set", {"out_dir": "~/runs/x", "data_dir": "~/cache"}))
    assert (cfg.out_dir, cfg.data_dir) == (str(Path.home() / "runs/x"), str(Path.home() / "cache"))
    assert build_config(("--set", {"dataset": "shakespeare"})).dataset == "shakespeare"


def test_an_empty_out_says_so(capsys):
    assert main(["train", "--out", ""]) == 2
    assert "expected a string, got an empty value ('')" in one_line(capsys)


# ---------------------------------------------------------------------------------------
# sizes


def test_a_sequence_longer_than_a_split_is_one_line_before_anything_is_written(
    dataset, tmp_path, capsys
):
    out = tmp_path / "run"
    assert main([*argv(dataset, out), "--set", "seq_len=5000"]) == 2  # val: 4096 tokens
    line = one_line(capsys)
    assert "config field 'seq_len' = 5000: in " in line
    assert "the val split holds 4,096 tokens, not one sequence of 5000 + 1" in line
    assert "give --set seq_len=4095 or less" in line
    assert not out.exists()


def test_a_batch_the_machine_cannot_hold_is_one_line_before_anything_is_written(
    dataset, tmp_path, capsys
):
    out = tmp_path / "run"
    assert main(argv(dataset, out, "--batch-size", "100000000")) == 2
    line = one_line(capsys)
    assert line.startswith("spectra train: error: config field 'batch_size' = 100000000: the run")
    assert "GB of host memory" in line and "GB is free; lower --batch-size" in line
    assert not out.exists()


def test_the_memory_check_counts_against_the_host_it_reports(dataset, tmp_path, monkeypatch):
    cfg = small_config(dataset, tmp_path / "run", steps=2, warmup_steps=1)
    monkeypatch.setattr(sizes, "host_memory", lambda: 10**6)  # 1 MB free
    with pytest.raises(ConfigError, match=r"needs about 0\.\d GB of host memory"):
        train(cfg)
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(sizes, "host_memory", lambda: None)  # unknown: no check
    assert train(cfg).step == 2


def paper_check(name: str, free_gpu: float, monkeypatch) -> None:
    """The memory check of a paper config on one (pretended) CUDA device with ``free_gpu`` GB."""
    path = PAPER / name
    cfg = build_config((str(path), read_config_file(path)))
    rt = Runtime(0, 1, torch.device("cuda", 0), torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (int(free_gpu * 1e9), 0))
    monkeypatch.setattr(sizes, "host_memory", lambda: 16 * 10**9)  # a small host
    model_cfg = model_config_of(cfg, 50257)
    sizes.check_memory(cfg, rt, model_cfg, build_lr_lambda(cfg), 10**6, 2)


def test_a_gpu_config_is_checked_against_its_gpu_not_the_host(monkeypatch):
    # 160M, micro-batch 32 x 512 under bf16: about 23 GB (spectra bench plan), more than the
    # host's 16 GB, which holds only the batches
    paper_check("160m-wsd-spectra-adamw.yaml", 79.0, monkeypatch)
    with pytest.raises(ConfigError, match=r"GB of cuda:0 memory .* and 16\.0 GB is free"):
        paper_check("160m-wsd-spectra-adamw.yaml", 16.0, monkeypatch)


@pytest.mark.parametrize("shape", [(512, 64, 2, 4, 64, 4), (4096, 192, 4, 6, 128, 2)])
def test_float32_activation_count_is_near_the_live_peak_of_a_cpu_step(shape):
    vocab, d, layers, heads, seq, batch = shape
    cfg = ModelConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, seq_len=seq)
    model = Llama(cfg)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    live = LiveTensors()
    with live:
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
    count = sum(sizes.float32_activation_bytes(cfg, batch).values())
    gradients = 4 * sum(p.numel() for p in model.parameters())
    assert 0.9 * live.peak <= count + gradients <= 1.25 * live.peak
