"""The model's training FLOPs per token against torch's own FLOP counter and a count by hand."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from spectra_lab.model import Llama, ModelConfig, flops_per_token, matmul_parameters

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_cfg(**overrides) -> ModelConfig:
    kw = dict(vocab_size=97, d_model=32, n_layers=2, n_heads=4, seq_len=16)
    kw.update(overrides)
    return ModelConfig(**kw)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_embeddings": True}, {"mlp_hidden": 40, "n_layers": 3, "seq_len": 24}],
    ids=["untied", "tied", "other-shape"],
)
def test_flops_per_token_equals_the_flop_counter_of_a_forward_and_backward_pass(overrides):
    # FlopCounterMode counts the matrix products (mm, bmm, and attention kernels it knows) of
    # forward and backward. CPU's fused attention kernel is not among those it knows, so the
    # attention runs through SDPA's math backend, whose QKᵀ and AV are plain bmm over the
    # whole T×T score matrix: the causal mask halves nothing, as in the formula. What the
    # counter leaves out (norms, RoPE, SiLU, softmax, the loss) the formula leaves out too,
    # so the two agree exactly.
    cfg = tiny_cfg(**overrides)
    model = Llama(cfg)
    batch, T = 3, cfg.seq_len
    tokens = torch.randint(
        0, cfg.vocab_size, (batch, T + 1), generator=torch.Generator().manual_seed(0)
    )
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
    assert counter.get_total_flops() == flops_per_token(cfg) * batch * T


def test_matmul_parameters_are_the_weights_of_every_matrix_product_by_hand():
    # Untied: every parameter but the input table (a lookup) and the RMSNorm gains (vectors).
    cfg = tiny_cfg()
    model = Llama(cfg)
    norms = sum(p.numel() for name, p in model.named_parameters() if "norm" in name)
    assert matmul_parameters(cfg) == model.num_parameters(exclude_embeddings=True) - norms
    # Tied: the shared matrix is the head, a matrix product; it is counted once.
    tied = tiny_cfg(tie_embeddings=True)
    assert matmul_parameters(tied) == Llama(tied).num_parameters() - norms
    # The formula's attention term, by hand: QKᵀ and AV, 2·T·d multiply-adds per token and layer
    # forward, three times that with the backward pass.
    d, L, T = cfg.d_model, cfg.n_layers, cfg.seq_len
    assert flops_per_token(cfg) - 6 * matmul_parameters(cfg) == L * 3 * (2 * 2 * T * d)
