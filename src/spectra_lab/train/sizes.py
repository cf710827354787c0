"""What a run needs, checked before anything is built or written: windows of its sequence
length in each split of its dataset, and memory for its model, optimizer state, batch and
activations on the device it runs on.

Memory of one process, in bytes: a rough count, meant to refuse only the runs that cannot fit.

* weights and gradients, float32: 4·P each; the optimizer state: 4·S, with S the elements of
  the registry's state formula (``Recipe.state``) for the optimizer built on the meta device
  (the count ``spectra bench memory`` checks against a real step); under ``fsdp2``, ``tp``
  and ``2d`` the three are divided by the number of processes, and under DDP with several
  processes its gradient buckets add 4·P;
* the activations of one micro-batch of b sequences of s tokens (h = d_model, f = SwiGLU
  width, a = heads, V = vocabulary, L = layers). Under bf16 autocast, :func:`activation_bytes`
  (the count of ``spectra bench plan``; ``estimate/plan.py`` says how it is made). In float32
  (the CPU default), :func:`float32_activation_bytes`, the same count for tensors all in
  float32: per token and layer the two RMSNorms' input and output (16h), q, k, v and the
  attention output (16h), SwiGLU's four f-wide tensors (16f), a log-sum-exp per head (4a) and
  the norms' reciprocal RMS (8); after the layers the final norm (8h + 4) and the token ids and
  targets (16); at the loss 16V: the logits, the log-softmax, and at the start of the backward
  pass the two gradients of the log-softmax. With the gradients above, that is within 25% of
  the peak of the live tensors of a float32 step on CPU (``tests/test_train_checks.py``).
  Under ``tp`` and ``2d`` divided by the tensor-parallel size. An evaluation batch keeps no
  activations for a backward pass: its logits and log-softmax in float32 and a bf16 copy, 10V
  per token, and a few h- and f-wide tensors of one layer at a time (16h + 12f), counted
  instead of the training activations when that is more;
* the batch: the sampler reads b windows of s + 1 tokens of the dataset's dtype, widens them to
  int64 and cuts them into x and y (b·(s + 1)·(itemsize + 8) + 16·b·s bytes, on the host); on
  CUDA a pinned copy and the device copy of x and y add 16·b·s each, the first on the host.

On a CPU everything is host memory, checked against ``MemAvailable`` of ``/proc/meminfo``
(``os.sysconf``'s free pages where there is none), capped by a cgroup's ``memory.max``, which
the processes of the machine share (``LOCAL_WORLD_SIZE``). On CUDA the device's part is checked
against the free memory ``torch.cuda.mem_get_info`` reports and the batch against the host.
Not counted: torch itself, the CUDA context, the allocator's slack, the optimizer step's
temporary buffers: a run let through may still run out of memory near the limit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from spectra_lab.data import TokenDataset
from spectra_lab.model import Llama, ModelConfig, matmul_parameters
from spectra_lab.train.build import model_config_of
from spectra_lab.train.config import ConfigError, TrainConfig
from spectra_lab.train.optimizers import OPTIMIZERS, build_optimizer
from spectra_lab.train.runtime import Runtime

BYTES = 4  # float32 weights, gradients and optimizer state
GB = 1e9


def check_sizes(
    cfg: TrainConfig, rt: Runtime, dataset_dir: Path, lr_lambda: Callable[[int], float]
) -> None:
    """One-line ``ConfigError`` when the dataset has no window of the run's sequence length
    in a split, or when the run needs more memory than its device has (module docstring)."""
    meta = json.loads((dataset_dir / "meta.json").read_text())
    model_cfg = model_config_of(cfg, int(meta["vocab_size"]))
    windows = check_windows(cfg, dataset_dir, model_cfg.seq_len)
    itemsize = np.dtype(meta.get("dtype", "uint16")).itemsize
    check_memory(cfg, rt, model_cfg, lr_lambda, windows["val"], itemsize)


def check_windows(cfg: TrainConfig, dataset_dir: Path, seq_len: int) -> dict[str, int]:
    """The windows of ``seq_len`` + 1 tokens in each split; a split without one is an error."""
    splits = {name: TokenDataset(dataset_dir / f"{name}.bin", seq_len) for name in ("train", "val")}
    empty = [name for name, split in splits.items() if split.num_windows == 0]
    if empty:
        tokens = {name: len(split.tokens) for name, split in splits.items()}
        held = " and ".join(f"the {name} split holds {tokens[name]:,}" for name in empty)
        whose = "" if cfg.seq_len is not None else f" (preset {cfg.preset}'s)"
        raise ConfigError(
            f"config field 'seq_len' = {seq_len}{whose}: in {dataset_dir}, {held} tokens, not "
            f"one sequence of {seq_len} + 1; give --set seq_len={min(tokens.values()) - 1} "
            "or less, or a larger dataset"
        )
    return {name: split.num_windows for name, split in splits.items()}


def float32_activation_bytes(model_cfg: ModelConfig, micro_batch: int) -> dict[str, int]:
    """Activation memory of one micro-batch in float32 (module docstring): ``saved`` (what the
    backward pass needs, with the logits) and ``loss_peak`` (what the loss's backward adds)."""
    h, f, a = model_cfg.d_model, model_cfg.hidden_dim, model_cfg.n_heads
    V, L = model_cfg.vocab_size, model_cfg.n_layers
    tokens = micro_batch * model_cfg.seq_len
    per_token = L * (32 * h + 16 * f + 4 * a + 8) + 8 * h + 20 + 8 * V
    return {"saved": tokens * per_token, "loss_peak": tokens * 8 * V}


def activation_bytes(model_cfg: Any, micro_batch: int) -> dict[str, int]:
    """Activation memory of one micro-batch under bf16 autocast (``estimate/plan.py``'s
    docstring): ``saved`` (what autograd keeps for the backward pass, bf16 weight copies
    included) and ``loss_peak`` (what the loss adds at the start of the backward pass)."""
    h, f, a = model_cfg.d_model, model_cfg.hidden_dim, model_cfg.n_heads
    V, L = model_cfg.vocab_size, model_cfg.n_layers
    tokens = micro_batch * model_cfg.seq_len
    per_token = L * (34 * h + 8 * f + 4 * a + 8) + 10 * h + 4 * V + 20
    return {
        "saved": tokens * per_token + 2 * matmul_parameters(model_cfg),
        "loss_peak": tokens * 10 * V,  # bf16 logits, float32 gradients of the log-softmax
    }


def memory_need(
    cfg: TrainConfig,
    rt: Runtime,
    model_cfg: ModelConfig,
    lr_lambda: Callable[[int], float],
    val_windows: int,
    itemsize: int,
) -> dict[str, int]:
    """The bytes one process of the run needs (module docstring): ``model`` (weights,
    gradients, optimizer state, DDP's buckets), ``activations`` and ``batch`` on its device,
    and ``host_batch``, what assembling its batches takes on the host."""
    with torch.device("meta"):
        model = Llama(model_cfg)
    optimizer = build_optimizer(model, cfg, lr_lambda)
    params = sum(p.numel() for p in model.parameters())
    state = OPTIMIZERS[cfg.optimizer].state.elements(optimizer)
    sharded = cfg.parallel != "ddp"
    weights = BYTES * (2 * params + state) // (rt.world_size if sharded else 1)
    buckets = BYTES * params if not sharded and rt.world_size > 1 else 0
    tp = rt.world_size // rt.dp_size
    b, s, V = cfg.batch_size, model_cfg.seq_len, model_cfg.vocab_size
    count = activation_bytes if rt.autocast_dtype is not None else float32_activation_bytes
    train = sum(count(model_cfg, b).values()) // tp
    b_eval = min(cfg.eval_batch_size or b, val_windows)
    h, f = model_cfg.d_model, model_cfg.hidden_dim
    evaluation = b_eval * s * (10 * V + 16 * h + 12 * f)
    rows = max(b, b_eval)
    host_batch = rows * (s + 1) * (itemsize + 8) + 16 * rows * s
    cuda = rt.device.type == "cuda"
    return {
        "model": weights + buckets,
        "activations": max(train, evaluation),
        "batch": 16 * rows * s if cuda else 0,
        "host_batch": host_batch + (16 * rows * s if cuda else 0),
    }


def check_memory(
    cfg: TrainConfig,
    rt: Runtime,
    model_cfg: ModelConfig,
    lr_lambda: Callable[[int], float],
    val_windows: int,
    itemsize: int,
) -> None:
    """One-line ``ConfigError`` when the run needs more memory than its device has free."""
    need = memory_need(cfg, rt, model_cfg, lr_lambda, val_windows, itemsize)
    on_device = need["model"] + need["activations"] + need["batch"]
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # they share the host
    if rt.device.type == "cuda":
        checks = [
            (str(rt.device), on_device, torch.cuda.mem_get_info(rt.device)[0]),
            ("host", need["host_batch"] * processes, host_memory()),
        ]
    else:
        checks = [("host", (on_device + need["host_batch"]) * processes, host_memory())]
    for where, wanted, free in checks:
        if free is None or wanted <= free:
            continue
        if need["model"] > need["activations"] + need["host_batch"]:
            field_, value = "preset", cfg.preset
        elif cfg.batch_size == 1 and cfg.seq_len is not None:
            field_, value = "seq_len", cfg.seq_len
        else:
            field_, value = "batch_size", cfg.batch_size
        each = f" for {processes} processes" if processes > 1 and where == "host" else ""
        raise ConfigError(
            f"config field '{field_}' = {value!r}: the run needs about {wanted / GB:,.1f} GB of "
            f"{where} memory{each} (model, gradients and optimizer state "
            f"{need['model'] / GB:,.1f} GB, activations {need['activations'] / GB:,.1f} GB, "
            f"batches {(need['batch'] + need['host_batch']) / GB:,.1f} GB) and {free / GB:,.1f} "
            "GB is free; lower --batch-size (a higher --grad-accum keeps the global batch) or "
            "seq_len, or pick a smaller --preset"
        )


def host_memory() -> int | None:
    """The bytes the host can still give this machine's processes: ``MemAvailable`` (else the
    free pages), capped by the cgroup's ``memory.max``; ``None`` when unknown."""
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        limit = "max"
    return min(free, int(limit)) if limit.isdigit() else free
