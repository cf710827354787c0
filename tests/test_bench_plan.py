"""``spectra bench plan`` on a tiny config: sizes against the model built for real, the
optimizer state against the state measured after a step, the activation formula against the
tensors autograd keeps and the peak of live tensors of a bf16 step on CPU, FSDP2's shards."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from spectra_lab.cli import main
from spectra_lab.estimate.plan import activation_bytes, plan, vocab_of
from spectra_lab.model import Llama, ModelConfig, flops_per_token, model_config
from spectra_lab.train.config import TrainConfig
from spectra_lab.train.optimizers import OPTIMIZERS
from spectra_lab.train.throughput import GPUS

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(
    preset="tiny", tokenizer="bpe", vocab_size=512, seq_len=32, batch_size=4, grad_accum=2,
    steps=100, optimizer="adamw",
)  # fmt: skip


def write_config(folder: Path, name: str = "tiny.yaml", **values) -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump({**TINY, **values}))
    return path


def test_plan_of_a_config_file_counts_its_model_tokens_flops_time_and_memory(tmp_path, capsys):
    path = write_config(tmp_path)
    out = tmp_path / "plan.json"
    argv = ["bench", "plan", str(path), "--world-size", "2", "--mfu", "0.5", "--json", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert f"| {path} | adamw | " in table and "2 x H100 SXM at MFU 0.5" in table
    doc = json.loads(out.read_text())
    assert (doc["world_size"], doc["gpu"], doc["mfu"]) == (2, "h100", 0.5)
    (row,) = doc["rows"]

    model = Llama(model_config("tiny", 512, seq_len=32))  # built for real
    params = model.num_parameters()
    assert row["parameters"] == params
    assert row["tokens_per_step"] == 4 * 2 * 2 * 32  # micro-batch x accumulation x GPUs x seq
    assert row["tokens"] == 100 * row["tokens_per_step"]
    assert row["flops_per_step"] == flops_per_token(model.cfg) * row["tokens_per_step"]
    assert row["step_s"] == pytest.approx(row["flops_per_step"] / (2 * 0.5 * 989.5e12))
    assert row["total_s"] == pytest.approx(100 * row["step_s"])

    ddp, fsdp2 = row["memory_ddp"], row["memory_fsdp2"]
    assert ddp["weights"] == ddp["gradients"] == ddp["ddp_buckets"] == 4 * params
    assert ddp["optimizer_state"] == 4 * 2 * params  # AdamW: m and v
    for part in ("weights", "gradients", "optimizer_state"):  # FSDP2 shards them
        assert fsdp2[part] == ddp[part] / 2
    assert fsdp2["activations"] == ddp["activations"]
    for memory in (ddp, fsdp2):
        assert memory["total"] == pytest.approx(sum(v for k, v in memory.items() if k != "total"))


def test_one_process_has_no_ddp_buckets_and_autocast_none_plans_at_the_tf32_peak():
    cfg = TrainConfig(**{**TINY, "autocast": "none"})
    row = plan(cfg, world_size=1, gpu="a100", mfu=1.0)
    assert row["memory_ddp"]["ddp_buckets"] == 0
    assert row["step_s"] == pytest.approx(row["flops_per_step"] / (GPUS["a100"].tf32 * 1e12))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_state_memory_is_the_state_measured_after_a_step(name, tiny_state):
    # measure(): the tiny preset with a 4096-token vocabulary, a real step, its state counted
    row = plan(TrainConfig(preset="tiny", optimizer=name, tokenizer="bpe", vocab_size=4096))
    assert row["memory_ddp"]["optimizer_state"] == 4 * tiny_state(name)["state_elements"]


class LiveTensors(TorchDispatchMode):
    """The peak bytes of the tensors created under the mode and still alive (by storage)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: set[int] = set()

    def _forget(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and key not in self.seen:
                    self.seen.add(key)
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._forget, key, nbytes)
        return out


@pytest.mark.parametrize("vocab", [512, 4000])
def test_activation_formula_is_what_a_bf16_step_keeps_and_its_peak_on_cpu(vocab):
    cfg = ModelConfig(vocab_size=vocab, d_model=64, n_layers=2, n_heads=4, seq_len=64)
    model, batch = Llama(cfg), 4
    tokens = torch.randint(0, vocab, (batch, 65), generator=torch.Generator().manual_seed(0))
    expected = activation_bytes(cfg, batch)

    # What autograd saves for the backward pass (the bf16 weight copies included, the float32
    # weights themselves not), one count per storage.
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    weights = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", torch.bfloat16):
            logits, loss = model(tokens[:, :-1], tokens[:, 1:])
    kept = sum(n for key, n in saved.items() if key not in weights)
    assert kept == pytest.approx(expected["saved"], rel=1e-3)  # a few scalars apart

    # The peak of live tensors over forward and backward: the loss adds its 10V per token.
    del logits, loss
    live = LiveTensors()
    with live:
        with torch.autocast("cpu", torch.bfloat16):
            _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
    assert live.peak == pytest.approx(expected["saved"] + expected["loss_peak"], rel=0.01)


def test_vocabulary_is_the_prepared_datasets_or_the_tokenizers(tmp_path):
    assert vocab_of(TrainConfig(tokenizer="gpt2", dataset="fineweb-edu")) == 50257
    assert vocab_of(TrainConfig(tokenizer="bytes", dataset="shakespeare")) == 256
    assert vocab_of(TrainConfig(tokenizer="bpe", vocab_size=1000)) == 1000
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 77}))
    assert vocab_of(TrainConfig(dataset=str(tmp_path))) == 77


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["missing.yaml"], "config file not found: missing.yaml"),
        (["{cfg}", "--world-size", "0"], "--world-size must be an int >= 1, got 0"),
        (["{cfg}", "--mfu", "1.5"], "--mfu must be a number in (0, 1], got 1.5"),
        (["{cfg}", "--world-size", "3"], "'global_batch_size' = 16: not a multiple"),
        (["{bad}"], "unknown config field 'lerning_rate'"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, capsys, args, needle):
    cfg = write_config(tmp_path, global_batch_size=16, grad_accum=1)
    bad = write_config(tmp_path, "bad.yaml", lerning_rate=1.0)
    argv = ["bench", "plan", *(a.format(cfg=cfg, bad=bad) for a in args)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err, err
