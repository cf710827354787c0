"""A Llama-style decoder-only transformer.

The architecture follows the setup of "Benchmarking Optimizers for Large Language Model
Pretraining" (Semenov et al., 2025), which "Enhancing LLM Training via Spectral Clipping"
adopts for its language-model experiments:

* pre-norm blocks ``x ← x + Attn(RMSNorm(x))``, ``x ← x + MLP(RMSNorm(x))`` with RMSNorm
  ``y = x / √(mean(x²) + ε) · g`` and ε = 1e-5;
* causal multi-head attention with rotary position embeddings (RoPE, θ = 10⁴) applied to
  queries and keys, computed by ``scaled_dot_product_attention(is_causal=True)``;
* a SwiGLU MLP ``W₂(SiLU(W₁x) ⊙ W₃x)`` whose hidden width defaults to
  ``256·⌈(8d/3)/256⌉``;
* with ``n_experts`` set, a mixture of SwiGLU experts instead (:class:`MoE`): a router picks
  the top ``experts_top_k`` experts of each token;
* no biases anywhere, untied input/output embeddings unless asked otherwise;
* weights drawn from N(0, 0.02²), with the two projections that write into the residual
  stream (attention ``wo`` and MLP ``w2``) drawn from N(0, (0.02/√(2L))²) (GPT-2's scaled
  residual initialisation); RMSNorm gains start at 1.

With ``mup_base_width`` set, the model is in the maximal-update parametrization (μP; Yang et
al., "Tensor Programs V", 2022) in the form of the ``mup_llama`` model of the code released
with "Enhancing LLM Training via Spectral Clipping", which the 1.5B training scripts linked by
the paper run (the paper's text says only that its 1.5B model uses μP), with width multiplier
``m = d_model / mup_base_width``:

* attention logits scaled by ``1/d_head`` instead of ``1/√d_head``;
* each residual branch multiplied by ``mup_scale_depth / √n_layers``;
* the embedding output multiplied by ``mup_scale_emb``;
* the logits divided by ``m``;
* the output projections ``wo`` and ``w2`` drawn from N(0, (init_std/√(2·n_layers·m))²).

The per-layer learning rates of μP (the hidden matrices' lr divided by ``m``) belong to the
optimizer's parameter groups, which the harness builds (``spectra_lab.train.optimizers``).

Module names are chosen so optimizer parameter groups are easy to select:
``tok_embeddings``, ``layers[i].attn.{wq,wk,wv,wo}``, ``layers[i].mlp.{w1,w2,w3}``,
``layers[i].attn_norm``, ``layers[i].mlp_norm``, ``norm`` and ``lm_head``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def swiglu_hidden(d_model: int, multiple_of: int = 256) -> int:
    """SwiGLU hidden width ``multiple_of · ⌈(8d/3) / multiple_of⌉``.

    The factor 8/3 keeps the three-matrix SwiGLU MLP at the parameter count of a
    4d-wide two-matrix MLP (Shazeer, "GLU Variants Improve Transformer", 2020); rounding up
    to a multiple of 256 follows Llama.
    """
    return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)


@dataclass
class ModelConfig:
    """Shape and initialisation of a :class:`Llama` model.

    ``mlp_hidden=None`` selects :func:`swiglu_hidden` of ``d_model``. ``seq_len`` is the
    longest context the model is built for (the RoPE table's length).
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    tie_embeddings: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 1e4
    init_std: float = 0.02
    mlp_hidden: int | None = None
    # μP (see the module docstring): None is the standard parametrization
    mup_base_width: int | None = None
    mup_scale_emb: float = 10.0
    mup_scale_depth: float = 1.4
    # a mixture of experts (0: the dense SwiGLU MLP); mlp_hidden is then each expert's width
    n_experts: int = 0
    experts_top_k: int = 2

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"head dimension d_model/n_heads={self.head_dim} must be even for RoPE"
            )
        if self.mlp_hidden is not None and (
            isinstance(self.mlp_hidden, bool)
            or not isinstance(self.mlp_hidden, int)
            or self.mlp_hidden < 1
        ):
            raise ValueError(
                f"mlp_hidden must be a positive integer or None, got {self.mlp_hidden!r}"
            )
        for name in ("n_experts", "experts_top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.n_experts and not 1 <= self.experts_top_k <= self.n_experts:
            raise ValueError(
                f"experts_top_k must be in [1, n_experts={self.n_experts}], got "
                f"{self.experts_top_k!r}"
            )
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be positive, got {self.norm_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if not self.init_std > 0:
            raise ValueError(f"init_std must be positive, got {self.init_std!r}")
        if self.mup_base_width is not None:
            base = self.mup_base_width
            if isinstance(base, bool) or not isinstance(base, int) or base < 1:
                raise ValueError(f"mup_base_width must be a positive integer, got {base!r}")
            if base < self.n_heads:
                raise ValueError(
                    f"mup_base_width={base} does not fit the model: the base model needs at "
                    f"least one coordinate per head (n_heads={self.n_heads})"
                )
            for name in ("mup_scale_emb", "mup_scale_depth"):
                if not getattr(self, name) > 0:
                    raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")

    @property
    def width_mult(self) -> float:
        """μP's width multiplier ``d_model / mup_base_width`` (1 without μP)."""
        return 1.0 if self.mup_base_width is None else self.d_model / self.mup_base_width

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden_dim(self) -> int:
        """The SwiGLU hidden width actually used."""
        return self.mlp_hidden if self.mlp_hidden is not None else swiglu_hidden(self.d_model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Shapes of the paper's Table "Configuration of the considered model architecture"
# (appendix: 124M, 160M, 780M, 820M) with the sequence lengths the paper gives (its
# hyperparameter tables; 512 for the 124M model of its spectral diagnostics), the 1.5B μP
# model, and two CPU sizes.
PRESETS: dict[str, dict[str, Any]] = {
    "124m": dict(d_model=768, n_heads=12, n_layers=12, tie_embeddings=True, seq_len=512),
    "160m": dict(d_model=768, n_heads=12, n_layers=12, tie_embeddings=False, seq_len=512),
    "780m": dict(d_model=1280, n_heads=20, n_layers=32, tie_embeddings=False, seq_len=1024),
    "820m": dict(d_model=2048, n_heads=16, n_layers=12, tie_embeddings=False, seq_len=1024),
    # The 1.5B μP model of the paper's Table "Short training of 1.5B muP models": the paper's
    # text gives no shape; this one (and the context of 512) is that of the training scripts
    # the table links (scripts/1.5b-mup-models of github.com/mlolab/llm-spectral-clipping)
    "1.5b": dict(d_model=1536, n_heads=24, n_layers=48, tie_embeddings=False, seq_len=512),
    # For tests: about 130k parameters besides the embeddings.
    "tiny": dict(d_model=64, n_heads=4, n_layers=2, tie_embeddings=False, seq_len=64),
    # The default CPU run (about 3M parameters with a 4096-token vocabulary): a few hundred
    # steps of batch 16 x 256 tokens take minutes on two cores.
    "cpu-small": dict(d_model=192, n_heads=6, n_layers=4, tie_embeddings=False, seq_len=256),
    # A mixture of experts for the CPU: 4 SwiGLU experts of width 192 per layer, top-2 routing
    # (2.0M parameters besides the input embedding, 1.4M of them active per token).
    "cpu-moe": dict(
        d_model=128,
        n_heads=4,
        n_layers=4,
        tie_embeddings=False,
        seq_len=256,
        mlp_hidden=192,
        n_experts=4,
        experts_top_k=2,
    ),
}


def model_config(
    preset: str,
    vocab_size: int,
    seq_len: int | None = None,
    *,
    vocab_multiple: int = 1,
    **overrides: Any,
) -> ModelConfig:
    """The :class:`ModelConfig` of a named preset, for a given vocabulary size.

    ``seq_len=None`` keeps the preset's own context length. ``vocab_multiple`` rounds the
    vocabulary up to a multiple (the paper's vocabulary of 50,304 = 64·786 rows holds GPT-2's
    50,257 tokens); the extra rows are never targets, so they only cost memory.
    ``overrides`` replace other :class:`ModelConfig` fields (``d_model``, ``n_layers``,
    ``n_heads``, the μP fields, ...); a None value keeps the preset's.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    if vocab_multiple < 1:
        raise ValueError(f"vocab_multiple must be a positive integer, got {vocab_multiple}")
    kwargs = dict(PRESETS[preset])
    if seq_len is not None:
        kwargs["seq_len"] = seq_len
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    padded = vocab_multiple * math.ceil(vocab_size / vocab_multiple)
    return ModelConfig(vocab_size=padded, **kwargs)


# --------------------------------------------------------------------------- layers


class RMSNorm(nn.Module):
    """``y = x / √(mean(x²) + ε) · g`` over the last dimension, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def rope_frequencies(
    head_dim: int, seq_len: int, theta: float = 1e4, device: torch.device | None = None
) -> tuple[Tensor, Tensor]:
    """``(cos, sin)`` tables of shape ``[seq_len, head_dim/2]`` for RoPE.

    Entry ``[t, i]`` is the rotation angle ``t · θ^(-2i/head_dim)`` (Su et al., "RoFormer",
    2021), evaluated in float32.
    """
    inv_freq = theta ** (
        -torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    )
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate consecutive pairs ``(x[2i], x[2i+1])`` of ``x: [B, T, H, D]`` by position.

    Viewing each pair as the complex number ``x[2i] + i·x[2i+1]`` (the Llama convention),
    this is the product with ``exp(i · t · θ^(-2i/D))``. ``cos`` and ``sin`` are the first
    ``T`` rows of :func:`rope_frequencies`.
    """
    xf = x.float().unflatten(-1, (-1, 2))
    x_re, x_im = xf[..., 0], xf[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    out = torch.stack((x_re * c - x_im * s, x_re * s + x_im * c), dim=-1)
    return out.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.head_dim
        # μP scales the logits by 1/d_head; None is SDPA's default 1/√d_head
        self.scale = None if cfg.mup_base_width is None else 1.0 / cfg.head_dim
        d = cfg.d_model
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T, _ = x.shape
        # -1 heads: under tensor parallelism each rank computes its own n_heads / tp
        q = self.wq(x).view(B, T, -1, self.head_dim)
        k = self.wk(x).view(B, T, -1, self.head_dim)
        v = self.wv(x).view(B, T, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            scale=self.scale,
        )
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    """``W₂(SiLU(W₁x) ⊙ W₃x)``."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    r"""A mixture of SwiGLU experts with top-k routing (Mixtral: Jiang et al., "Mixtral of
    Experts", 2024): ``y = Σ_{e ∈ top-k} p_e · W₂ₑ(SiLU(W₁ₑx) ⊙ W₃ₑx)`` with ``p`` the softmax of
    the router's logits over the k chosen experts.

    The experts are stored as transformers' Mixtral stores them: ``gate_up_proj`` of shape
    ``(E, 2·hidden, d)`` (each expert's W₁ above its W₃) and ``down_proj`` of shape
    ``(E, d, hidden)``. ``hidden_dim`` (the model's width) tells
    :func:`spectra.matrix_param_groups` which side of a stack is the model's.
    """

    def __init__(self, d_model: int, hidden: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        self.hidden_dim = d_model
        self.top_k = top_k
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * hidden, d_model))
        self.down_proj = nn.Parameter(torch.empty(n_experts, d_model, hidden))

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits = self.router(flat)  # routed in float32 at least (bf16 would tie experts)
        probs, expert = logits.to(torch.promote_types(logits.dtype, torch.float32)).topk(
            self.top_k, dim=-1
        )
        probs = probs.softmax(dim=-1).to(x.dtype)  # = the full softmax renormalised over top-k
        out = torch.zeros_like(flat)
        for e in range(self.gate_up_proj.shape[0]):
            token, slot = torch.where(expert == e)
            gate, up = (flat[token] @ self.gate_up_proj[e].T).chunk(2, dim=-1)
            y = (F.silu(gate) * up) @ self.down_proj[e].T
            out.index_add_(0, token, y * probs[token, slot, None])
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp: nn.Module = SwiGLU(cfg.d_model, cfg.hidden_dim)
        if cfg.n_experts:
            self.mlp = MoE(cfg.d_model, cfg.hidden_dim, cfg.n_experts, cfg.experts_top_k)
        # μP multiplies each residual branch by scale_depth/√L
        mup = cfg.mup_base_width is not None
        self.branch_scale = cfg.mup_scale_depth / math.sqrt(cfg.n_layers) if mup else 1.0

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if self.branch_scale == 1.0:
            x = x + self.attn(self.attn_norm(x), cos, sin)
            return x + self.mlp(self.mlp_norm(x))
        x = x + self.branch_scale * self.attn(self.attn_norm(x), cos, sin)
        return x + self.branch_scale * self.mlp(self.mlp_norm(x))


# --------------------------------------------------------------------------- model


class Llama(nn.Module):
    """Llama-style language model; see the module docstring for the architecture.

    To build a large model without allocating it (e.g. to count parameters), construct it
    under ``with torch.device("meta"):``; after ``to_empty(device=...)`` call
    :meth:`init_weights` to draw the weights and rebuild the RoPE tables.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_embeddings.weight
        # Not persistent: rebuilt from the config, never stored in checkpoints.
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Draw all weights as described in the module docstring; rebuild RoPE tables."""
        cfg = self.cfg
        std = cfg.init_std
        residual_std = std / math.sqrt(2 * cfg.n_layers * cfg.width_mult)
        nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=std)
        if not cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=std)
        for layer in self.layers:
            mlp = layer.mlp
            if isinstance(mlp, MoE):
                drawn = [mlp.router.weight, mlp.gate_up_proj]
                residual = [mlp.down_proj]
            else:
                drawn, residual = [mlp.w1.weight, mlp.w3.weight], [mlp.w2.weight]
            attn = layer.attn
            for w in (attn.wq.weight, attn.wk.weight, attn.wv.weight, *drawn):
                nn.init.normal_(w, mean=0.0, std=std)
            for w in (attn.wo.weight, *residual):
                nn.init.normal_(w, mean=0.0, std=residual_std)
            layer.attn_norm.reset_parameters()
            layer.mlp_norm.reset_parameters()
        self.norm.reset_parameters()
        cos, sin = rope_frequencies(
            cfg.head_dim, cfg.seq_len, cfg.rope_theta, device=self.tok_embeddings.weight.device
        )
        self.rope_cos, self.rope_sin = cos, sin

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Logits ``[B, T, vocab]`` and, given targets, the mean next-token cross-entropy.

        Target entries equal to -100 are ignored (``F.cross_entropy``'s default).
        """
        T = idx.shape[1]
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence length {T} exceeds the model's seq_len={self.cfg.seq_len}")
        x = self.tok_embeddings(idx)
        if self.cfg.mup_base_width is not None:
            x = x * self.cfg.mup_scale_emb
        cos, sin = self.rope_cos[:T].float(), self.rope_sin[:T].float()
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        if self.cfg.mup_base_width is not None:
            logits = logits / self.cfg.width_mult
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of distinct parameters (a tied matrix counts once).

        ``exclude_embeddings=True`` leaves out the input embedding table. With tied
        embeddings the shared matrix is kept: it also acts as the output layer.
        """
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings and not self.cfg.tie_embeddings:
            n -= self.tok_embeddings.weight.numel()
        return n

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Extend ``idx: [B, T]`` by ``max_new_tokens`` sampled tokens.

        Each step feeds the last ``seq_len`` tokens, divides the final logits by
        ``temperature`` (0 means greedy decoding), keeps the ``top_k`` largest if given,
        and samples from the softmax.
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be a positive integer or None, got {top_k}")
        for _ in range(max_new_tokens):
            context = idx[:, -self.cfg.seq_len :]
            logits, _ = self(context)
            logits = logits[:, -1, :].float()
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                next_id = torch.multinomial(probs, num_samples=1, generator=generator)
            idx = torch.cat((idx, next_id), dim=1)
        return idx
