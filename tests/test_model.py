"""The Llama-style model against closed forms and an independent float64 reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from spectra_lab.model import (
    PRESETS,
    Llama,
    ModelConfig,
    apply_rope,
    model_config,
    rope_frequencies,
    swiglu_hidden,
)

GPT2_VOCAB = 50304  # the paper's padded GPT-2 vocabulary


def tiny_cfg(**overrides) -> ModelConfig:
    kw = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, seq_len=16)
    kw.update(overrides)
    return ModelConfig(**kw)


def closed_form_params(V: int, d: int, L: int, h: int, tied: bool, experts: int = 0) -> int:
    """Embeddings (+ untied head) + per layer (4 d² attention + 3 d h SwiGLU, or E such
    experts and the d·E router, + 2 d gains) + d."""
    mlp = experts * (3 * d * h + d) if experts else 3 * d * h
    return V * d * (1 if tied else 2) + L * (4 * d * d + mlp + 2 * d) + d


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("preset", list(PRESETS))
def test_preset_parameter_count_matches_closed_form(preset):
    cfg = model_config(preset, GPT2_VOCAB)
    with torch.device("meta"):
        model = Llama(cfg)
    p = PRESETS[preset]
    h = p.get("mlp_hidden") or swiglu_hidden(p["d_model"])
    expected = closed_form_params(
        GPT2_VOCAB, p["d_model"], p["n_layers"], h, p["tie_embeddings"], p.get("n_experts", 0)
    )
    assert model.num_parameters() == expected
    emb = GPT2_VOCAB * p["d_model"]
    assert model.num_parameters(exclude_embeddings=True) == expected - (
        0 if p["tie_embeddings"] else emb
    )
    assert all(t.is_meta for t in model.parameters())


@pytest.mark.parametrize(
    ("preset", "nominal"), [("124m", 124e6), ("160m", 160e6), ("780m", 780e6), ("820m", 820e6)]
)
def test_paper_presets_have_their_nominal_size(preset, nominal):
    with torch.device("meta"):
        n = Llama(model_config(preset, GPT2_VOCAB)).num_parameters()
    assert abs(n - nominal) / nominal < 0.015


def test_paper_table_shapes():
    expect = {
        "124m": (768, 12, 12, True),
        "160m": (768, 12, 12, False),
        "780m": (1280, 20, 32, False),
        "820m": (2048, 16, 12, False),
    }
    for name, (d, heads, layers, tied) in expect.items():
        cfg = model_config(name, 1000)
        assert (cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.tie_embeddings) == (
            d,
            heads,
            layers,
            tied,
        )
        assert cfg.norm_eps == 1e-5 and cfg.rope_theta == 1e4 and cfg.init_std == 0.02


def test_model_config_seq_len_override_and_vocab_padding():
    assert model_config("tiny", 50).seq_len == PRESETS["tiny"]["seq_len"]
    assert model_config("tiny", 50, seq_len=7).seq_len == 7
    assert model_config("124m", 50257).vocab_size == 50257
    assert model_config("124m", 50257, vocab_multiple=64).vocab_size == GPT2_VOCAB
    assert model_config("124m", 4096, vocab_multiple=64).vocab_size == 4096


def test_swiglu_hidden_formula():
    assert [swiglu_hidden(d) for d in (768, 1280, 2048, 64, 192)] == [2048, 3584, 5632, 256, 512]
    for d in range(1, 3000, 7):
        h = swiglu_hidden(d)
        assert h % 256 == 0 and h >= 8 * d / 3 > h - 256
    assert tiny_cfg(mlp_hidden=40).hidden_dim == 40
    m = Llama(tiny_cfg(mlp_hidden=40))
    assert m.layers[0].mlp.w1.weight.shape == (40, 32)
    assert m.layers[0].mlp.w2.weight.shape == (32, 40)


def test_module_names_for_param_groups():
    model = Llama(tiny_cfg(n_layers=1))
    names = {n: tuple(p.shape) for n, p in model.named_parameters()}
    d, V, h = 32, 97, swiglu_hidden(32)
    assert names == {
        "tok_embeddings.weight": (V, d),
        "layers.0.attn_norm.weight": (d,),
        "layers.0.attn.wq.weight": (d, d),
        "layers.0.attn.wk.weight": (d, d),
        "layers.0.attn.wv.weight": (d, d),
        "layers.0.attn.wo.weight": (d, d),
        "layers.0.mlp_norm.weight": (d,),
        "layers.0.mlp.w1.weight": (h, d),
        "layers.0.mlp.w2.weight": (d, h),
        "layers.0.mlp.w3.weight": (h, d),
        "norm.weight": (d,),
        "lm_head.weight": (V, d),
    }
    assert "rope_cos" not in model.state_dict() and "rope_sin" not in model.state_dict()


def test_tied_embeddings_share_one_matrix():
    model = Llama(tiny_cfg(tie_embeddings=True))
    assert model.lm_head.weight is model.tok_embeddings.weight
    untied = Llama(tiny_cfg())
    assert untied.num_parameters() - model.num_parameters() == 97 * 32
    assert model.num_parameters(exclude_embeddings=True) == model.num_parameters()


def test_invalid_configs_raise():
    with pytest.raises(ValueError, match=r"unknown model preset 'huge'.*124m.*cpu-small"):
        model_config("huge", 100)
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        tiny_cfg(d_model=30)
    with pytest.raises(ValueError, match="must be even"):
        tiny_cfg(d_model=12, n_heads=4)
    with pytest.raises(ValueError, match="vocab_size"):
        tiny_cfg(vocab_size=0)
    with pytest.raises(ValueError, match="mlp_hidden"):
        tiny_cfg(mlp_hidden=-3)
    with pytest.raises(ValueError, match="norm_eps"):
        tiny_cfg(norm_eps=0.0)
    model = Llama(tiny_cfg())
    with pytest.raises(ValueError, match="exceeds"):
        model(torch.zeros(1, 17, dtype=torch.long))


# --------------------------------------------------------------------------- init


def test_init_stds_and_residual_scaling():
    torch.manual_seed(0)
    L = 4
    cfg = ModelConfig(vocab_size=512, d_model=256, n_layers=L, n_heads=4, seq_len=8)
    model = Llama(cfg)
    resid = 0.02 / math.sqrt(2 * L)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
            continue
        expected = resid if name.endswith(("attn.wo.weight", "mlp.w2.weight")) else 0.02
        # The sample std of n ≥ 65536 normals is within 1.5% with overwhelming probability.
        assert p.std().item() == pytest.approx(expected, rel=0.015), name
        assert abs(p.mean().item()) < 4 * expected / math.sqrt(p.numel()), name


def test_meta_model_materialises_with_init_weights():
    torch.manual_seed(0)
    cfg = tiny_cfg()
    with torch.device("meta"):
        model = Llama(cfg)
    model.to_empty(device="cpu")
    model.init_weights()
    cos, sin = rope_frequencies(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)
    logits, loss = model(torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16)))
    assert torch.isfinite(logits).all()
    # Fresh init: predictions are near uniform, so the loss is near log(V).
    assert loss.item() == pytest.approx(math.log(97), abs=0.1)


# --------------------------------------------------------------------------- RoPE


def rope_complex_reference(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [B, T, H, D] float64; pairs (x[2i], x[2i+1]) times exp(i·t·θ^(-2i/D))."""
    B, T, H, D = x.shape
    xc = torch.view_as_complex(x.reshape(B, T, H, D // 2, 2).contiguous())
    freqs = torch.tensor([theta ** (-2 * i / D) for i in range(D // 2)], dtype=torch.float64)
    t = torch.arange(T, dtype=torch.float64)
    rot = torch.polar(torch.ones(T, D // 2, dtype=torch.float64), torch.outer(t, freqs))
    return torch.view_as_real(xc * rot[None, :, None, :]).reshape(B, T, H, D)


def test_rope_matches_complex_number_reference():
    torch.manual_seed(0)
    x = torch.randn(2, 50, 3, 16, dtype=torch.float64)
    cos, sin = rope_frequencies(16, 64, theta=1e4)
    ours = apply_rope(x.float(), cos[:50], sin[:50]).double()
    ref = rope_complex_reference(x, 1e4)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-5)
    # Rotations preserve the norm of every pair.
    torch.testing.assert_close(ours.norm(dim=-1), x.norm(dim=-1), atol=1e-4, rtol=1e-5)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(1)
    D, T = 8, 32
    q, k = torch.randn(D), torch.randn(D)
    cos, sin = rope_frequencies(D, T)
    qs = apply_rope(q.expand(1, T, 1, D), cos, sin)[0, :, 0]
    ks = apply_rope(k.expand(1, T, 1, D), cos, sin)[0, :, 0]
    scores = qs @ ks.T  # scores[m, n] = <R_m q, R_n k>
    for offset in (0, 3, -5):
        diag = torch.diagonal(scores, offset)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- forward


def reference_forward(model: Llama, idx: torch.Tensor) -> torch.Tensor:
    """The architecture written out in float64 with an explicit causal mask."""
    cfg = model.cfg
    W = {n: p.detach().double() for n, p in model.named_parameters()}
    if cfg.tie_embeddings:
        W["lm_head.weight"] = W["tok_embeddings.weight"]
    B, T = idx.shape
    H, Dh = cfg.n_heads, cfg.head_dim

    def rms(x, g):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps) * g

    mup = cfg.mup_base_width is not None
    mult = cfg.d_model / cfg.mup_base_width if mup else 1.0
    branch = cfg.mup_scale_depth / math.sqrt(cfg.n_layers) if mup else 1.0
    x = W["tok_embeddings.weight"][idx] * (cfg.mup_scale_emb if mup else 1.0)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = (h @ W[p + "attn.wq.weight"].T).view(B, T, H, Dh)
        k = (h @ W[p + "attn.wk.weight"].T).view(B, T, H, Dh)
        v = (h @ W[p + "attn.wv.weight"].T).view(B, T, H, Dh)
        q, k = rope_complex_reference(q, cfg.rope_theta), rope_complex_reference(k, cfg.rope_theta)
        att = torch.einsum("bthd,bshd->bhts", q, k) / (Dh if mup else math.sqrt(Dh))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = torch.einsum("bhts,bshd->bthd", att, v).reshape(B, T, H * Dh)
        x = x + branch * (y @ W[p + "attn.wo.weight"].T)
        h = rms(x, W[p + "mlp_norm.weight"])
        a, g = h @ W[p + "mlp.w1.weight"].T, h @ W[p + "mlp.w3.weight"].T
        x = x + branch * ((a * torch.sigmoid(a) * g) @ W[p + "mlp.w2.weight"].T)
    return rms(x, W["norm.weight"]) @ W["lm_head.weight"].T / mult


@pytest.mark.parametrize("tied,mup", [(False, False), (True, False), (False, True)])
def test_forward_matches_float64_reference(tied, mup):
    torch.manual_seed(0)
    extra = dict(mup_base_width=16, mup_scale_emb=3.0, mup_scale_depth=1.7) if mup else {}
    model = Llama(tiny_cfg(tie_embeddings=tied, n_layers=3, **extra))
    # Make the gains non-trivial so a missing or misplaced norm would show.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    idx = torch.randint(0, 97, (2, 16))
    targets = torch.randint(0, 97, (2, 16))
    logits, loss = model(idx, targets)
    ref = reference_forward(model, idx)
    torch.testing.assert_close(logits.double(), ref, atol=1e-5, rtol=1e-4)
    logp = ref.log_softmax(-1)
    ref_loss = -logp.gather(-1, targets[..., None]).mean()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert model(idx)[1] is None


def test_future_tokens_do_not_change_past_logits():
    torch.manual_seed(0)
    model = Llama(tiny_cfg())
    idx = torch.randint(0, 97, (3, 16))
    changed = idx.clone()
    changed[:, 9:] = torch.randint(0, 97, (3, 7))
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], atol=1e-6, rtol=0)
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_backward_reaches_every_parameter():
    torch.manual_seed(0)
    model = Llama(tiny_cfg())
    _, loss = model(torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16)))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_ignore_index_targets_are_skipped():
    torch.manual_seed(0)
    model = Llama(tiny_cfg())
    idx = torch.randint(0, 97, (1, 16))
    targets = torch.randint(0, 97, (1, 16))
    masked = targets.clone()
    masked[:, 8:] = -100
    logits, loss = model(idx, masked)
    expected = F.cross_entropy(logits[0, :8].double(), targets[0, :8])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


# --------------------------------------------------------------------------- generate


def test_greedy_generate_matches_argmax_loop_and_crops_context():
    torch.manual_seed(0)
    model = Llama(tiny_cfg())
    prompt = torch.randint(0, 97, (2, 20))  # longer than seq_len=16
    out = model.generate(prompt, 6, temperature=0.0)
    assert out.shape == (2, 26) and torch.equal(out[:, :20], prompt)
    seq = prompt
    for _ in range(6):
        logits, _ = model(seq[:, -16:])
        seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)
    # top_k=1 sampling is greedy whatever the temperature.
    assert torch.equal(model.generate(prompt, 6, temperature=2.0, top_k=1), out)


def test_sampling_is_reproducible_and_respects_top_k():
    torch.manual_seed(0)
    model = Llama(tiny_cfg())
    prompt = torch.randint(0, 97, (4, 3))
    a = model.generate(prompt, 5, top_k=3, generator=torch.Generator().manual_seed(7))
    b = model.generate(prompt, 5, top_k=3, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    first_logits, _ = model(prompt)
    top3 = first_logits[:, -1].topk(3).indices
    assert all(a[i, 3] in top3[i] for i in range(4))
    with pytest.raises(ValueError, match="top_k"):
        model.generate(prompt, 1, top_k=0)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 1, temperature=-1.0)
