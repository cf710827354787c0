"""The baseline optimizers D-Muon and SOAP, checked against torch and a float64 reference.

Run as a script (``PYTHONPATH=src python tests/test_baselines.py``) to print the
optimizer-state memory table of docs/baselines.md.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from torch import nn

import spectra.optim as so
from spectra.optim import SOAP, DMuon, dmuon_param_groups
from spectra.optim.baselines.soap import kronecker_factor, rotate, rotate_back

# --------------------------------------------------------------------------- helpers


def _grads(shapes, steps, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=gen, dtype=dtype) for s in shapes] for _ in range(steps)]


def _run(opt, params, grad_seq):
    for grads in grad_seq:
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()


def _leaves(shapes, seed=1, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in shapes]


def _regression_problem():
    # Hidden matrices have >= 12 rows and columns: on CPU, bfloat16 products of smaller
    # matrices take a slow path (~30 ms each), and Muon runs five of them per step.
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(256, 16, generator=gen)
    Y = 2 * torch.tanh(X @ (torch.randn(16, 16, generator=gen) / 4))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
    return model, X, Y


def _train(model, opt, X, Y, steps):
    losses = []
    for _ in range(steps):

        def closure():
            opt.zero_grad()
            loss = (model(X) - Y).pow(2).mean()
            loss.backward()
            return loss

        losses.append(opt.step(closure).item())
    return losses


# --------------------------------------------------------------------------- D-Muon


def test_dmuon_matches_torch_muon_on_hidden_matrices():
    shapes = [(32, 48), (64, 16), (40, 40)]
    ours, ref = _leaves(shapes), _leaves(shapes)
    start = [p.detach().clone() for p in ours]
    opt = DMuon(ours, lr=0.01, weight_decay=0.1, momentum=0.95, nesterov=True)
    torch_opt = torch.optim.Muon(
        ref, lr=0.01, weight_decay=0.1, momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw"
    )
    grad_seq = _grads(shapes, steps=4)
    _run(opt, ours, grad_seq)
    _run(torch_opt, ref, grad_seq)
    for p, q, p0 in zip(ours, ref, start, strict=True):
        # Momentum is float32 arithmetic on identical inputs: bit-identical.
        assert torch.equal(opt.state[p]["momentum_buffer"], torch_opt.state[q]["momentum_buffer"])
        # The Newton–Schulz iteration performs the same bfloat16 operations as torch's
        # (fused addmm updates), and the step the same float32 arithmetic: bit-identical.
        assert torch.equal(p.detach(), q.detach()), (p - q).abs().max()
        assert not torch.equal(p.detach(), p0)


def test_dmuon_float32_newton_schulz_is_closer_to_the_exact_orthogonalization():
    # ns_dtype="float32" runs the same quintic in float32: the step equals lr·scale·NS₅(U)
    # computed in float64 from the same coefficients far more closely than the bf16 default.
    from spectra.ops import newton_schulz_quintic

    shape = (32, 48)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    steps = {}
    for dtype in ("bfloat16", "float32"):
        p = torch.zeros(shape, requires_grad=True)
        opt = DMuon([p], lr=0.1, weight_decay=0.0, momentum=0.0, nesterov=False, ns_dtype=dtype)
        p.grad = g.clone()
        opt.step()
        steps[dtype] = p.detach().double()
    ref = -0.1 * 0.2 * 48**0.5 * newton_schulz_quintic(g.double(), dtype=torch.float64)
    err = {k: float((v - ref).norm() / ref.norm()) for k, v in steps.items()}
    assert err["float32"] < 1e-5 < err["bfloat16"]
    with pytest.raises(ValueError, match="ns_dtype"):
        DMuon([torch.zeros(3, 3, requires_grad=True)], ns_dtype="float16")
    # a state dict saved before ns_dtype existed loads with the bf16 default
    opt = DMuon([torch.zeros(4, 4, requires_grad=True)])
    state = opt.state_dict()
    del state["param_groups"][0]["ns_dtype"]
    opt.load_state_dict(state)
    assert opt.param_groups[0]["ns_dtype"] is torch.bfloat16


def test_dmuon_update_rms_matches_adamw_scale():
    # Muon's orthogonalized step scaled by 0.2·√max(m, n) has RMS ≈ 0.2·lr.
    p = torch.zeros(64, 128, requires_grad=True)
    opt = DMuon([p], lr=1.0, weight_decay=0.0)
    p.grad = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
    opt.step()
    rms = p.detach().pow(2).mean().sqrt().item()
    # Singular values of the quintic Newton–Schulz output lie in ≈ [0.68, 1.13].
    assert 0.2 * 0.68 < rms < 0.2 * 1.13


@pytest.mark.parametrize("foreach", [False, True])
def test_dmuon_adamw_part_matches_torch_adamw(foreach):
    # A bias, a gain vector, a 3-D tensor and an embedding-sized matrix: all AdamW.
    shapes = [(7,), (16,), (2, 3, 4), (10000, 2)]
    ours, ref = _leaves(shapes), _leaves(shapes)
    opt = DMuon(ours, lr=3e-3, weight_decay=0.1, adamw_betas=(0.8, 0.999), adamw_eps=1e-8)
    torch_opt = torch.optim.AdamW(
        ref, lr=3e-3, weight_decay=0.1, betas=(0.8, 0.999), eps=1e-8, foreach=foreach
    )
    grad_seq = _grads(shapes, steps=5)
    _run(opt, ours, grad_seq)
    _run(torch_opt, ref, grad_seq)
    for p, q in zip(ours, ref, strict=True):
        assert "momentum_buffer" not in opt.state[p]
        if foreach:
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        else:  # the same single-tensor arithmetic: bit-identical
            assert torch.equal(p, q)
            assert torch.equal(opt.state[p]["exp_avg_sq"], torch_opt.state[q]["exp_avg_sq"])


def test_dmuon_default_split_rule():
    params = {
        "hidden": torch.zeros(16, 32, requires_grad=True),
        "bias": torch.zeros(16, requires_grad=True),
        "embedding": torch.zeros(10000, 4, requires_grad=True),
        "head": torch.zeros(4, 10000, requires_grad=True),
        "conv": torch.zeros(4, 3, 2, requires_grad=True),
    }
    opt = DMuon(params.values())
    for p in params.values():
        p.grad = torch.ones_like(p)
    opt.step()
    muon = {name for name, p in params.items() if "momentum_buffer" in opt.state[p]}
    adamw = {name for name, p in params.items() if "exp_avg" in opt.state[p]}
    assert muon == {"hidden"}
    assert adamw == {"bias", "embedding", "head", "conv"}


class _TinyLM(nn.Module):
    def __init__(self, vocab=50, d=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
        self.norm = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)


def test_dmuon_param_groups_send_embeddings_heads_and_vectors_to_adamw():
    model = _TinyLM()
    groups = dmuon_param_groups(model, lr=2e-3)
    by_flag = {g["use_muon"]: {id(p) for p in g["params"]} for g in groups}
    muon_ids = {id(model.blocks[0].weight), id(model.blocks[2].weight)}
    assert by_flag[True] == muon_ids
    all_ids = {id(p) for p in model.parameters()}
    assert by_flag[False] == all_ids - muon_ids
    assert all(g["lr"] == 2e-3 for g in groups)
    DMuon(groups)  # the groups are accepted as they are


def test_dmuon_param_groups_tied_head_appears_once():
    model = _TinyLM()
    model.lm_head.weight = model.embed.weight
    groups = dmuon_param_groups(model)
    params = [p for g in groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == len(list(model.parameters()))


def test_dmuon_trains_a_small_mlp():
    model, X, Y = _regression_problem()
    opt = DMuon(model.parameters(), lr=0.05, weight_decay=0.0)
    losses = _train(model, opt, X, Y, steps=100)
    assert losses[-1] < 0.05 * losses[0]


# --------------------------------------------------------------------------- SOAP


def soap_reference(W0, grads, *, lr, betas, shampoo_beta, eps, weight_decay, freq, max_dim):
    """SOAP on one matrix in float64 numpy with explicit matrices (same first-step rule)."""
    b1, b2 = betas
    W = W0.copy()
    sides = [d <= max_dim for d in W.shape]
    Q = [np.eye(d) for d in W.shape]  # the identity stands for an unrotated side
    L = [None, None]
    m = v = None
    for t, G in enumerate(grads, start=1):
        factors = [G @ G.T, G.T @ G]
        if t == 1:
            L = [(1 - shampoo_beta) * f for f in factors]
            for i in range(2):
                if sides[i]:
                    Q[i] = np.linalg.eigh(L[i])[1][:, ::-1]
            m, v = (1 - b1) * G, (1 - b2) * G**2
            direction = m / (np.sqrt(v) + eps)
        else:
            Gr = Q[0].T @ G @ Q[1]
            m = b1 * m + (1 - b1) * Gr
            v = b2 * v + (1 - b2) * Gr**2
            direction = Q[0] @ (m / (np.sqrt(v) + eps)) @ Q[1].T
        W = W * (1 - lr * weight_decay) - lr * math.sqrt(1 - b2**t) / (1 - b1**t) * direction
        if t == 1:
            Gr = Q[0].T @ G @ Q[1]
            m = Q[0].T @ m @ Q[1]
            v = (1 - b2) * Gr**2
        else:
            L = [shampoo_beta * L[i] + (1 - shampoo_beta) * factors[i] for i in range(2)]
        if t % freq == 0:
            m_orig = Q[0] @ m @ Q[1].T
            for i in range(2):
                if not sides[i]:
                    continue
                order = np.argsort(-np.diag(Q[i].T @ L[i] @ Q[i]), kind="stable")
                v = np.take(v, order, axis=i)
                Q[i] = np.linalg.qr(L[i] @ Q[i][:, order])[0]
            m = Q[0].T @ m_orig @ Q[1]
    return W


@pytest.mark.parametrize(
    ("shape", "max_dim"),
    [((4, 4), 10000), ((3, 4), 10000), ((6, 3), 4), ((3, 6), 2)],
)
def test_soap_matches_float64_reference(shape, max_dim):
    hp = dict(lr=0.05, betas=(0.9, 0.95), shampoo_beta=0.8, eps=1e-8, weight_decay=0.1)
    steps, freq = 7, 3
    grad_seq = _grads([shape], steps, seed=5, dtype=torch.float64)
    (p,) = _leaves([shape], dtype=torch.float64)
    W0 = p.detach().numpy().copy()
    opt = SOAP([p], precondition_frequency=freq, max_precond_dim=max_dim, **hp)
    _run(opt, [p], grad_seq)
    ref = soap_reference(W0, [g[0].numpy() for g in grad_seq], freq=freq, max_dim=max_dim, **hp)
    np.testing.assert_allclose(p.detach().numpy(), ref, rtol=1e-9, atol=1e-11)


def test_soap_rotation_of_a_3d_tensor_is_the_mode_products():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64)
    Q0 = torch.linalg.qr(torch.randn(3, 3, generator=gen, dtype=torch.float64))[0]
    Q2 = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))[0]
    rotated = rotate(x, [Q0, None, Q2])
    torch.testing.assert_close(rotated, torch.einsum("abc,ai,ck->ibk", x, Q0, Q2))
    torch.testing.assert_close(rotate_back(rotated, [Q0, None, Q2]), x)
    torch.testing.assert_close(kronecker_factor(x, 1), torch.einsum("abc,adc->bd", x, x))


def test_soap_on_vectors_is_adam():
    # 1-D parameters are not rotated: Adam with ε added to √V before bias correction,
    # which is torch's AdamW with ε/√(1 − β₂ᵗ); with ε = 0 the two coincide.
    ours, ref = _leaves([(9,)]), _leaves([(9,)])
    opt = SOAP(ours, lr=1e-2, betas=(0.9, 0.99), eps=0.0, weight_decay=0.1)
    torch_opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.99), eps=0.0, weight_decay=0.1)
    grad_seq = _grads([(9,)], steps=6)
    _run(opt, ours, grad_seq)
    _run(torch_opt, ref, grad_seq)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-6, atol=1e-7)


def test_soap_first_step_moves_params_and_applies_weight_decay():
    lr, wd = 0.01, 0.5
    # A zero gradient: the step is the weight decay alone.
    p = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)).requires_grad_()
    p0 = p.detach().clone()
    opt = SOAP([p], lr=lr, weight_decay=wd)
    p.grad = torch.zeros_like(p)
    opt.step()
    assert torch.equal(p.detach(), p0 * (1 - lr * wd))
    # A real gradient: AdamW's first step, ≈ lr·sign(G) on top of the weight decay.
    q = p0.clone().requires_grad_()
    opt = SOAP([q], lr=lr, weight_decay=wd, eps=0.0)
    g = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    q.grad = g
    opt.step()
    torch.testing.assert_close(q.detach(), p0 * (1 - lr * wd) - lr * g.sign())
    assert opt.state[q]["step"] == 1


def test_soap_dims_above_max_precond_dim_stay_unrotated():
    p = torch.randn(12, 3, requires_grad=True)
    opt = SOAP([p], max_precond_dim=8, precondition_frequency=2)
    for g in _grads([(12, 3)], steps=5, seed=2):
        p.grad = g[0]
        opt.step()
    state = opt.state[p]
    assert state["GG"][0] is None and state["Q"][0] is None
    assert state["GG"][1].shape == state["Q"][1].shape == (3, 3)
    torch.testing.assert_close(state["Q"][1].T @ state["Q"][1], torch.eye(3), atol=1e-5, rtol=0)
    assert torch.isfinite(p).all()
    # max_precond_dim=0: nothing is rotated and SOAP is Adam.
    q = torch.randn(5, 4, requires_grad=True)
    opt = SOAP([q], max_precond_dim=0)
    q.grad = torch.randn(5, 4)
    opt.step()
    assert opt.state[q]["Q"] == [None, None]


def test_soap_trains_a_small_mlp():
    model, X, Y = _regression_problem()
    opt = SOAP(model.parameters(), lr=0.02, weight_decay=0.0)
    losses = _train(model, opt, X, Y, steps=100)
    assert losses[-1] < 0.05 * losses[0]


def test_soap_precondition_1d_trains():
    torch.manual_seed(0)
    target = torch.randn(6)
    p = torch.zeros(6, requires_grad=True)
    opt = SOAP([p], lr=0.05, weight_decay=0.0, precondition_1d=True, precondition_frequency=2)
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = (p - target).pow(2).sum()
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    assert opt.state[p]["Q"][0].shape == (6, 6)
    assert loss.item() < 0.05 * first


# --------------------------------------------------------------------------- shared conventions


def _make(name, params, **kw):
    if name == "dmuon":
        return DMuon(params, **kw)
    return SOAP(params, precondition_frequency=2, max_precond_dim=100, **kw)


@pytest.mark.parametrize("name", ["dmuon", "soap"])
def test_state_dict_round_trip_continues_bit_identically(name):
    shapes = [(16, 32), (5,), (10000, 2)]
    params = _leaves(shapes)
    opt = _make(name, params, lr=1e-2)
    grad_seq = _grads(shapes, steps=8, seed=4)
    _run(opt, params, grad_seq[:3])

    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    restored_params = [p.detach().clone().requires_grad_() for p in params]
    restored = _make(name, restored_params, lr=1e-2)
    restored.load_state_dict(torch.load(buffer, weights_only=True))

    _run(opt, params, grad_seq[3:])
    _run(restored, restored_params, grad_seq[3:])
    for p, q in zip(params, restored_params, strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("name", ["dmuon", "soap"])
def test_param_groups_carry_their_own_lr_and_weight_decay(name):
    a, b, c = _leaves([(16, 32), (16, 32), (5,)])
    a0, b0, c0 = (x.detach().clone() for x in (a, b, c))
    groups = [
        {"params": [a], "lr": 0.1, "weight_decay": 0.5},
        {"params": [b], "lr": 0.2, "weight_decay": 0.0},
        {"params": [c], "lr": 0.0},
    ]
    opt = _make(name, groups, weight_decay=0.3)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0, 0.3]
    # Zero gradients: the first two move by their own weight decay only; lr = 0 freezes c.
    for x in (a, b):
        x.grad = torch.zeros_like(x)
    c.grad = torch.ones_like(c)
    opt.step()
    assert torch.equal(a.detach(), a0 * (1 - 0.1 * 0.5))
    assert torch.equal(b.detach(), b0)
    assert torch.equal(c.detach(), c0)


@pytest.mark.parametrize("name", ["dmuon", "soap"])
def test_param_without_grad_is_untouched_and_gets_no_state(name):
    a, b = _leaves([(16, 32), (3,)])
    b0 = b.detach().clone()
    opt = _make(name, [a, b])
    a.grad = torch.randn_like(a)
    opt.step()
    assert torch.equal(b.detach(), b0)
    assert b not in opt.state


@pytest.mark.parametrize(
    ("name", "kwargs", "bad"),
    [
        ("dmuon", {"lr": -1.0}, "-1.0"),
        ("dmuon", {"momentum": 1.0}, "1.0"),
        ("dmuon", {"weight_decay": -0.1}, "-0.1"),
        ("dmuon", {"ns_steps": 0}, "0"),
        ("dmuon", {"adamw_betas": (0.9, 1.5)}, "1.5"),
        ("dmuon", {"adamw_eps": float("nan")}, "nan"),
        ("soap", {"lr": float("inf")}, "inf"),
        ("soap", {"betas": (-0.1, 0.9)}, "-0.1"),
        ("soap", {"shampoo_beta": 1.0}, "1.0"),
        ("soap", {"eps": -1e-8}, "-1e-08"),
        ("soap", {"precondition_frequency": 0}, "0"),
        ("soap", {"max_precond_dim": 2.5}, "2.5"),
    ],
)
def test_bad_hyperparameters_raise_naming_the_value(name, kwargs, bad):
    p = torch.zeros(3, 3, requires_grad=True)
    cls = DMuon if name == "dmuon" else SOAP
    with pytest.raises(ValueError, match=bad):
        cls([p], **kwargs)
    with pytest.raises(ValueError, match=bad):  # a param group's own value is checked too
        cls([{"params": [p], **kwargs}])


def test_dmuon_rejects_muon_on_vectors():
    with pytest.raises(ValueError, match=r"\(5,\)"):
        DMuon([{"params": [torch.zeros(5, requires_grad=True)], "use_muon": True}])


# --------------------------------------------------------------------------- memory


def _llama_like(d=256, layers=4, ffn=688, vocab=32000):
    """Parameter shapes of a small Llama: untied embedding and head, SwiGLU, RMSNorm gains."""
    shapes = [(vocab, d)]
    for _ in range(layers):
        shapes += [(d, d)] * 4 + [(ffn, d), (ffn, d), (d, ffn)] + [(d,)] * 2
    return [*shapes, (d,), (vocab, d)]


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


def memory_table(shapes=None):
    """Measured optimizer state on a Llama-like set of float32 shapes, one row per optimizer.

    Each row: name, the state buffers, their bytes / parameter bytes, and the paper's
    closed form (Table "memory requirements of different optimizers") in numbers.
    """
    shapes = shapes or _llama_like()
    params = [torch.zeros(s, requires_grad=True) for s in shapes]
    for p in params:
        p.grad = torch.zeros_like(p)
    M, factor = state_factors(shapes)
    rows = []
    for name, opt, buffers, formula in [
        ("AdamW (torch)", torch.optim.AdamW(params), "m, v", factor["AdamW"] * M),
        ("D-Muon", DMuon(params), "m (Muon), m, v (AdamW)", factor["D-Muon"] * M),
        ("SOAP", SOAP(params), "m, v, GG, Q", factor["SOAP"] * M),
    ]:
        opt.step()
        measured = sum(_tensor_bytes(s) for s in opt.state.values())
        # torch's AdamW keeps `step` as a 4-byte tensor per parameter; ours is an int.
        step_bytes = sum(_tensor_bytes(s.get("step")) for s in opt.state.values())
        rows.append((name, buffers, measured, step_bytes, formula, M))
    return rows


def test_measured_state_memory_matches_the_papers_formulas():
    shapes = _llama_like(d=32, layers=2, ffn=64, vocab=10001)
    for _name, _buffers, measured, step_bytes, formula, _M in memory_table(shapes):
        assert measured - step_bytes == pytest.approx(4 * formula, rel=1e-12)


def state_factors(shapes, max_dim=10000):
    """State numbers / parameter numbers of AdamW, D-Muon and SOAP by the closed forms."""
    M = sum(math.prod(s) for s in shapes)
    muon = sum(math.prod(s) for s in shapes if len(s) == 2 and max(s) < max_dim)
    precond = sum(2 * d * d for s in shapes if len(s) > 1 for d in s if d <= max_dim)
    return M, {"AdamW": 2.0, "D-Muon": (2 * M - muon) / M, "SOAP": (2 * M + precond) / M}


def main() -> None:
    print("Measured, Llama-like d=256, 4 layers, SwiGLU 688, vocab 32000, untied, float32:")
    print("| optimizer | state buffers | state / param bytes | paper's formula |")
    print("|---|---|---|---|")
    for name, buffers, measured, step_bytes, formula, M in memory_table():
        print(
            f"| {name} | {buffers} | {(measured - step_bytes) / (4 * M):.3f} | {formula / M:.3f} |"
        )
    shapes = _llama_like()
    M = sum(math.prod(s) for s in shapes)
    hidden = sum(math.prod(s) for s in shapes if len(s) == 2 and max(s) < 10000)
    print(f"M = {M:,} parameters; Muon matrices {hidden:,}; AdamW-side {M - hidden:,}")

    print("\nClosed form at the paper's scales (vocab 50304, untied, SwiGLU width")
    print("256·ceil(8d/3/256)):")
    print("| model | d | layers | M | AdamW | D-Muon | SOAP |")
    print("|---|---|---|---|---|---|---|")
    for label, d, layers in [("160M", 768, 12), ("780M", 1280, 32), ("820M", 2048, 12)]:
        ffn = 256 * math.ceil(8 * d / 3 / 256)
        M, f = state_factors(_llama_like(d=d, layers=layers, ffn=ffn, vocab=50304))
        print(
            f"| {label} | {d} | {layers} | {M / 1e6:.1f}M | {f['AdamW']:.3f} "
            f"| {f['D-Muon']:.3f} | {f['SOAP']:.3f} |"
        )


if __name__ == "__main__":
    main()


def test_spectra_pre_clip_on_top_of_dmuon_is_dmuon_on_clipped_gradients():
    """``Spectra(DMuon(...), clip_c=None, pre_clip_c=c)``: D-Muon's step on ``H_c(G)`` of each
    Muon matrix's raw gradient (a float64 SVD), its AdamW part untouched."""
    torch.manual_seed(0)
    W0, E0 = torch.randn(8, 5, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    grads = [(5 * torch.randn(8, 5, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64))
             for _ in range(3)]  # fmt: skip

    def soft(G, c):
        U, S, Vh = torch.linalg.svd(G, full_matrices=False)
        return U @ torch.diag(S / torch.sqrt(1 + (S / c) ** 2)) @ Vh

    def run(wrap: bool):
        W, E = torch.nn.Parameter(W0.clone()), torch.nn.Parameter(E0.clone())
        groups = [{"params": [W], "use_muon": True, **({"pre_clip_c": 2.0} if wrap else {})},
                  {"params": [E], "use_muon": False}]  # fmt: skip
        base = so.DMuon(groups, lr=0.01, ns_dtype="float64")
        opt = so.Spectra(base, clip_c=None) if wrap else base
        for g, e in grads:
            W.grad, E.grad = (g.clone(), e.clone()) if wrap else (soft(g, 2.0), e.clone())
            opt.step()
        return W.detach(), E.detach()

    for got, want in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_the_harness_wraps_dmuon_to_pre_clip_its_muon_matrices():
    from spectra_lab.train.build import build_model
    from spectra_lab.train.config import TrainConfig
    from spectra_lab.train.optimizers import build_optimizer

    cfg = TrainConfig(optimizer="dmuon", pre_clip_c=2.0, preset="cpu-small")
    model, _ = build_model(cfg, 256)
    opt = build_optimizer(model, cfg, lambda k: 1.0)
    assert isinstance(opt, so.Spectra) and isinstance(opt.base, so.DMuon)
    for g in opt.param_groups:
        assert g["clip_c"] is None  # D-Muon's own step, no post clip
        assert g["pre_clip_c"] == (2.0 if g["use_muon"] else None)
