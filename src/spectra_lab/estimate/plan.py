"""``spectra bench plan``: what a training config will cost, before running it.

For each config file (the ``spectra train --config`` format): the model's parameters (the model
is built on the meta device, no memory), tokens per optimizer step (global batch × seq_len),
steps and total tokens, training FLOPs per step (``flops_per_token`` × tokens; see
``spectra_lab.model.flops``), the step time and total time on ``--world-size`` GPUs of kind
``--gpu`` at an assumed MFU, and the memory per GPU under DDP and under FSDP2.

Time: ``step_s = flops_per_step / (world_size · mfu · peak)``, with the GPU's dense peak in
the run's precision (``spectra_lab.train.throughput.GPUS``: bf16 under the default autocast,
TF32 with ``autocast: none``).

Memory per GPU (bytes), without ``torch.compile``:

* weights and gradients: 4·P each (float32 parameters; P counts a tied matrix once);
* DDP's gradient buckets: 4·P more with two or more processes (DDP copies the gradients into
  its all-reduce buckets unless ``gradient_as_bucket_view``; one process is not wrapped);
* optimizer state: 4 × the elements of the paper's memory table for the optimizer
  (``spectra_lab.bench.memory.formula``: 2P for AdamW, P for Signum, ...);
* activations of one micro-batch of b sequences of s tokens under bf16 autocast, h = d_model,
  f = the SwiGLU width, a = heads, V = vocabulary, L = layers:

      b·s·[L·(34h + 8f + 4a + 8) + 10h + 14V + 20] + 2·N_matmul

  This is the count of "Reducing Activation Recomputation in Large Transformer Models"
  (Korthikanti et al., 2022: the bytes of the tensors autograd saves for the backward pass),
  done for this model instead of their GPT, whose sbh·(34 + 5as/h) per layer assumes dropout,
  a GELU MLP of width 4h and unfused attention. Here, per token and layer: the two RMSNorms
  keep their float32 input and normalised output (2·8h; the residual stream is float32, as
  the embedding is); the attention norm's output is cast to bf16 once per projection (3·2h)
  and the MLP norm's once per W₁ and W₃ (2·2h); SDPA's fused kernels keep q, k, v and the
  output (4·2h; no a·s² score matrix, so the 5as/h term is gone) and a float32 log-sum-exp
  per head (4a); SwiGLU keeps W₁x, SiLU(W₁x), W₃x and their product (4·2f); the norms'
  float32 reciprocal RMS (2·4). After the last layer: the final norm (8h + 4), the head's
  bf16 input (2h), the int64 token ids and targets (16) and, at the loss, 14V: the bf16
  logits (2V), the float32 log-softmax autograd keeps (4V) and, at the start of the backward
  pass, the float32 gradients of the log-softmax's output and input (2·4V); with GPT-2's
  vocabulary the loss outweighs a 124M model's twelve layers. 2·N_matmul is autocast's bf16
  copies of the matrix weights, kept for the backward pass. ``tests/test_bench_plan.py``
  checks the formula against the tensors autograd saves and against the peak of the live
  tensors of a bf16 forward and backward pass on CPU.

FSDP2 divides the weights, gradients and optimizer state by the world size, has no DDP
buckets, and holds some units whole (``gathered``): the root unit (embedding, head, final
norm), whose weights FSDP2 keeps gathered from the forward to the backward pass, and two
blocks (the one computing and the one prefetched), each with its float32 weights and
gradients. Not counted anywhere: the CUDA context and allocator fragmentation (plan for
about 1-2 GB), the optimizer step's temporary buffers, and the evaluation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from spectra.validate import check_int, check_number
from spectra_lab.errors import CLIError
from spectra_lab.train.build import model_config_of
from spectra_lab.train.sizes import activation_bytes
from spectra_lab.train.throughput import GPUS

#: GPT-2's vocabulary through tiktoken (rounded up to the config's vocab_multiple, as the
#: trainer does)
GPT2_VOCAB = 50257
BYTES = 4  # float32 weights, gradients and optimizer state


def vocab_of(cfg: Any) -> int:
    """The vocabulary the trainer would build the model with: a prepared dataset directory's
    ``meta.json``, else the tokenizer's (``bpe``: ``vocab_size``)."""
    meta = Path(cfg.dataset) / "meta.json"
    if meta.is_file():
        return int(json.loads(meta.read_text())["vocab_size"])
    from spectra_lab.data.tokenizers import TOKENIZERS
    from spectra_lab.train.config import ConfigError

    if cfg.tokenizer not in TOKENIZERS:
        raise ConfigError(
            f"config field 'tokenizer' = {cfg.tokenizer!r}: one of {', '.join(TOKENIZERS)}"
        )
    return {"gpt2": GPT2_VOCAB, "bytes": 256}.get(cfg.tokenizer, cfg.vocab_size)


def plan(cfg: Any, world_size: int = 1, gpu: str = "h100", mfu: float = 0.4) -> dict[str, Any]:
    """The plan of one config (``TrainConfig``) on ``world_size`` GPUs: sizes, time, memory."""
    from spectra_lab.bench.memory import formula
    from spectra_lab.model import Llama, flops_per_token
    from spectra_lab.train.optimizers import build_optimizer
    from spectra_lab.train.schedule import build_lr_lambda

    model_cfg = model_config_of(cfg, vocab_of(cfg))
    with torch.device("meta"):
        model = Llama(model_cfg)
    params = model.num_parameters()
    try:
        optimizer = build_optimizer(model, cfg, build_lr_lambda(cfg))
        state, state_formula = formula(cfg.optimizer, optimizer)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    accum = cfg.accumulation(world_size)
    sequences = cfg.batch_size * accum * world_size
    tokens_per_step = sequences * model_cfg.seq_len
    flops_step = flops_per_token(model_cfg) * tokens_per_step
    precision = "tf32" if cfg.autocast == "none" else "bf16"
    peak = getattr(GPUS[gpu], precision) * 1e12
    step_s = flops_step / (world_size * mfu * peak)

    act = activation_bytes(model_cfg, cfg.batch_size)
    sharded = {
        "weights": BYTES * params,
        "gradients": BYTES * params,
        "optimizer_state": BYTES * state,
    }
    activations = act["saved"] + act["loss_peak"]
    ddp = {
        **sharded,
        "ddp_buckets": BYTES * params if world_size > 1 else 0,
        "activations": activations,
    }
    block = sum(p.numel() for p in model.layers[0].parameters())
    root = params - model_cfg.n_layers * block
    fsdp2 = {
        **{k: v / world_size for k, v in sharded.items()},
        "gathered": 2 * BYTES * (root + 2 * block),
        "activations": activations,
    }
    return {
        "preset": cfg.preset,
        "parameters": params,
        "seq_len": model_cfg.seq_len,
        "micro_batch": cfg.batch_size,
        "grad_accum": accum,
        "tokens_per_step": tokens_per_step,
        "steps": cfg.steps,
        "tokens": tokens_per_step * cfg.steps,
        "flops_per_token": flops_per_token(model_cfg),
        "flops_per_step": flops_step,
        "precision": precision,
        "step_s": step_s,
        "total_s": step_s * cfg.steps,
        "optimizer": cfg.optimizer,
        "optimizer_state": state_formula,
        "activation_bytes": act,
        "memory_ddp": {**ddp, "total": sum(ddp.values())},
        "memory_fsdp2": {**fsdp2, "total": sum(fsdp2.values())},
    }


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{1e3 * seconds:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def format_tables(rows: list[dict[str, Any]], world_size: int, gpu: str, mfu: float) -> str:
    """Two markdown tables: sizes and time, then the memory per GPU."""
    gb = 1e9
    lines = [
        f"{world_size} x {GPUS[gpu].name} at MFU {mfu:g}; memory in GB (10^9 bytes) per GPU",
        "",
        "| config | optimizer | parameters | tokens/step | steps | tokens | FLOPs/step "
        "| step | total | DDP memory | FSDP2 memory |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['file']} | {r['optimizer']} | {r['parameters'] / 1e6:.1f}M "
            f"| {r['tokens_per_step']:,} | {r['steps']:,} | {r['tokens'] / 1e9:.2f}B "
            f"| {r['flops_per_step']:.3g} | {_duration(r['step_s'])} | {_duration(r['total_s'])} "
            f"| {r['memory_ddp']['total'] / gb:.1f} | {r['memory_fsdp2']['total'] / gb:.1f} |"
        )
    lines += [
        "",
        "| config | micro-batch | weights | gradients | optimizer state | DDP buckets "
        "| activations | FSDP2: sharded | FSDP2: gathered |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d, f = r["memory_ddp"], r["memory_fsdp2"]
        shards = f["weights"] + f["gradients"] + f["optimizer_state"]
        lines.append(
            f"| {r['file']} | {r['micro_batch']} x {r['seq_len']} "
            f"| {d['weights'] / gb:.2f} | {d['gradients'] / gb:.2f} "
            f"| {d['optimizer_state'] / gb:.2f} ({r['optimizer_state']}) "
            f"| {d['ddp_buckets'] / gb:.2f} | {d['activations'] / gb:.2f} "
            f"| {shards / gb:.2f} | {f['gathered'] / gb:.2f} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="+", metavar="CONFIG", help="training config files")
    parser.add_argument("--world-size", type=int, default=1, help="number of GPUs (1)")
    parser.add_argument(
        "--gpu", choices=sorted(GPUS), default="h100", help="GPU of the peak FLOP/s (h100)"
    )
    parser.add_argument("--mfu", type=float, default=0.4, help="assumed MFU, in (0, 1] (0.4)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")


def run(args: argparse.Namespace) -> int:
    from spectra_lab.files import write_json_atomic
    from spectra_lab.train.config import build_config, read_config_file

    try:
        check_int("--world-size", args.world_size, low=1)
        check_number("--mfu", args.mfu, low=0.0, high=1.0, low_open=True)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    rows = []
    for path in args.configs:
        cfg = build_config((path, read_config_file(path)))
        row = plan(cfg, args.world_size, args.gpu, args.mfu)
        rows.append({"file": path, **row})
    print(format_tables(rows, args.world_size, args.gpu, args.mfu), end="")
    if args.json:
        inputs = {"world_size": args.world_size, "gpu": args.gpu, "mfu": args.mfu}
        write_json_atomic(args.json, {**inputs, "rows": rows})
    return 0
