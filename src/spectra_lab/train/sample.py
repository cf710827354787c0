"""``spectra sample``: generate text from a checkpoint (a file or a DCP directory of an FSDP2
run, or a run directory's latest), in one process."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn

from spectra.validate import check_int, check_number
from spectra_lab.errors import CLIError
from spectra_lab.train.checkpoint import load_checkpoint, load_model_weights, resolve_checkpoint


def load_model(ckpt: str | Path, device: str = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """The model saved in ``ckpt`` (checkpoint or run directory) in eval mode, and the
    checkpoint (for a directory checkpoint: its trainer file, without model and optimizer)."""
    from spectra_lab.model import Llama, ModelConfig

    path = resolve_checkpoint(ckpt)
    state = load_checkpoint(path, map_location="cpu")
    model = Llama(ModelConfig(**state["model_config"]))
    if "model" in state:
        model.load_state_dict(state["model"])
    else:  # the shards of an FSDP2 run, read whole
        load_model_weights(path, model)
    return model.to(device).eval(), state


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, metavar="PATH", help="checkpoint or run dir")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: newline)")
    parser.add_argument("--tokens", type=int, default=200, help="new tokens to generate")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=None, help="sample from the top k only")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")


def run(args: argparse.Namespace) -> int:
    from spectra_lab.data import load_tokenizer

    try:
        check_int("--tokens", args.tokens, low=1)
        check_number("--temperature", args.temperature, low=0.0, low_open=True)
        check_int("--top-k", args.top_k, low=1, none_ok=True)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    model, state = load_model(args.ckpt, device=args.device)
    tokenizer = load_tokenizer(Path(state["dataset_dir"]))
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise CLIError(f"--prompt {args.prompt!r} encodes to no tokens")
    torch.manual_seed(args.seed)
    idx = torch.tensor([ids], dtype=torch.long, device=args.device)
    with torch.no_grad():
        out = model.generate(idx, args.tokens, temperature=args.temperature, top_k=args.top_k)
    print(tokenizer.decode(out[0].tolist()))
    return 0
