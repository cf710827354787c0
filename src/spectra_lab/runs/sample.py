"""``spectra sample``: generate text from a checkpoint (a file or a DCP directory of an FSDP2
run, or a run directory's latest), in one process."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from spectra.validate import check_int, check_number
from spectra_lab.errors import CLIError
from spectra_lab.runs.model import check_device, load_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ckpt", required=True, metavar="PATH", help="checkpoint or run dir")
    parser.add_argument("--prompt", default="\n", help="text to continue (default: newline)")
    parser.add_argument("--tokens", type=int, default=200, help="new tokens to generate")
    parser.add_argument(
        "--temperature", type=float, default=0.8,
        help="divides the logits (default 0.8); 0: greedy decoding, the likeliest token each time",
    )  # fmt: skip
    parser.add_argument(
        "--top-k", type=int, default=None, help="sample from the top k only (not when greedy)"
    )
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")


def run(args: argparse.Namespace) -> int:
    from spectra_lab.data import load_tokenizer

    try:
        check_int("--tokens", args.tokens, low=1)
        check_number("--temperature (0: greedy decoding)", args.temperature, low=0.0)
        check_int("--top-k", args.top_k, low=1, none_ok=True)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    check_device("--device", args.device)
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
