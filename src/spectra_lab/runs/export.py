"""``spectra export RUN --format hf --out DIR``: a run in the Hugging Face Llama format.

The harness's model is a Llama (pre-norm RMSNorm, RoPE, SwiGLU, no biases), so its weights map
one to one onto ``transformers``' ``LlamaForCausalLM``:

================================  ==========================================================
spectra                           Hugging Face
================================  ==========================================================
``tok_embeddings``                ``model.embed_tokens`` (× μP's embedding multiplier)
``layers.i.attn.wq``, ``wk``      ``self_attn.q_proj``, ``k_proj``: rows permuted (RoPE)
``layers.i.attn.wv``, ``wo``      ``self_attn.v_proj``, ``o_proj`` (× μP's branch scale)
``layers.i.mlp.w1``, ``w3``       ``mlp.gate_proj``, ``up_proj``
``layers.i.mlp.w2``               ``mlp.down_proj`` (× μP's branch scale)
``attn_norm``, ``mlp_norm``       ``input_layernorm``, ``post_attention_layernorm``
``norm``, ``lm_head``             ``model.norm``, ``lm_head`` (÷ μP's width multiplier)
================================  ==========================================================

**RoPE.** spectra rotates consecutive pairs ``(x[2i], x[2i+1])`` of each head; Hugging Face's
``rotate_half`` rotates ``(x[i], x[i + D/2])``. Reordering each head's rows of ``wq`` and
``wk`` as ``[0, 2, 4, …, 1, 3, 5, …]`` turns one into the other and leaves every ``q·k``
unchanged (the permutation Hugging Face's own Llama conversion applies).

**μP** multiplies the embeddings by ``scale_emb``, each residual branch by
``scale_depth/√L``, the attention logits by ``1/d_head`` instead of ``1/√d_head`` and the
logits by ``1/width_mult``: all linear, so they are folded into ``embed_tokens``, ``o_proj`` and
``down_proj``, ``q_proj`` (× ``1/√d_head``) and ``lm_head``. With tied embeddings the
embedding and the head would need different factors, so such a run is refused in one line.

**Tokenizer.** The BPE tokenizer is written as its ``tokenizer.json``, the byte tokenizer as
a byte-level BPE without merges (id = byte), both for ``PreTrainedTokenizerFast``; GPT-2's is
written as its ``vocab.json`` and ``merges.txt`` from tiktoken's cache, or refused in one line
when they are not cached. No special token is added to an encoding, as in the harness.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from spectra_lab.errors import CLIError
from spectra_lab.files import atomic_path, atomic_write

FORMATS = ("hf",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory or checkpoint")
    parser.add_argument("--format", choices=FORMATS, default="hf", help="hf: Hugging Face Llama")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise CLIError(f"--out {out} is not empty; pass --overwrite to replace its files")
    export_hf(args.run, out)
    print(f"exported {args.run} to {out} (Hugging Face LlamaForCausalLM)")
    return 0


# --------------------------------------------------------------------------- weights


def rotary_rows(w: Tensor, n_heads: int) -> Tensor:
    """Rows of a ``q``/``k`` projection reordered from interleaved RoPE pairs to halves."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The weights of ``LlamaForCausalLM`` equal to ``model`` (μP folded; tied: one table)."""
    cfg = model.cfg
    if getattr(cfg, "n_experts", 0):
        raise CLIError(
            f"a run with expert layers (n_experts = {cfg.n_experts}) cannot be exported: the "
            "Hugging Face Llama format has no experts"
        )
    mup = cfg.mup_base_width is not None
    if mup and cfg.tie_embeddings:
        raise CLIError(
            "a μP run with tied embeddings cannot be exported: its embedding and head need "
            f"different multipliers ({cfg.mup_scale_emb:g} and 1/{cfg.width_mult:g})"
        )
    emb_scale = cfg.mup_scale_emb if mup else 1.0
    q_scale = 1.0 / math.sqrt(cfg.head_dim) if mup else 1.0
    head_scale = 1.0 / cfg.width_mult if mup else 1.0
    sd: dict[str, Tensor] = {
        "model.embed_tokens.weight": model.tok_embeddings.weight * emb_scale,
        "model.norm.weight": model.norm.weight,
    }
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = model.lm_head.weight * head_scale
    for i, layer in enumerate(model.layers):
        pre, branch = f"model.layers.{i}.", layer.branch_scale
        sd.update({
            pre + "input_layernorm.weight": layer.attn_norm.weight,
            pre + "post_attention_layernorm.weight": layer.mlp_norm.weight,
            pre + "self_attn.q_proj.weight": rotary_rows(layer.attn.wq.weight, cfg.n_heads)
            * q_scale,
            pre + "self_attn.k_proj.weight": rotary_rows(layer.attn.wk.weight, cfg.n_heads),
            pre + "self_attn.v_proj.weight": layer.attn.wv.weight,
            pre + "self_attn.o_proj.weight": layer.attn.wo.weight * branch,
            pre + "mlp.gate_proj.weight": layer.mlp.w1.weight,
            pre + "mlp.up_proj.weight": layer.mlp.w3.weight,
            pre + "mlp.down_proj.weight": layer.mlp.w2.weight * branch,
        })  # fmt: skip
    return {k: v.detach().float().contiguous().clone() for k, v in sd.items()}


def hf_config(cfg: Any, eot_id: int | None) -> dict[str, Any]:
    """``config.json`` of ``LlamaForCausalLM`` for a :class:`~spectra_lab.model.ModelConfig`."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.hidden_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,  # transformers 4
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},  # 5
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": cfg.init_std,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "torch_dtype": "float32",
    }


# --------------------------------------------------------------------------- tokenizer


def byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte 0…255 (the byte-level pre-tokenizer's map)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer_json() -> str:
    """The byte tokenizer (id = UTF-8 byte) as a byte-level BPE without merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(byte_level_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


def tiktoken_cache_dir() -> Path:
    """Where tiktoken keeps the files it downloads (its own rule)."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def write_tokenizer(tokenizer: Any, out: Path, seq_len: int) -> None:
    """The tokenizer files ``AutoTokenizer.from_pretrained(out)`` reads."""
    import hashlib

    from spectra_lab.data.tokenizers import _GPT2_URLS, EOT_TEXT

    config: dict[str, Any] = {"model_max_length": seq_len, "clean_up_tokenization_spaces": False}
    if tokenizer.name == "bpe":
        atomic_write(out / "tokenizer.json", tokenizer._tok.to_str())
        config.update(tokenizer_class="PreTrainedTokenizerFast", eos_token=EOT_TEXT)
    elif tokenizer.name == "bytes":
        atomic_write(out / "tokenizer.json", byte_tokenizer_json())
        config.update(tokenizer_class="PreTrainedTokenizerFast")
    elif tokenizer.name == "gpt2":
        cache = tiktoken_cache_dir()
        files = [cache / hashlib.sha1(url.encode()).hexdigest() for url in _GPT2_URLS]
        if not all(f.exists() for f in files):
            raise CLIError(
                f"the gpt2 tokenizer's files (vocab.bpe, encoder.json) are not in tiktoken's "
                f"cache {cache}; run once with internet access or set TIKTOKEN_CACHE_DIR"
            )
        atomic_write(out / "merges.txt", files[0].read_text(encoding="utf-8"))
        atomic_write(out / "vocab.json", files[1].read_text(encoding="utf-8"))
        config.update(tokenizer_class="GPT2TokenizerFast", eos_token=EOT_TEXT, bos_token=EOT_TEXT,
                      add_bos_token=False)  # fmt: skip
    else:
        raise CLIError(f"the {tokenizer.name!r} tokenizer has no Hugging Face export")
    atomic_write(out / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")


# --------------------------------------------------------------------------- the export


def export_hf(ckpt: str | Path, out: str | Path) -> Path:
    """Write the run (or checkpoint) ``ckpt`` to ``out`` in the Hugging Face Llama format."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise CLIError("spectra export needs safetensors: pip install -e '.[hf]'") from None

    from spectra_lab.data import load_tokenizer
    from spectra_lab.runs.model import load_model

    model, state = load_model(ckpt, option="RUN")
    # refuses expert layers and μP with tied embeddings before anything else
    weights = hf_state_dict(model)
    tokenizer = load_tokenizer(Path(state["dataset_dir"]))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(tokenizer, out, model.cfg.seq_len)
    eot = tokenizer.eot_id
    atomic_write(out / "config.json", json.dumps(hf_config(model.cfg, eot), indent=2) + "\n")
    generation = {"bos_token_id": eot, "eos_token_id": eot, "do_sample": False}
    atomic_write(out / "generation_config.json", json.dumps(generation, indent=2) + "\n")
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(weights, str(tmp), metadata={"format": "pt"})
    return out
