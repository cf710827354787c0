"""The configs of the paper's LLM runs under ``configs/paper/``.

Every file loads through the real loader and passes every check ``spectra train`` makes before
it runs (fields, optimizer keywords, schedule, model shape, the global batch for the world
sizes it names); its model, built on the meta device, has the size of its name; and every
file, shrunk by ``--shrink`` to the tiny CPU model, trains two real steps.

The sizes of the file names are the names "Enhancing LLM Training via Spectral Clipping"
gives its models; they are the totals of every parameter, embeddings included, with its
vocabulary of 50,304 rows: its table of architectures has the 124M (tied) and 160M (untied)
models differ only in the untied input embedding, and the 160M model has 124M parameters
without it. The figures of the headers and the docs are checked in test_paper_configs_docs.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import torch

from spectra_lab.model import Llama
from spectra_lab.train.build import model_config_of
from spectra_lab.train.config import (
    ConfigError,
    TrainConfig,
    build_config,
    read_config_file,
    shrink,
)
from spectra_lab.train.optimizers import build_optimizer, check_optimizer
from spectra_lab.train.schedule import build_lr_lambda
from spectra_lab.train.trainer import train
from test_train import write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "paper"
FILES = sorted(CONFIGS.glob("*.yaml"))
#: GPT-2's 50,257 tokens padded to a multiple of 64, as in the paper
PADDED_VOCAB = 50304
#: model size in the file name -> parameter count the paper gives it
SIZES = {"124m": 124e6, "160m": 160e6, "780m": 780e6, "820m": 820e6, "1.5b": 1.5e9}
#: the world sizes of the paper's runs and of common GPU nodes
WORLD_SIZES = (1, 4, 8)
#: the paper's global batches that 8 processes cannot share (1012 = 4 x 11 x 23)
NOT_FOR_8 = {1012}


def load(path: Path) -> TrainConfig:
    return build_config((str(path), read_config_file(path)))


def size_of(path: Path) -> str:
    return path.name.split("-", 1)[0]


def test_every_run_of_the_paper_has_a_config():
    assert len(FILES) >= 70
    names = {p.stem for p in FILES}
    for family, optimizers in {
        "160m-wsd": "adamw ademamix signum mars dmuon soap spectra-adamw spectra-ademamix "
        "spectra-signum spectra-mars adamw-post-orth",
        "160m-cos": "adamw ademamix signum mars dmuon soap spectra-adamw spectra-ademamix "
        "spectra-signum adamw-post-orth",
        "780m-wsd": "adamw ademamix signum mars dmuon soap spectra-adamw spectra-ademamix "
        "spectra-signum spectra-mars",
        "820m-wsd": "adamw ademamix signum mars dmuon soap spectra-adamw spectra-ademamix "
        "spectra-signum spectra-mars",
        "1.5b-mup-wsd": "soap dmuon mars ademamix spectra-signum spectra-ademamix",
    }.items():
        for opt in optimizers.split():
            assert f"{family}-{opt}" in names
    readme = (CONFIGS / "README.md").read_text()
    for path in FILES:
        assert f"{path.name}" in readme, f"{path.name} is missing from configs/paper/README.md"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_config_validates_and_its_model_has_the_size_of_its_name(path: Path):
    cfg = load(path)
    text = path.read_text()
    # the header names the command that runs this very file
    assert f"--config configs/paper/{path.name}" in text
    assert cfg.out_dir == f"runs/paper/{path.stem}"
    assert (cfg.device, cfg.autocast, cfg.tokenizer) == ("auto", "auto", "gpt2")
    assert cfg.dataset in ("fineweb-edu", "slimpajama")
    assert cfg.global_batch_size is not None
    for world in WORLD_SIZES:
        if world == 8 and cfg.global_batch_size in NOT_FOR_8:
            with pytest.raises(ConfigError):
                cfg.accumulation(world)
            continue
        assert cfg.accumulation(world) * cfg.batch_size * world == cfg.global_batch_size
    lr_lambda = build_lr_lambda(cfg)
    check_optimizer(cfg)
    # μP changes no shape: count the parameters of the standard model of the same size
    shape = dataclasses.replace(cfg, parametrization="standard")
    with torch.device("meta"):
        model = Llama(model_config_of(shape, 50257))
    n = sum(p.numel() for p in model.parameters())
    expected = SIZES[size_of(path)]
    assert abs(n - expected) <= 0.1 * expected, f"{n / 1e6:.1f}M parameters"
    # the optimizer's own checks of its keywords and groups (no state is allocated yet)
    build_optimizer(model, cfg, lr_lambda)
    assert (cfg.parametrization == "mup") == path.name.startswith("1.5b-mup")
    model_cfg = model_config_of(cfg, 50257)  # the GPT-2 tokenizer's vocabulary, padded
    assert model_cfg.vocab_size == PADDED_VOCAB
    if cfg.parametrization == "mup":
        assert model_cfg.width_mult == model_cfg.d_model / cfg.mup_base_width == 1536 / 256
        assert not cfg.mup_lr_scaling  # the authors' Llama runs keep one lr


#: one file per model family, then the optimizers and options the first five leave out
#: (clipping of every group, pre-clipping, the paper's operator, post-orthogonalization, μP and
#: the spectral monitor are all among them)
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_config_shrinks_to_a_cpu_run_that_trains(path: Path, tmp_path_factory, tmp_path):
    """``--shrink``: the file's optimizer, settings and schedules on the tiny CPU model."""
    values = read_config_file(path)
    cfg = load(path)
    corpus = tmp_path_factory.getbasetemp() / "paper-corpus"
    if not (corpus / "meta.json").is_file():
        write_dataset(corpus)
    shrunk = build_config((str(path), values), ("--shrink", shrink(values)))
    assert shrunk.out_dir == f"{cfg.out_dir}-shrunk"
    assert (shrunk.preset, shrunk.device, shrunk.global_batch_size) == ("tiny", "cpu", None)
    kept = ("optimizer", "lr", "schedule", "clip_c", "clip_schedule", "pre_clip_c", "seed")
    assert all(getattr(shrunk, k) == getattr(cfg, k) for k in kept)
    assert shrunk.parametrization == cfg.parametrization
    for key, value in shrunk.optimizer_kwargs.items():
        if not key.endswith("_warmup"):
            assert value == cfg.optimizer_kwargs[key]
        else:
            assert value <= shrunk.steps
    # two of its steps, on the test corpus instead of Shakespeare
    test_layer = {"dataset": str(corpus), "out_dir": str(tmp_path / "run"), "steps": 2}
    test_layer.update(eval_interval=2, eval_batches=1, progress=False, plot=False)
    small = build_config(
        (str(path), values), ("--shrink", shrink(values)), ("the test", test_layer)
    )
    result = train(small)
    assert result.step == 2
    assert result.val_loss is not None and math.isfinite(result.val_loss)
    losses = [
        json.loads(line)["loss"]
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["kind"] == "train"
    ]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    if cfg.monitor_every:
        assert re.search(r'"kind": "monitor"', (tmp_path / "run" / "metrics.jsonl").read_text())
