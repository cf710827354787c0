"""Tests of the trainer, its checkpoints, its config loading and the train/sample CLI.

The training data is a synthetic token
stream with a learnable structure, written in the prepared-dataset format
(``train.bin``/``val.bin`` of uint16 tokens plus ``meta.json``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from spectra_lab.cli import main
from spectra_lab.runs.checkpoint import CheckpointError, list_checkpoints, read_checkpoint
from spectra_lab.runs.records import read_jsonl
from spectra_lab.train.config import (
    ConfigError,
    TrainConfig,
    build_config,
    parse_set,
    read_config_file,
)
from spectra_lab.train.optimizers import (
    OPTIMIZERS,
    build_optimizer,
    check_optimizer,
    param_groups,
    spectral_groups,
)
from spectra_lab.train.schedule import build_lr_lambda
from spectra_lab.train.trainer import train

VOCAB = 64


pytestmark = pytest.mark.usefixtures("one_thread")


def write_dataset(folder: Path, n_train: int = 20000, n_val: int = 4096) -> Path:
    """A token stream where each token is a fixed function of the last one 90% of the time."""
    rng = np.random.default_rng(0)
    table = rng.permutation(VOCAB)

    def stream(n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.uint16)
        out[0] = 0
        noise = rng.random(n) < 0.1
        rand = rng.integers(0, VOCAB, n)
        for i in range(1, n):
            out[i] = rand[i] if noise[i] else table[out[i - 1]]
        return out

    folder.mkdir(parents=True, exist_ok=True)
    stream(n_train).tofile(folder / "train.bin")
    stream(n_val).tofile(folder / "val.bin")
    meta = {"vocab_size": VOCAB, "dtype": "uint16", "tokenizer": "test"}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.fixture(scope="module")
def train_dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "markov")


def small_config(dataset: Path, out: Path, **kw) -> TrainConfig:
    values = dict(
        dataset=str(dataset),
        out_dir=str(out),
        preset="tiny",
        seq_len=32,
        optimizer="torch-adamw",
        lr=1e-2,
        steps=20,
        warmup_steps=4,
        batch_size=8,
        eval_interval=10,
        eval_batches=4,
        checkpoint_interval=5,
        keep_checkpoints=0,
        progress=False,
        plot=False,
        device="cpu",
    )
    values.update(kw)
    return TrainConfig(**values)


# ---------------------------------------------------------------------------------------
# training


def test_cli_short_run_loss_falls_and_writes_metrics(train_dataset, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--preset", "tiny", "--dataset", str(train_dataset), "--steps", "30"]
    argv += ["--out", str(out), "--optimizer", "torch-adamw", "--lr", "1e-2", "--no-progress"]
    argv += ["--set", "eval_interval=10", "--set", "eval_batches=4", "--set", "seq_len=32"]
    argv += ["--set", "warmup_steps=5", "--batch-size", "8", "--device", "cpu"]
    assert main(argv) == 0
    final = capsys.readouterr().out.strip().splitlines()[-1]
    assert final.startswith("final validation loss")

    train_rows = read_jsonl(out / "metrics.jsonl")
    steps = [r for r in train_rows if r["kind"] == "train"]
    evals = [r for r in train_rows if r["kind"] == "eval"]
    assert [r["step"] for r in steps] == list(range(1, 31))
    assert [r["step"] for r in evals] == [10, 20, 30]
    first = steps[0]["loss"]
    last = np.mean([r["loss"] for r in steps[-5:]])
    assert abs(first - math.log(VOCAB)) < 0.3  # starts near the uniform-prediction loss
    assert last < first - 1.5, (first, last)
    for r in steps:
        phases = r["t_data"] + r["t_forward"] + r["t_backward"] + r["t_grad_clip"]
        assert phases + r["t_optimizer"] <= r["t_step"] + 1e-9
        assert r["tokens"] == r["step"] * 8 * 32

    # CSV files carry the same numbers as the JSONL file.
    import csv

    with (out / "train.csv").open() as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == 30
    assert float(csv_rows[-1]["loss"]) == pytest.approx(steps[-1]["loss"], rel=1e-12)
    with (out / "eval.csv").open() as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [10, 20, 30]
    assert (out / "loss.png").stat().st_size > 1000
    assert yaml.safe_load((out / "config.yaml").read_text())["steps"] == 30

    # The reported validation loss equals an independent recomputation from the checkpoint.
    summary = json.loads((out / "summary.json").read_text())
    from spectra_lab.data import TokenDataset, iter_eval_batches
    from spectra_lab.runs.model import load_model

    model, _ = load_model(out)
    val = TokenDataset(train_dataset / "val.bin", 32)
    with torch.no_grad():
        batches = list(iter_eval_batches(val, 8, max_batches=4))
        losses = [model(x, y)[1].item() * len(x) for x, y in batches]
    mean = sum(losses) / sum(len(x) for x, _ in batches)
    assert summary["val_loss"] == pytest.approx(mean, rel=1e-6)
    assert summary["val_ppl"] == pytest.approx(math.exp(mean), rel=1e-6)
    assert evals[-1]["val_loss"] == pytest.approx(summary["val_loss"], rel=1e-12)
    assert f"{summary['val_loss']:.4f}" in final


@pytest.mark.parametrize(
    ("optimizer", "extra"),
    [
        ("torch-adamw", {}),
        ("spectra-adamw", {}),
        ("spectra-adamw", {"pre_clip_kappa": 0.5, "pre_clip_beta": 0.9}),
    ],
)
def test_interrupted_and_resumed_run_equals_uninterrupted(
    train_dataset, tmp_path, optimizer, extra
):
    # spectra-adamw: the main job's optimizer, clipping with the "standard" schedule; and with
    # an adaptive pre-clip, whose running scales are optimizer state
    full = train(
        small_config(train_dataset, tmp_path / "full", grad_accum=2, optimizer=optimizer, **extra)
    )

    def interrupt(step, record):
        if step == 13:
            raise KeyboardInterrupt

    cfg = small_config(train_dataset, tmp_path / "cut", grad_accum=2, optimizer=optimizer, **extra)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, on_step=interrupt)
    assert [s for s, _ in list_checkpoints(cfg.out_dir)] == [5, 10]
    # Resume through the CLI: the saved config.yaml is the base, flags apply on top.
    assert main(["train", "--out", cfg.out_dir, "--resume"]) == 0
    from spectra_lab.runs.model import load_model

    resumed_model, _ = load_model(cfg.out_dir)
    resumed_val = json.loads((Path(cfg.out_dir) / "summary.json").read_text())["val_loss"]

    def losses(run: str) -> list[float]:
        rows = read_jsonl(Path(run) / "metrics.jsonl")
        return [r["loss"] for r in rows if r["kind"] == "train"]

    a, b = losses(tmp_path / "full"), losses(cfg.out_dir)
    assert len(a) == len(b) == 20
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert resumed_val == pytest.approx(full.val_loss, abs=1e-6)
    for (name, p), q in zip(
        full.model.state_dict().items(), resumed_model.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-6, msg=name)
    # Optimizer state survived the round trip too: identical Adam moments at the end.
    sa = read_checkpoint(tmp_path / "full" / "ckpt" / "step_0000020.pt")["optimizer"]["state"]
    sb = read_checkpoint(Path(cfg.out_dir) / "ckpt" / "step_0000020.pt")["optimizer"]["state"]
    for i in sa:
        torch.testing.assert_close(sb[i]["exp_avg_sq"], sa[i]["exp_avg_sq"], rtol=0, atol=1e-9)
    scales = [s["pre_clip_ema"] for s in sa.values() if "pre_clip_ema" in s]
    assert len(scales) == (14 if extra else 0)  # the tiny model's clipped matrices
    for i in sa:
        if "pre_clip_ema" in sa[i]:
            assert sb[i]["pre_clip_ema"] == pytest.approx(sa[i]["pre_clip_ema"], rel=1e-6)


def test_a_capturable_run_trains_and_resumes_as_the_run_that_reads(train_dataset, tmp_path):
    # the same job with the step that reads nothing on the host (its lr a tensor on the
    # device), cut after step 8 and resumed, against the default step: only the clip's
    # schedule differs (the longest one, against the one read)
    def losses(run: Path) -> list[float]:
        return [r["loss"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]

    common = dict(
        optimizer="spectra-adamw", clip_schedule="constant", steps=12, checkpoint_interval=4
    )
    reads = small_config(train_dataset, tmp_path / "reads", **common)
    kwargs = {"clip_method": "polar"}
    train(dataclasses.replace(reads, optimizer_kwargs=kwargs))
    cfg = small_config(
        train_dataset, tmp_path / "cap", optimizer_kwargs={**kwargs, "capturable": True}, **common
    )

    def interrupt(step, record):
        assert isinstance(record["lr"], float)  # read with the loss
        if step == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, on_step=interrupt)
    assert main(["train", "--out", cfg.out_dir, "--resume"]) == 0
    a, b = losses(tmp_path / "reads"), losses(Path(cfg.out_dir))
    assert len(a) == len(b) == 12
    # 1e-6 apart per clip, which twelve steps at lr 1e-2 grow to 8e-5 in the loss (measured)
    np.testing.assert_allclose(b, a, rtol=0, atol=2e-4)
    lrs = [r["lr"] for r in read_jsonl(Path(cfg.out_dir) / "metrics.jsonl") if r["kind"] == "train"]
    ref = [
        r["lr"] for r in read_jsonl(tmp_path / "reads" / "metrics.jsonl") if r["kind"] == "train"
    ]
    np.testing.assert_allclose(lrs, ref, rtol=1e-6)


def test_resume_with_more_steps_follows_the_extended_schedule(train_dataset, tmp_path):
    cfg = small_config(train_dataset, tmp_path / "run", steps=10, checkpoint_interval=0)
    train(cfg)
    # WSD over 10 steps ended at lr 0; extended to 20 steps, step 11 is in the stable phase.
    train(dataclasses.replace(cfg, steps=20, resume=True))
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert rows[9]["lr"] < cfg.lr  # last step of the first run: decaying
    assert rows[10]["lr"] == pytest.approx(cfg.lr)  # k = 10 of 20: stable
    assert rows[-1]["lr"] < cfg.lr
    # After the resume every lr is the new schedule's, lr * S_lr(k) for the 20-step run.
    extended = build_lr_lambda(dataclasses.replace(cfg, steps=20))
    want = [cfg.lr * extended(k) for k in range(10, 20)]
    assert [r["lr"] for r in rows[10:]] == pytest.approx(want, rel=1e-12)
    # The scheduler's checkpointed state is its step alone; the schedule is the config's.
    ckpt = read_checkpoint(tmp_path / "run" / "ckpt" / "step_0000020.pt")
    assert ckpt["lr_scheduler"] == {"step": 20}


def test_truncated_or_corrupt_checkpoint_is_reported(train_dataset, tmp_path, capsys):
    cfg = small_config(train_dataset, tmp_path / "run", steps=5, eval_interval=5)
    train(cfg)
    ckpt = Path(cfg.out_dir) / "ckpt" / "step_0000005.pt"
    data = ckpt.read_bytes()
    with pytest.raises(CheckpointError, match="already holds a run"):
        train(cfg)  # a fresh run never mixes with an old run's checkpoints

    ckpt.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        read_checkpoint(ckpt)
    code = main(["train", "--out", cfg.out_dir, "--resume", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "truncated" in err and str(ckpt) in err

    corrupt = bytearray(data)
    corrupt[100] ^= 0xFF
    ckpt.write_bytes(bytes(corrupt))
    with pytest.raises(CheckpointError, match="checksum"):
        read_checkpoint(ckpt)


def test_sample_cli_generates_from_run_dir(train_dataset, tmp_path, capsys, char_tokenizer):
    cfg = small_config(train_dataset, tmp_path / "run", steps=3, eval_interval=3, warmup_steps=1)
    train(cfg)

    capsys.readouterr()
    argv = ["sample", "--ckpt", cfg.out_dir, "--prompt", "abc", "--tokens", "7", "--top-k", "5"]
    assert main(argv) == 0
    text = capsys.readouterr().out.rstrip("\n")
    assert text.startswith("abc") and len(text) == 10
    assert main(["sample", "--ckpt", str(tmp_path / "nowhere")]) == 2
    assert "not found" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--set", "lerning_rate=1"], "unknown config field 'lerning_rate'"),
        (["--steps", "ten"], "config field 'steps'"),
        (["--set", "clip_groups=hidden,bogus"], "clip_groups"),
        (["--optimizer", "adam9"], "config field 'optimizer'"),
        (["--set", "lr"], "--set expects key=value"),
        (["--lr", "-1"], "config field 'lr'"),
        (["--steps", "10", "--warmup-steps", "10"], "overlaps the decay phase"),
    ],
)
def test_bad_config_is_one_line_error(argv, needle, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("spectra train: error:") and needle in err, err


def test_config_files_yaml_and_toml_with_overrides(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text(
        "lr: 3e-4\nsteps: 70\nclip_groups: [hidden]\ngrad_clip: null\n"
    )
    (tmp_path / "a.toml").write_text('lr = 3e-4\nsteps = 70\nclip_groups = ["hidden"]\n')
    for name in ("a.yaml", "a.toml"):
        values = read_config_file(tmp_path / name)
        cfg = build_config((name, values), ("--set", {"steps": "90"}))
        assert (cfg.lr, cfg.steps, cfg.clip_groups) == (3e-4, 90, ["hidden"])
    assert build_config(("a.yaml", read_config_file(tmp_path / "a.yaml"))).grad_clip is None
    (tmp_path / "bad.yaml").write_text("lr: fast\n")
    assert main(["train", "--config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'lr'" in err and "bad.yaml" in err
    with pytest.raises(ConfigError, match="did you mean 'lr'"):
        build_config(("x", {"lrr": 1}))


def test_default_config_is_the_papers_recipe():
    cfg = TrainConfig()
    assert (cfg.optimizer, cfg.preset, cfg.dataset, cfg.tokenizer) == (
        "spectra-adamw",
        "cpu-small",
        "shakespeare",
        "bpe",
    )
    assert (cfg.weight_decay, cfg.grad_clip, cfg.clip_c, cfg.clip_schedule) == (
        0.1,
        0.5,
        10.0,
        "standard",
    )
    assert cfg.schedule == "wsd" and cfg.clip_groups == ["hidden", "attn"]
    assert set(OPTIMIZERS) >= {
        "adamw", "spectra-adamw", "signum", "spectra-signum", "ademamix", "spectra-ademamix",
        "mars", "spectra-mars", "sgdm", "spectra-sgdm", "adamw-post-orth", "dmuon", "soap",
        "torch-adamw",
    }  # fmt: skip


def test_param_groups_decay_and_clip_only_hidden_and_attention_matrices():
    from spectra_lab.model import Llama, model_config

    model = Llama(model_config("tiny", VOCAB, seq_len=32))
    groups = {g["group"]: g for g in param_groups(model, TrainConfig())}
    names = {id(p): n for n, p in model.named_parameters()}
    assert sum(len(g["params"]) for g in groups.values()) == len(names)
    for group, g in groups.items():
        matrix = group in ("hidden", "attn")
        assert g["weight_decay"] == (0.1 if matrix else 0.0)
        assert g["spectral_clip"] == matrix
        for p in g["params"]:
            n = names[id(p)]
            if group == "attn":
                assert ".attn." in n and p.ndim == 2
            if group == "hidden":
                assert ".mlp." in n and p.ndim == 2
            if group == "norm":
                assert p.ndim == 1
    assert "tok_embeddings.weight" in [names[id(p)] for p in groups["embed"]["params"]]
    assert [names[id(p)] for p in groups["head"]["params"]] == ["lm_head.weight"]


def test_spectral_groups_carry_the_clip_settings_of_clipped_groups_only():
    from spectra_lab.model import Llama, model_config

    model = Llama(model_config("tiny", VOCAB, seq_len=32))
    cfg = TrainConfig(
        steps=100, warmup_steps=10, clip_c=5.0, pre_clip_c=10.0, pre_clip_schedule="cosine"
    )
    lr_lambda = build_lr_lambda(cfg)
    groups = param_groups(model, cfg)
    for g in spectral_groups(groups, cfg, lr_lambda):
        if g["group"] in ("hidden", "attn"):
            assert (g["clip_c"], g["clip_scale"], g["pre_clip_c"]) == (5.0, "auto", 10.0)
            assert "warmup_steps" not in g and "peak_lr" not in g
            # "standard": c_k = c / S_lr(k) during warmup, over the run's own LR schedule
            sched = g["clip_schedule"]
            assert [sched(k) for k in (0, 9, 10, 99)] == pytest.approx([10.0, 10 / 10, 1.0, 1.0])
            assert sched(4) == pytest.approx(1 / lr_lambda(4))
            # cosine from 10 to the default 10/1000 = 0.01 over the run (the paper's ablation)
            pre = g["pre_clip_schedule"]
            assert (pre(0), pre(50), pre(100)) == pytest.approx((1.0, 0.5 + 0.5e-3, 1e-3))
        else:
            assert g["clip_c"] is None and g["pre_clip_c"] is None
    # the plain base optimizers post-clip nothing; with pre_clip_c they pre-clip the clipped
    # groups (the paper's "X with pre-clipping")
    plain = spectral_groups(groups, cfg, lr_lambda, clip=False)
    assert all(g["clip_c"] is None for g in plain)
    for g in plain:
        expected = 10.0 if g["group"] in ("hidden", "attn") else None
        assert g["pre_clip_c"] == expected, g["group"]
    for name in ("soap", "torch-adamw"):  # no pre-clipping there: one line
        with pytest.raises(ConfigError, match=f"'pre_clip_c' = 10.0: {name} does not pre-clip"):
            check_optimizer(dataclasses.replace(cfg, optimizer=name))
    # the optimizer reports the threshold of the step about to be taken: c / S_lr(0)
    opt = build_optimizer(model, cfg, lr_lambda)
    assert opt.clip_threshold() == pytest.approx(5.0 / lr_lambda(0))
    with pytest.raises(ValueError, match="pre_clip_c_final"):
        TrainConfig(pre_clip_c=1.0, pre_clip_c_final=2.0)
    # the adaptive pre-clip: its settings reach the clipped groups; one-line errors
    adaptive = dataclasses.replace(
        cfg, pre_clip_c=None, pre_clip_schedule="constant", pre_clip_kappa=2.0, pre_clip_beta=0.9
    )
    for g in spectral_groups(groups, adaptive, lr_lambda):
        on = g["group"] in ("hidden", "attn")
        assert g.get("pre_clip_kappa") == (2.0 if on else None), g["group"]
        assert g.get("pre_clip_beta", 0.9) == 0.9
    with pytest.raises(ConfigError, match=r"'pre_clip_kappa' = 2\.0: soap does not pre-clip"):
        check_optimizer(dataclasses.replace(adaptive, optimizer="soap"))
    with pytest.raises(ValueError, match=r"'pre_clip_kappa' = 2\.0: cannot be combined"):
        TrainConfig(pre_clip_c=1.0, pre_clip_kappa=2.0)
    with pytest.raises(ValueError, match=r"'pre_clip_beta' = 1\.0"):
        TrainConfig(pre_clip_kappa=2.0, pre_clip_beta=1.0)


def test_registry_defaults_are_the_papers_settings_and_optimizer_kwargs_override_them():
    from spectra_lab.model import Llama, model_config

    model = Llama(model_config("tiny", VOCAB, seq_len=32))
    cfg = TrainConfig(steps=100)
    want = {
        "adamw": {"betas": (0.9, 0.999), "eps": 1e-8},
        "ademamix": {"betas": (0.9, 0.999, 0.999), "alpha": 8.0, "eps": 1e-8},
        "signum": {"momentum": 0.95, "nesterov": True},
        "sgdm": {"momentum": 0.95},
        "dmuon": {"momentum": 0.95, "nesterov": True},
        "soap": {"betas": (0.9, 0.999), "eps": 1e-8},
        "torch-adamw": {"betas": (0.9, 0.999), "eps": 1e-8},
    }
    for name, settings in want.items():
        opt = build_optimizer(model, dataclasses.replace(cfg, optimizer=name), build_lr_lambda(cfg))
        for key, value in settings.items():
            assert opt.param_groups[0][key] == value, (name, key)
    orth = dataclasses.replace(cfg, optimizer="adamw-post-orth")
    post = build_optimizer(model, orth, build_lr_lambda(cfg))
    assert {g["post"] for g in post.param_groups if g["clip_c"] is not None} == {"orthogonalize"}
    tuned = dataclasses.replace(cfg, optimizer_kwargs={"betas": [0.8, 0.99], "clip_method": "svd"})
    lr_lambda = build_lr_lambda(cfg)
    opt = build_optimizer(model, tuned, lr_lambda)
    assert opt.param_groups[0]["betas"] == [0.8, 0.99]
    assert opt.param_groups[0]["eps"] == 1e-8 and opt.param_groups[0]["clip_method"] == "svd"
    # the engine options of spectra's own optimizers pass through too
    engine = {"nonfinite": "skip", "chunk_elements": 4096, "split_work": False}
    opt = build_optimizer(model, dataclasses.replace(cfg, optimizer_kwargs=engine), lr_lambda)
    assert {k: opt.defaults[k] for k in engine} == engine


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ('{"bta1": 0.8}', "spectra-adamw takes no keyword 'bta1'"),
        ('{"betas": [0.8, 0.99], "lr": 1}', "set the config field 'lr' instead"),
        ('{"momentum": 0.9}', "spectra-adamw takes no keyword 'momentum'"),
        ('{"chunk_elemnts": 1000}', "(did you mean 'chunk_elements'?)"),
    ],
)
def test_optimizer_kwargs_the_optimizer_does_not_take_are_a_one_line_error(kwargs, needle, capsys):
    # reported before anything runs: the default dataset is never prepared
    assert main(["train", "--set", f"optimizer_kwargs={kwargs}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config field 'optimizer_kwargs'" in err and needle in err


def test_set_values_are_yaml_scalars_checked_against_the_field_type():
    items = ["clip_c=null", "lr=1e-3", "clip_groups=[hidden, attn, embed]", "grad_clip=~"]
    items += ["optimizer_kwargs={betas: [0.8, 0.99]}", "clip_scale=2", "out_dir=007"]
    items += ["plot=false", "seq_len=64"]
    cfg = build_config(("--set", parse_set(items)))
    assert (cfg.clip_c, cfg.lr, cfg.grad_clip, cfg.clip_scale) == (None, 1e-3, None, 2.0)
    assert cfg.clip_groups == ["hidden", "attn", "embed"]
    assert cfg.optimizer_kwargs == {"betas": [0.8, 0.99]}
    assert (cfg.out_dir, cfg.plot, cfg.seq_len) == ("007", False, 64)  # a string stays text
    comma = build_config(("--set", parse_set(["clip_groups=hidden,embed"])))
    assert comma.clip_groups == ["hidden", "embed"]
    for item, needle in [
        ("lr=fast", "config field 'lr' in --set: expected a number, got 'fast'"),
        ("steps=1.5", "config field 'steps' in --set: expected an integer, got '1.5'"),
        ("plot=maybe", "config field 'plot' in --set: expected true or false, got 'maybe'"),
        ("clip_groups={a: 1}", "config field 'clip_groups' in --set: expected a list"),
        ("lr=-1", "config field 'lr' = -1.0: lr must be a finite number > 0, got -1.0"),
    ]:
        with pytest.raises(ConfigError) as err:
            build_config(("--set", parse_set([item])))
        assert needle in str(err.value)


@pytest.mark.parametrize("steps", [1, 3, 30, 300])
def test_default_warmup_is_a_tenth_of_the_steps_and_fits_every_schedule(steps):
    from spectra_lab.cli import build_parser
    from spectra_lab.train.cli import config_from_args

    argv = ["train", "--steps", str(steps)]
    cfg = config_from_args(build_parser(argv).parse_args(argv))
    assert cfg.warmup_steps is None and cfg.warmup == round(0.1 * steps)
    for schedule in ("wsd", "cosine", "constant"):
        lr_lambda = build_lr_lambda(dataclasses.replace(cfg, schedule=schedule))
        factors = [lr_lambda(k) for k in range(steps)]
        assert 0 < factors[0] <= 1 and max(factors) == 1.0 and min(factors) >= 0
    assert TrainConfig().warmup == 30  # the main job's warmup


def test_loss_plot_is_drawn_once_at_the_end(train_dataset, tmp_path, monkeypatch):
    import spectra_lab.train.metrics as metrics

    drawn = []
    monkeypatch.setattr(metrics, "plot_curves", lambda *args: drawn.append(args))
    cfg = small_config(train_dataset, tmp_path / "run", steps=6, eval_interval=2, plot=True)
    train(dataclasses.replace(cfg, warmup_steps=None))
    assert len(drawn) == 1
    path, steps, evals = drawn[0]
    assert path == tmp_path / "run" / "loss.png" and len(steps) == 6 and len(evals) == 3
    # the run directory records the warmup in force: 10% of the steps
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["warmup_steps"] == 1


def test_user_errors_of_every_layer_share_one_leaf_base():
    from spectra_lab.data import DataError
    from spectra_lab.errors import CLIError, UserError

    for error in (CLIError, DataError, ConfigError, CheckpointError):
        assert issubclass(error, UserError)
    assert not issubclass(DataError, CLIError)


# ---------------------------------------------------------------------------------------
# DDP


def _ddp_worker(
    rank: int, port: int, dataset: str, out: str, result_dir: str, optimizer: str
) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    cfg = small_config(
        Path(dataset), Path(out), steps=4, grad_accum=2, eval_interval=4, optimizer=optimizer,
        optimizer_kwargs=_ddp_kwargs(optimizer),
    )  # fmt: skip
    cfg = dataclasses.replace(cfg, warmup_steps=1)
    result = train(cfg)
    torch.save(result.model.state_dict(), Path(result_dir) / f"rank{rank}.pt")


def _ddp_kwargs(optimizer: str) -> dict:
    # The exact clip: DDP's averaged gradients differ from one process's by summation order
    # (~1e-7), and the exact clip keeps that difference; "mixed", the default on CPUs with bf16
    # units, rounds its last steps to bf16, where a 1e-7 change of the input can flip a rounding
    # and move the result by its ~4e-3 floor. Its equality across ranks on equal inputs is
    # tested in test_distributed.py.
    return {"clip_method": "eigh"} if optimizer.startswith("spectra") else {}


@pytest.mark.parametrize("optimizer", ["torch-adamw", "spectra-adamw"])
def test_ddp_two_processes_match_one_process_with_the_global_batch(
    train_dataset, tmp_path, optimizer
):
    # spectra-adamw divides its spectral clipping among the ranks (split_work, on by default)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    torch.multiprocessing.spawn(
        _ddp_worker,
        args=(port, str(train_dataset), str(out), str(tmp_path), optimizer),
        nprocs=2,
    )
    w0 = torch.load(tmp_path / "rank0.pt")
    w1 = torch.load(tmp_path / "rank1.pt")
    for name in w0:
        torch.testing.assert_close(w1[name], w0[name], rtol=0, atol=0, msg=name)
    assert read_checkpoint(out / "ckpt" / "step_0000004.pt")["world_size"] == 2
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["tokens"] == 2 * 2 * 8 * 32  # ranks x accumulation x batch x seq_len

    # Reference: one process drawing the whole global batch (2 ranks x 8 sequences). Rank r
    # takes the r-th slice of each global batch, and DDP averages the two ranks' gradients,
    # so both runs take the same steps up to floating-point summation order.
    ref_cfg = small_config(
        train_dataset, tmp_path / "ref", steps=4, grad_accum=2, batch_size=16, optimizer=optimizer,
        optimizer_kwargs=_ddp_kwargs(optimizer),
    )  # fmt: skip
    ref_cfg = dataclasses.replace(ref_cfg, eval_interval=4, warmup_steps=1)
    ref = train(ref_cfg)
    ref_rows = [r for r in read_jsonl(tmp_path / "ref" / "metrics.jsonl") if r["kind"] == "train"]
    np.testing.assert_allclose([r["loss"] for r in rows], [r["loss"] for r in ref_rows], rtol=1e-5)
    for name, p in ref.model.state_dict().items():
        torch.testing.assert_close(w0[name], p, rtol=1e-3, atol=1e-4, msg=name)


def test_compare_plots_the_final_validation_losses_of_runs(train_dataset, tmp_path, capsys):
    runs = []
    for lr in ("1e-2", "3e-3"):
        out = tmp_path / f"lr{lr}"
        argv = ["train", "--preset", "tiny", "--dataset", str(train_dataset), "--steps", "6"]
        argv += ["--out", str(out), "--optimizer", "torch-adamw", "--lr", lr, "--no-progress"]
        argv += ["--set", "eval_interval=3", "--set", "eval_batches=2", "--set", "seq_len=32"]
        argv += ["--set", "warmup_steps=1", "--batch-size", "4", "--device", "cpu"]
        assert main(argv) == 0
        runs.append(out)
    capsys.readouterr()
    fig = tmp_path / "cmp.png"
    assert main(["compare", *map(str, runs), "--labels", "a", "b", "--out", str(fig)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    for label, run in zip(("a", "b"), runs, strict=True):
        final = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "eval"][-1]
        want = f"{label}: final validation loss {final['val_loss']:.4f}"
        assert any(line.startswith(want) for line in lines), (want, lines)
    # median step times after the first step, and their ratio to the first run's
    medians = []
    for run in runs:
        train_records = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
        medians.append(statistics.median(r["t_step"] for r in train_records[1:]))
    assert f"median step {medians[1]:.3f} s (x{medians[1] / medians[0]:.3f} of a)" in lines[1]
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", str(tmp_path / "missing"), "--out", str(fig)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a run directory" in err[0]


def test_global_batch_size_derives_grad_accum_for_the_world_size():
    cfg = TrainConfig(batch_size=4, global_batch_size=32)
    assert [cfg.accumulation(w) for w in (1, 2, 4, 8)] == [8, 4, 2, 1]
    with pytest.raises(ConfigError, match="not a multiple of batch_size 4 x world size 3 = 12"):
        cfg.accumulation(3)
    with pytest.raises(ConfigError, match="not a multiple"):
        TrainConfig(batch_size=64, global_batch_size=32).accumulation(1)
    with pytest.raises(ConfigError, match=r"'grad_accum' = 2: .* needs 8"):
        TrainConfig(batch_size=4, grad_accum=2, global_batch_size=32).accumulation(1)
    assert TrainConfig(batch_size=4, grad_accum=8, global_batch_size=32).accumulation(1) == 8
    assert TrainConfig(batch_size=4, grad_accum=3).accumulation(4) == 3  # no global batch


def test_global_batch_size_trains_like_the_same_grad_accum(train_dataset, tmp_path, capsys):
    a = train(small_config(train_dataset, tmp_path / "a", batch_size=2, grad_accum=3, steps=6))
    b = train(
        small_config(train_dataset, tmp_path / "b", batch_size=2, global_batch_size=6, steps=6)
    )
    for (name, p), (_, q) in zip(
        a.model.named_parameters(), b.model.named_parameters(), strict=True
    ):
        assert torch.equal(p, q), name
    saved = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())
    assert (saved["grad_accum"], saved["global_batch_size"]) == (3, 6)
    argv = ["train", "--dataset", str(train_dataset), "--preset", "tiny", "--batch-size", "4"]
    assert main([*argv, "--set", "global_batch_size=6", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not a multiple of batch_size 4 x world size 1" in err
