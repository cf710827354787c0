"""Training FLOPs per token of a :class:`~spectra_lab.model.Llama`, from its shape alone.

One token of training (forward and backward) costs

    flops_per_token = 6 · N_matmul + 12 · n_layers · d_model · seq_len

the estimate of PaLM's appendix B (Chowdhery et al., 2022, "PaLM: Scaling Language Modeling
with Pathways"), which nanoGPT's ``estimate_mfu`` also uses:

* ``N_matmul`` counts the weights that take part in matrix products: per block the four
  attention matrices (4·d²) and the three SwiGLU matrices (3·d·hidden; a mixture of experts:
  those of the top-k experts a token meets, and the router's d·E), plus the output head
  (d·vocab, tied or not). The input embedding is a table lookup and is left out. Each such
  weight costs 2 FLOPs per token in the forward pass (a multiply and an add) and 4 in the
  backward pass (the gradients of its input and of itself): 6 in all.
* Attention's own products, ``QKᵀ`` and ``(softmax)·V``, cost 2·2·seq_len·d_model FLOPs per
  token and layer forward, three times that with the backward pass. The causal mask is not
  taken into account (no halving), as in PaLM and nanoGPT: the count is the work of the
  dense products, and MFU comparisons across codebases assume it.

Norms, RoPE, the SwiGLU gate, the softmax and the loss are left out (a few percent of the
matrix products at the presets' sizes). ``torch.utils.flop_counter.FlopCounterMode`` over a
forward and backward pass counts exactly this number (``tests/test_model_flops.py``).
"""

from __future__ import annotations

from typing import Any


def matmul_parameters(cfg: Any) -> int:
    """``N_matmul``: the weights of the attention and MLP matrices and of the output head."""
    d = cfg.d_model
    experts = getattr(cfg, "n_experts", 0)
    active = cfg.experts_top_k if experts else 1  # a token meets its top-k experts only
    per_block = 4 * d * d + 3 * d * cfg.hidden_dim * active + d * experts  # (+ the router)
    return cfg.n_layers * per_block + d * cfg.vocab_size


def flops_per_token(cfg: Any) -> int:
    """Training FLOPs per token of the model ``cfg`` (a ``ModelConfig``) at its ``seq_len``:
    ``6 · N_matmul + 12 · n_layers · d_model · seq_len`` (see the module docstring)."""
    return 6 * matmul_parameters(cfg) + 12 * cfg.n_layers * cfg.d_model * cfg.seq_len
