"""The mixture-of-experts model of ``spectra train`` (the cpu-moe preset): its routing against a
per-token reference, its param groups under both ``clip_layout`` values, and a resumed run
that keeps each expert's clip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from spectra_lab.cli import main
from spectra_lab.model import Llama, model_config
from spectra_lab.model.llama import MoE
from spectra_lab.runs.checkpoint import read_checkpoint
from spectra_lab.train.config import TrainConfig
from spectra_lab.train.optimizers import param_groups, plain_groups, spectral_groups
from spectra_lab.train.schedule import build_lr_lambda
from spectra_lab.train.trainer import train
from test_train import VOCAB, small_config, train_dataset  # noqa: F401 (a fixture)

MOE = {"preset": "cpu-moe", "d_model": 32, "n_heads": 2, "n_layers": 1}


def test_moe_output_is_the_sum_of_its_top_k_experts_weighted_by_the_renormalised_softmax():
    torch.manual_seed(0)
    moe = MoE(d_model=6, hidden=5, n_experts=4, top_k=2).double()
    for p in moe.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    expected = torch.zeros_like(x)
    for b in range(2):
        for t in range(3):
            xi = x[b, t]
            p = F.softmax(moe.router.weight @ xi, dim=0)
            top = p.topk(2).indices
            for e in top.tolist():
                w1, w3 = moe.gate_up_proj[e, :5], moe.gate_up_proj[e, 5:]
                y = moe.down_proj[e] @ (F.silu(w1 @ xi) * (w3 @ xi))
                expected[b, t] += p[e] / p[top].sum() * y
    torch.testing.assert_close(moe(x), expected, rtol=0, atol=1e-12)


def test_moe_groups_clip_each_expert_with_matrices_and_each_stack_with_tensors():
    model = Llama(model_config("cpu-moe", VOCAB, seq_len=32))
    names = {id(p): n for n, p in model.named_parameters()}
    lr_lambda = build_lr_lambda(TrainConfig())
    for layout in ("matrices", "tensors"):
        cfg = TrainConfig(clip_layout=layout)
        groups = spectral_groups(param_groups(model, cfg), cfg, lr_lambda)
        assert sum(len(g["params"]) for g in groups) == len(names)
        for g in groups:
            for p in g["params"]:
                n = names[id(p)]
                stacked = n.endswith(("gate_up_proj", "down_proj"))
                assert g.get("clip_batch_dims", 0) == (1 if stacked and layout == "matrices" else 0)
                split = ((192, 192), 1) if n.endswith("gate_up_proj") else None
                assert g.get("clip_split") == (split if layout == "matrices" else None)
        # an optimizer that knows nothing of SPECTRA gets no layout keys
        assert all("clip_batch_dims" not in g for g in plain_groups(groups, cfg, lr_lambda))


def test_moe_run_resumes_with_each_expert_clipped_as_the_uninterrupted_run(train_dataset, tmp_path):  # noqa: F811
    kw = dict(optimizer="spectra-adamw", clip_c=0.5, steps=10, **MOE)
    full = train(small_config(train_dataset, tmp_path / "full", **kw))

    def interrupt(step, record):
        if step == 7:
            raise KeyboardInterrupt

    cfg = small_config(train_dataset, tmp_path / "cut", **kw)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, on_step=interrupt)
    assert main(["train", "--out", cfg.out_dir, "--resume"]) == 0
    resumed_val = json.loads((Path(cfg.out_dir) / "summary.json").read_text())["val_loss"]
    assert resumed_val == pytest.approx(full.val_loss, abs=1e-6)
    saved = read_checkpoint(Path(cfg.out_dir) / "ckpt" / "step_0000010.pt")["optimizer"]
    layouts = {(g.get("clip_batch_dims"), g.get("clip_split")) for g in saved["param_groups"]}
    assert {(1, ((192, 192), 1)), (1, None)} <= layouts


def test_tensor_parallel_and_export_refuse_an_moe_run_in_one_line(train_dataset, tmp_path, capsys):  # noqa: F811
    # tensor parallelism splits dense matrices only, and the Llama export format has no experts
    code = main(["train", "--preset", "cpu-moe", "--parallel", "tp", "--out", str(tmp_path / "tp")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "config field 'parallel' = 'tp'" in err and "expert layers" in err
    assert len(err.splitlines()) == 1
    cfg = small_config(
        train_dataset, tmp_path / "moe", **MOE, steps=2, warmup_steps=1, checkpoint_interval=2
    )
    train(cfg)
    code = main(["export", str(tmp_path / "moe"), "--out", str(tmp_path / "hf")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "n_experts = 4" in err and "no experts" in err, err
    assert len(err.splitlines()) == 1
