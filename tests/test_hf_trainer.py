"""The SpectralMonitor callback of docs/diagnostics.md in a Hugging Face ``Trainer``.

transformers and accelerate are dev extras (installed by ``make test``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

import spectra
from spectra.ops import soft_clip_method

pytestmark = pytest.mark.usefixtures("one_thread")

DOC = Path(__file__).parent.parent / "docs" / "diagnostics.md"


def documented_callback() -> type:
    """The ``SpectralMonitorCallback`` class exactly as docs/diagnostics.md shows it."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    (code,) = [b for b in blocks if "class SpectralMonitorCallback" in b]
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace["SpectralMonitorCallback"]


def train(tmp_path: Path, with_monitor: bool):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    )
    gen = torch.Generator().manual_seed(1)
    data = [
        {"input_ids": ids, "labels": ids} for ids in torch.randint(0, 32, (8, 16), generator=gen)
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path / ("with" if with_monitor else "without")),
        max_steps=4, per_device_train_batch_size=2, learning_rate=1e-2,
        lr_scheduler_type="constant", report_to=[], logging_steps=1, save_strategy="no",
        use_cpu=True, seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    optimizer = spectra.AdamW(model.parameters(), lr=1e-2, clip_c=0.05)
    trainer = Trainer(model=model, args=args, train_dataset=data, optimizers=(optimizer, None))
    if with_monitor:
        trainer.add_callback(documented_callback()(trainer, every=2))
    trainer.train()
    return model, trainer


def test_documented_callback_logs_spectra_to_the_trainer_and_changes_no_weight(tmp_path):
    plain, _ = train(tmp_path, with_monitor=False)
    watched, trainer = train(tmp_path, with_monitor=True)
    for (name, a), (_, b) in zip(plain.named_parameters(), watched.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    logged = [h for h in trainer.state.log_history if "spectral/step" in h]
    assert [h["spectral/step"] for h in logged] == [0.0, 2.0]  # every=2 over 4 steps
    keys = logged[0].keys()
    assert any(k.endswith("/update_sigma_max") for k in keys)
    # the step's spectral norm stays within SPECTRA's bound α·η·c_k, as the monitor reports it
    # (to the default clip's accuracy: where it is "mixed", a CPU with bf16 units, its bf16
    # steps put the largest singular value up to ~1% above c on these 16-wide matrices)
    slack = 2e-2 if soft_clip_method("auto", torch.device("cpu")) == "mixed" else 1e-4
    assert all(0.0 < h["spectral/max_step_norm_over_bound"] <= 1.0 + slack for h in logged)


# --------------------------------------------------------------------------- docs/optimizers.md

OPTIMIZERS_DOC = Path(__file__).parent.parent / "docs" / "optimizers.md"


def documented_trainer_factory():
    """``spectra_trainer`` exactly as docs/optimizers.md shows it."""
    blocks = re.findall(r"```python\n(.*?)```", OPTIMIZERS_DOC.read_text(), flags=re.S)
    (code,) = [b for b in blocks if "def spectra_trainer" in b]
    namespace: dict = {}
    exec(compile(code, str(OPTIMIZERS_DOC), "exec"), namespace)
    return namespace["spectra_trainer"]


def test_documented_trainer_runs_the_standard_clip_schedule_on_the_trainers_lr(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1,
                                       n_head=2))  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    data = [
        {"input_ids": ids, "labels": ids} for ids in torch.randint(0, 32, (8, 16), generator=gen)
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=2,
        learning_rate=1e-2, report_to=[], logging_steps=1, save_strategy="no", use_cpu=True,
        seed=0, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = documented_trainer_factory()(model, args, data, warmup_steps=4, total_steps=6)
    seen = []  # (η_k, c_k) of each step, read when the step runs

    def record(opt, args, kwargs):
        group = opt.param_groups[0]
        p = next(q for q in group["params"] if q.dim() == 2)
        k = int(opt.state[p]["step"]) if opt.state[p] else 0
        post = opt.param_plan(group, p, k).post  # None where c_k = ∞ (S(0) = 0: no clip)
        seen.append((group["lr"], post.c if post is not None else math.inf))

    trainer.create_optimizer_and_scheduler(num_training_steps=6)
    trainer.optimizer.register_step_pre_hook(record)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert [round(lr * c, 9) for lr, c in seen[1:4]] == [round(1e-2 * 10.0, 9)] * 3  # c_k·η_k = c·η
    assert seen[0] == (0.0, math.inf)  # S(0) = 0: η_0 = 0 and no clip
    assert [c for _, c in seen[4:]] == [10.0, 10.0]  # after warmup: c
