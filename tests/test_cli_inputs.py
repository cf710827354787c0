"""The command line on odd or bad input: ``--version``, empty configs, greedy sampling, bad
devices, damaged checkpoints, figure formats, progress bars, and the figures of ``compare``
and ``analyze norms``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from spectra_lab.cli import main
from spectra_lab.files import atomic_path, new_file_mode
from spectra_lab.model import Llama, ModelConfig
from spectra_lab.runs.checkpoint import checkpoint_path, read_checkpoint, write_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, seq_len=16)


@pytest.fixture
def run(tmp_path) -> Path:
    """A run directory with checkpoints at steps 1 and 2 of a tiny model (vocabulary 64)."""
    torch.manual_seed(0)
    state = {"model_config": CFG.to_dict(), "model": Llama(CFG).state_dict(),
             "dataset_dir": str(tmp_path / "data"), "step": 1}  # fmt: skip
    for step in (1, 2):
        write_checkpoint(checkpoint_path(tmp_path / "run", step), {**state, "step": step})
    return tmp_path / "run"


def one_line_error(capsys, code: int, command: str) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"spectra {command}: error: "), err
    return err


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"spectra {version('spectra-optim')}\n"


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n"], ids=["empty", "comment", "{}"])
def test_an_empty_config_file_is_refused_naming_it(tmp_path, capsys, text):
    path = tmp_path / "my.yaml"
    path.write_text(text)
    err = one_line_error(capsys, main(["train", "--config", str(path)]), "train")
    assert f"config file {path} is empty" in err
    err = one_line_error(capsys, main(["sweep", str(path), "--out", str(tmp_path / "s")]), "sweep")
    assert f"config file {path} is empty" in err


def test_an_unknown_tokenizer_is_the_tokenizer_fields_error(capsys):
    err = one_line_error(capsys, main(["train", "--tokenizer", "wordpiece"]), "train")
    assert "config field 'tokenizer' = 'wordpiece'" in err and "'bpe', 'gpt2', 'bytes'" in err


# --------------------------------------------------------------------------- sample


def test_temperature_zero_is_greedy_decoding(run, capsys, char_tokenizer):
    texts = []
    for seed in ("1", "2"):
        argv = ["sample", "--ckpt", str(run), "--prompt", "abc", "--tokens", "6",
                "--temperature", "0", "--seed", seed]  # fmt: skip
        assert main(argv) == 0
        texts.append(capsys.readouterr().out.rstrip("\n"))
    model = Llama(CFG)
    model.load_state_dict(read_checkpoint(checkpoint_path(run, 2))["model"])
    ids = [ord(c) - 48 for c in "abc"]
    with torch.no_grad():
        for _ in range(6):  # the argmax at every step, by hand
            ids.append(int(model(torch.tensor([ids]))[0][0, -1].argmax()))
    assert texts == ["".join(chr(48 + i) for i in ids)] * 2
    with pytest.raises(SystemExit):
        main(["sample", "--help"])
    assert "0: greedy decoding" in " ".join(capsys.readouterr().out.split())
    err = one_line_error(capsys, main(["sample", "--ckpt", str(run), "--temperature", "-1"]),
                         "sample")  # fmt: skip
    assert "--temperature (0: greedy decoding) must be a finite number >= 0" in err


@pytest.mark.parametrize(
    ("device", "needle"),
    [("tpu", "--device must be cpu, cuda or cuda:N, got 'tpu'"),
     ("cuda:99", "--device cuda:99: this machine has")],
)  # fmt: skip
def test_a_device_that_is_not_there_is_one_line(run, capsys, char_tokenizer, device, needle):
    code = main(["sample", "--ckpt", str(run), "--device", device])
    assert needle in one_line_error(capsys, code, "sample")


def test_a_damaged_checkpoint_gets_the_advice_of_the_command(run, tmp_path, capsys):
    latest = checkpoint_path(run, 2)
    data = bytearray(latest.read_bytes())
    data[100] ^= 0xFF
    latest.write_bytes(bytes(data))
    earlier = checkpoint_path(run, 1)
    err = one_line_error(capsys, main(["sample", "--ckpt", str(run)]), "sample")
    assert f"checksum mismatch; give another checkpoint of the run as --ckpt: {earlier}" in err
    err = one_line_error(capsys, main(["export", str(run), "--out", str(tmp_path / "hf")]),
                         "export")  # fmt: skip
    assert f"give another checkpoint of the run as RUN: {earlier}" in err and "resume" not in err
    err = one_line_error(capsys, main(["sample", "--ckpt", str(run / ".." / "nothing.pt")]),
                         "sample")  # fmt: skip
    assert "not found" in err
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    err = one_line_error(capsys, main(["sample", "--ckpt", str(tmp_path / "notes.txt")]),
                         "sample")  # fmt: skip
    assert "give --ckpt a run directory or one of its checkpoints" in err
    with pytest.raises(Exception, match="delete it to resume from an earlier one"):
        read_checkpoint(latest)  # what resuming says


def test_export_into_a_file_is_one_line(run, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code = main(["export", str(run), "--out", str(tmp_path / "file")])
    assert "is a file; give a folder" in one_line_error(capsys, code, "export")


def test_eval_refuses_an_unknown_device_before_loading_anything(run, capsys):
    code = main(["eval", str(run), "--device", "tpu"])
    assert "--device must be cpu, cuda or cuda:N" in one_line_error(capsys, code, "eval")


def test_atomic_files_get_the_mode_of_a_new_file_whatever_the_writer_gave(tmp_path):
    with atomic_path(tmp_path / "w.bin") as tmp:  # as safetensors writes: 0600
        os.close(os.open(tmp, os.O_CREAT | os.O_WRONLY, 0o600))
    with open(tmp_path / "plain", "w"):
        pass
    mode = (tmp_path / "w.bin").stat().st_mode & 0o777
    assert mode == new_file_mode() == (tmp_path / "plain").stat().st_mode & 0o777


# --------------------------------------------------------------------------- compare


def fake_run(path: Path, losses: list[float | str]) -> Path:
    """A run directory whose metrics.jsonl holds evaluation records of ``losses``."""
    path.mkdir(parents=True)
    records = [{"kind": "eval", "step": 10 * (i + 1), "val_loss": v} for i, v in enumerate(losses)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(
    ("diverged", "scale"),
    [([4.1, 3.9, 3.8], "linear"), ([9.0, 400.0, 900.0], "log"), ([6.0, "inf", "nan"], "linear")],
    ids=["both-fine", "one-diverged", "inf-and-nan"],
)
def test_compare_draws_a_diverged_run_on_a_log_axis(tmp_path, capsys, monkeypatch, diverged, scale):
    import spectra_lab.runs.compare as compare

    figures = []
    monkeypatch.setattr(compare, "save_figure", lambda fig, path, dpi: figures.append(fig))
    runs = [fake_run(tmp_path / "a", [5.0, 4.0, 3.5]), fake_run(tmp_path / "b", diverged)]
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "c.png")]) == 0
    (ax,) = figures[0].axes
    assert ax.get_yscale() == scale
    assert ("log scale" in ax.get_ylabel()) == (scale == "log")
    if diverged[-1] == "nan":
        assert "perplexity nan" in capsys.readouterr().out


def test_compare_refuses_a_figure_format_matplotlib_cannot_write(tmp_path, capsys):
    run = fake_run(tmp_path / "a", [5.0])
    code = main(["compare", str(run), "--out", str(tmp_path / "c.txt")])
    assert "matplotlib writes no .txt figure" in one_line_error(capsys, code, "compare")
    assert not (tmp_path / "c.txt").exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["compare", "{run}", "--out", "{folder}"], "is a folder; give the figure's file name"),
     (["analyze", "norms", "{run}", "--out", "{file}"], "is a file; give a folder"),
     (["mup", "coord-check", "--widths", "64", "--out", "{file}"], "is a file; give a folder")],
    ids=["compare", "analyze-norms", "mup"],
)  # fmt: skip
def test_an_out_that_is_the_wrong_kind_of_path_is_one_line(tmp_path, capsys, argv, needle):
    paths = {"run": fake_run(tmp_path / "a", [5.0]), "folder": tmp_path, "file": tmp_path / "f"}
    paths["file"].write_text("x")
    argv = [a.format(**paths) for a in argv]
    assert needle in one_line_error(capsys, main(argv), argv[0])


# --------------------------------------------------------------------------- progress bars


def test_sweep_no_progress_draws_no_bar(tmp_path, capsys, monkeypatch):
    import yaml

    import spectra_lab.sweep.cli as sweep_cli

    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"base": {"steps": 2}, "grid": {"lr": [1e-3, 2e-3]}}))
    monkeypatch.setattr(sweep_cli, "status", lambda run: "done")  # nothing left to train
    argv = ["sweep", str(grid), "--out", str(tmp_path / "out"), "--no-plot"]
    assert main(argv) == 0
    assert "sweep: 100%" in capsys.readouterr().err
    assert main([*argv, "--no-progress"]) == 0
    assert "sweep" not in capsys.readouterr().err


# --------------------------------------------------------------------------- norms.png


def test_norms_figure_renders_its_norms_with_labels_and_whole_steps():
    from spectra_lab.analyze.plots import norms_figure

    runs = [{"label": "a", "steps": [1, 11, 21], "sum_weight_linf": [1.0, 1.2, 1.3],
             "sum_weight_fro": [40.0, 47.0, 55.0]}]  # fmt: skip
    fig = norms_figure(runs)
    fig.canvas.draw()
    for ax in fig.axes:
        assert "_" not in ax.get_title()  # no literal subscripts
        assert ax.get_ylabel().startswith("$") and "\\|X\\|" in ax.get_ylabel()  # mathtext
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks)
    assert fig.axes[0].get_ylabel() == r"$\Sigma_X\, \|X\|_\infty$"
