"""μP: the model's multipliers, the per-layer learning rates, the coordinate check and the CLI."""

from __future__ import annotations

import math

import pytest
import torch

from spectra_lab.cli import main
from spectra_lab.model import Llama, ModelConfig
from spectra_lab.train.build import model_config_of
from spectra_lab.train.config import ConfigError, TrainConfig
from spectra_lab.train.optimizers import build_optimizer, param_groups
from test_train import small_config, write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")


def test_mup_output_projection_init_shrinks_with_width():
    torch.manual_seed(0)
    L, base = 2, 64
    cfg = ModelConfig(vocab_size=128, d_model=256, n_layers=L, n_heads=4, seq_len=8,
                      mup_base_width=base)  # fmt: skip
    model = Llama(cfg)
    resid = 0.02 / math.sqrt(2 * L * 256 / base)
    for name, p in model.named_parameters():
        if p.ndim < 2:
            continue
        expected = resid if name.endswith(("attn.wo.weight", "mlp.w2.weight")) else 0.02
        assert p.std().item() == pytest.approx(expected, rel=0.02), name


def test_mup_base_width_that_does_not_fit_is_one_line():
    cfg = TrainConfig(preset="tiny", parametrization="mup", mup_base_width=2)  # tiny: 4 heads
    with pytest.raises(ConfigError, match=r"^config field 'mup_base_width' = 2: .*n_heads=4"):
        model_config_of(cfg, 100)
    with pytest.raises(ConfigError, match=r"^config field 'd_model' = 66: .*n_heads=4"):
        model_config_of(TrainConfig(preset="tiny", d_model=66), 100)
    # without μP the base width is not used, so it is not checked against the model
    assert model_config_of(TrainConfig(preset="tiny", mup_base_width=2), 100).mup_base_width is None


def test_mup_cli_error_comes_before_anything_runs(tmp_path, capsys):
    code = main(["train", "--preset", "tiny", "--out", str(tmp_path / "r"), "--dataset",
                 str(tmp_path / "nowhere"), "--set", "parametrization=mup",
                 "--set", "mup_base_width=3"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "mup_base_width" in err[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("scaling", [True, False])
def test_mup_learning_rates_per_group(scaling):
    cfg = TrainConfig(preset="tiny", d_model=256, parametrization="mup", mup_base_width=64,
                      lr=0.01, mup_lr_scaling=scaling, optimizer="spectra-adamw")  # fmt: skip
    model = Llama(model_config_of(cfg, 100))
    lrs = {g["group"]: g.get("lr") for g in param_groups(model, cfg)}
    hidden = 0.01 / 4 if scaling else None  # m = 256/64
    assert lrs == {"embed": None, "norm": None, "attn": hidden, "hidden": hidden, "head": None}
    opt = build_optimizer(model, cfg, lambda step: 1.0)
    got = {}
    for g in opt.param_groups:
        for p in g["params"]:
            got[id(p)] = g["lr"]
    for name, p in model.named_parameters():
        inner = name.startswith("layers.") and p.ndim == 2
        assert got[id(p)] == pytest.approx(0.0025 if inner and scaling else 0.01), name
    standard = TrainConfig(preset="tiny", lr=0.01)
    assert all("lr" not in g for g in param_groups(model, standard))


def test_coord_check_at_init_matches_the_closed_form(tmp_path):
    """Step 0 (before any update): the embedding RMS is init_std (× scale_emb under μP) at every
    width, and the logits' RMS grows like √d with the standard parametrization and shrinks like
    1/√d under μP (the readout is divided by m = d/d_base)."""
    from spectra_lab.mup.coord import coord_check, coord_figure, growth

    data = write_dataset(tmp_path / "data")
    base = small_config(data, tmp_path / "unused", optimizer="adamw", steps=2, warmup_steps=0,
                        schedule="constant", eval_batches=1, eval_interval=5,
                        checkpoint_interval=0, mup_base_width=32)  # fmt: skip
    widths = [32, 512]
    results = coord_check(base, widths, tmp_path / "coord", progress=False)
    std, mup = results["runs"]["standard"], results["runs"]["mup"]
    for w in widths:
        assert std[str(w)]["embedding"][0] == pytest.approx(0.02, rel=0.05)
        assert mup[str(w)]["embedding"][0] == pytest.approx(0.2, rel=0.05)
        assert len(mup[str(w)]["logits"]) == 2
    ratio = math.sqrt(512 / 32)
    lo, hi = str(widths[0]), str(widths[1])
    assert std[hi]["logits"][0] / std[lo]["logits"][0] == pytest.approx(ratio, rel=0.15)
    assert mup[hi]["logits"][0] / mup[lo]["logits"][0] == pytest.approx(1 / ratio, rel=0.15)
    g = growth(results)
    assert set(g) == {"standard", "mup"} and "block 1" in g["mup"]
    coord_figure(results)  # draws without error


def test_coord_check_help_shows_the_defaults_it_runs_with(capsys):
    from spectra_lab.cli import build_parser
    from spectra_lab.mup.cli import COORD_DEFAULTS, COORD_FIXED, coord_config

    with pytest.raises(SystemExit):
        main(["mup", "coord-check", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    argv = ["mup", "coord-check", "--out", "somewhere"]
    cfg = coord_config(build_parser(argv).parse_args(argv))
    for name, value in COORD_DEFAULTS.items():
        assert f"config field {name} (default {value})" in text
        assert getattr(cfg, name) == value  # what the check really trains with
    for name, value in COORD_FIXED.items():
        assert getattr(cfg, name) == value
    for name in ("schedule", "warmup_steps"):  # the fixed fields that have a flag
        assert f"the check runs with {name} = {COORD_FIXED[name]}" in text
    train_defaults = TrainConfig()
    for name in ("steps", "optimizer", "lr", "preset"):  # not the training defaults
        assert f"(default {getattr(train_defaults, name)})" not in text
    assert cfg.plot is False and cfg.checkpoint_interval == 0


@pytest.mark.parametrize("flag", [[], ["--no-progress"]], ids=["bar", "no-progress"])
def test_coord_check_draws_one_bar_and_none_with_no_progress(tmp_path, capsys, flag):
    data = write_dataset(tmp_path / "data", n_train=2000, n_val=600)
    argv = ["mup", "coord-check", "--widths", "32", "64", "--out", str(tmp_path / "cc"),
            "--dataset", str(data), "--steps", "1", "--batch-size", "2",
            "--set", "seq_len=16", "--set", "mup_base_width=32", *flag]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert ("coord-check: 100%" in err) == (not flag)
    assert "train:" not in err  # the runs draw none of their own
