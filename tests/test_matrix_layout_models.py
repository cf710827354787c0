"""Real models through ``spectra.matrix_param_groups``: transformers' own Mixtral (3-D expert
stacks, fused gate/up) and GPT-2 (``Conv1D`` weights stored (in, out), fused q/k/v), trained a
few steps with Spectra-AdamW, equal the same models rebuilt with one ``nn.Linear`` per expert
and per block under the default rule."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, MixtralConfig, MixtralForCausalLM

import spectra

STEPS = 3
SETTINGS = {"lr": 1e-2, "clip_c": 1.0, "clip_method": "eigh"}  # an exact clip: batching-free


def _batch(vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (4, 16), generator=torch.Generator().manual_seed(seed))


def _loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _train(model: nn.Module, opt: torch.optim.Optimizer, logits_of, vocab: int) -> None:
    for step in range(STEPS):
        opt.zero_grad()
        ids = _batch(vocab, step)
        _loss(logits_of(model, ids), ids).backward()
        for p in model.parameters():  # an expert no token chose still takes its AdamW step
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()


# --------------------------------------------------------------------------- Mixtral


class LinearExperts(nn.Module):
    """Mixtral's experts with one ``nn.Linear`` per expert and per gate, up and down."""

    def __init__(self, experts: nn.Module) -> None:
        super().__init__()
        E, two_i, H = experts.gate_up_proj.shape
        I = two_i // 2

        def linears(n_in, n_out, weights):
            out = nn.ModuleList(
                nn.Linear(n_in, n_out, bias=False, dtype=torch.float64) for _ in range(E)
            )
            with torch.no_grad():
                for lin, w in zip(out, weights, strict=True):
                    lin.weight.copy_(w)
            return out

        self.gate = linears(H, I, experts.gate_up_proj[:, :I])
        self.up = linears(H, I, experts.gate_up_proj[:, I:])
        self.down = linears(I, H, experts.down_proj)
        self.act_fn = experts.act_fn

    def forward(self, hidden, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden)
        for e in range(len(self.gate)):
            token, slot = torch.where(top_k_index == e)
            x = hidden[token]
            y = self.down[e](self.act_fn(self.gate[e](x)) * self.up[e](x))
            out.index_add_(0, token, y * top_k_weights[token, slot, None])
        return out


def _mixtral() -> MixtralForCausalLM:
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=32,
    )
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"  # the loop over experts, which takes float64
    return MixtralForCausalLM(config).double()


def _mixtral_logits(model, ids):
    return model(input_ids=ids).logits


def test_tiny_mixtral_through_the_helper_equals_one_linear_per_expert_and_block():
    model = _mixtral()
    rebuilt = copy.deepcopy(model)
    for layer in rebuilt.model.layers:
        layer.mlp.experts = LinearExperts(layer.mlp.experts)
    whole = copy.deepcopy(model)
    _train(
        model, spectra.AdamW(spectra.matrix_param_groups(model, **SETTINGS)), _mixtral_logits, 64
    )
    _train(rebuilt, spectra.AdamW(rebuilt.parameters(), **SETTINGS), _mixtral_logits, 64)
    _train(whole, spectra.AdamW(whole.parameters(), **SETTINGS), _mixtral_logits, 64)

    own = dict(rebuilt.named_parameters())
    worst_whole = 0.0
    for name, p in model.named_parameters():
        if "experts" not in name:
            torch.testing.assert_close(p, own[name], rtol=0, atol=1e-5, msg=name)
            continue
        prefix = name.rsplit(".", 1)[0]
        if name.endswith("gate_up_proj"):
            gate = torch.stack([own[f"{prefix}.gate.{e}.weight"] for e in range(4)])
            up = torch.stack([own[f"{prefix}.up.{e}.weight"] for e in range(4)])
            expected = torch.cat([gate, up], dim=1)
        else:
            expected = torch.stack([own[f"{prefix}.down.{e}.weight"] for e in range(4)])
        torch.testing.assert_close(p, expected, rtol=0, atol=1e-5, msg=name)
        # the default rule's one clip of (E, 2I·H) is another update
        worst_whole = max(
            worst_whole, float((dict(whole.named_parameters())[name] - p).abs().max())
        )
    assert worst_whole > 1e-3


# --------------------------------------------------------------------------- GPT-2


class Block(nn.Module):
    def __init__(self, d: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, d = x.shape
        h = self.ln_1(x)
        q, k, v = (
            lin(h).view(B, T, self.heads, -1).transpose(1, 2) for lin in (self.q, self.k, self.v)
        )
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(B, T, d))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class SeparateQKV(nn.Module):
    """GPT-2 written Llama-style: ``nn.Linear`` layers stored (out, in), q, k and v apart."""

    def __init__(self, hf: GPT2LMHeadModel) -> None:
        super().__init__()
        c = hf.config
        t = hf.transformer
        self.wte, self.wpe = copy.deepcopy(t.wte), copy.deepcopy(t.wpe)
        self.ln_f = copy.deepcopy(t.ln_f)
        self.blocks = nn.ModuleList(Block(c.n_embd, c.n_head, c.layer_norm_epsilon) for _ in t.h)
        d = c.n_embd
        with torch.no_grad():
            for ours, theirs in zip(self.blocks, t.h, strict=True):
                ours.ln_1.load_state_dict(theirs.ln_1.state_dict())
                ours.ln_2.load_state_dict(theirs.ln_2.state_dict())
                w, b = theirs.attn.c_attn.weight, theirs.attn.c_attn.bias
                for i, lin in enumerate((ours.q, ours.k, ours.v)):
                    lin.weight.copy_(w[:, i * d : (i + 1) * d].T)
                    lin.bias.copy_(b[i * d : (i + 1) * d])
                for lin, conv in ((ours.o, theirs.attn.c_proj), (ours.fc, theirs.mlp.c_fc),
                                  (ours.proj, theirs.mlp.c_proj)):  # fmt: skip
                    lin.weight.copy_(conv.weight.T)
                    lin.bias.copy_(conv.bias)
        self.double()

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T  # the tied head


def test_tiny_gpt2_through_the_helper_equals_separate_qkv_linears():
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config).double()
    rebuilt = SeparateQKV(model)
    groups = spectra.matrix_param_groups(model, **SETTINGS)
    c_attn = [g for g in groups if g.get("clip_split") is not None]
    assert [g["clip_split"] for g in c_attn] == [((16, 16, 16), 1)]
    assert all(g.get("clip_transposed") for g in c_attn)
    _train(model, spectra.AdamW(groups), lambda m, ids: m(input_ids=ids).logits, 64)
    _train(rebuilt, spectra.AdamW(rebuilt.parameters(), **SETTINGS), lambda m, ids: m(ids), 64)

    t, d = model.transformer, 16
    close = lambda a, b, msg: torch.testing.assert_close(a, b, rtol=0, atol=1e-5, msg=msg)  # noqa: E731
    close(t.wte.weight, rebuilt.wte.weight, "wte")
    close(t.wpe.weight, rebuilt.wpe.weight, "wpe")
    for i, (theirs, ours) in enumerate(zip(t.h, rebuilt.blocks, strict=True)):
        for j, lin in enumerate((ours.q, ours.k, ours.v)):
            close(theirs.attn.c_attn.weight[:, j * d : (j + 1) * d].T, lin.weight, f"{i} qkv {j}")
            close(theirs.attn.c_attn.bias[j * d : (j + 1) * d], lin.bias, f"{i} qkv bias {j}")
        for conv, lin in ((theirs.attn.c_proj, ours.o), (theirs.mlp.c_fc, ours.fc),
                          (theirs.mlp.c_proj, ours.proj)):  # fmt: skip
            close(conv.weight.T, lin.weight, f"{i} conv")
            close(conv.bias, lin.bias, f"{i} conv bias")


def test_a_grouped_query_fused_qkv_is_split_by_the_attention_head_counts():
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(
        vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
    )  # fmt: skip
    model = Phi3ForCausalLM(config)
    layer = model.model.layers[0]
    layouts = {}
    for g in spectra.matrix_param_groups(model):
        for p in g["params"]:
            layouts[id(p)] = g.get("clip_split")
    # q: 4 heads of 4, k and v: 2 heads of 4; the fused gate/up in halves
    assert layouts[id(layer.self_attn.qkv_proj.weight)] == ((16, 8, 8), 0)
    assert layouts[id(layer.mlp.gate_up_proj.weight)] == ((24, 24), 0)
