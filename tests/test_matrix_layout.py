"""Tensors that hold several matrices, or store one as (in, out): each matrix is clipped as its
own, checked against a float64 SVD of each expert and block, and the settings are validated
and survive a state_dict round trip."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

import spectra
import spectra.optim as so

ETA = 0.1


def _svd_op(kind: str, c: float):
    """The operator on one float64 matrix through its SVD (the paper's definitions):
    H_c: σ/√(1 + σ²/c²); hard clip: min(σ, c); orth: 1."""

    def op(X: torch.Tensor) -> torch.Tensor:
        U, S, Vh = torch.linalg.svd(X, full_matrices=False)
        if kind == "soft_clip":
            S = S / torch.sqrt(1 + S**2 / c**2)
        elif kind == "hard_clip":
            S = S.clamp(max=c)
        else:
            S = torch.ones_like(S)
        return (U * S) @ Vh

    return op


def _blocks(shape, batch_dims, split, transposed):
    """``(index, α)`` of each matrix, by plain indexing: the reference's own reading of the
    settings."""
    out = []
    ranges = [(slice(None), None)]
    if split is not None:
        sizes, dim = split
        starts = [0, *itertools.accumulate(sizes)]
        ranges = [(slice(a, b), dim) for a, b in itertools.pairwise(starts)]
    for lead in itertools.product(*(range(n) for n in shape[:batch_dims])):
        for rng, dim in ranges:
            index = [*lead] + [slice(None)] * (len(shape) - batch_dims)
            if dim is not None:
                index[dim] = rng
            block_shape = torch.empty(shape)[tuple(index)].shape
            rows, cols = block_shape[0], math.prod(block_shape[1:])
            m, n = (cols, rows) if transposed else (rows, cols)
            out.append((tuple(index), max(1.0, math.sqrt(m / n))))
    return out


CASES = [
    # shape, clip_batch_dims, clip_split, clip_transposed
    ((3, 6, 4), 1, None, False),  # an expert stack (E, m, n)
    ((2, 3, 5, 4), 2, None, False),
    ((3, 2, 3, 2), 1, None, False),  # experts of (2, 3·2) matrices
    ((8, 4), 0, ((6, 2), 0), False),  # fused blocks of different α
    ((4, 9), 0, ((3, 6), 1), True),  # a Conv1D-stored fused projection
    ((3, 10, 4), 1, ((4, 6), 1), False),  # an expert stack of fused gate/up
    ((5, 12), 0, None, True),  # Conv1D: α from (12, 5)
]


@pytest.mark.parametrize("kind", ["soft_clip", "hard_clip", "orthogonalize"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-b{c[1]}-s{c[2]}-t{c[3]}")
def test_each_expert_and_block_is_post_clipped_as_a_float64_svd_of_its_own(case, kind):
    shape, batch_dims, split, transposed = case
    g = torch.Generator().manual_seed(0)
    W0 = torch.randn(shape, generator=g, dtype=torch.float64)
    G = 3 * torch.randn(shape, generator=g, dtype=torch.float64)
    W = W0.clone().requires_grad_()
    # the base step of plain SGD is the gradient itself: the update is α_i·η·post(G_i)
    opt = so.Spectra(
        torch.optim.SGD([W], lr=ETA),
        clip_c=0.7,
        post=kind,
        clip_method="eigh" if kind != "orthogonalize" else "svd",
        clip_batch_dims=batch_dims,
        clip_split=split,
        clip_transposed=transposed,
    )
    W.grad = G.clone()
    opt.step()
    expected = W0.clone()
    op = _svd_op(kind, 0.7)
    for index, alpha in _blocks(shape, batch_dims, split, transposed):
        block = G[index]
        matrix = block.reshape(block.shape[0], -1)
        expected[index] -= ETA * alpha * op(matrix).reshape(block.shape)
    torch.testing.assert_close(W.detach(), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", CASES[:6], ids=lambda c: f"{c[0]}-b{c[1]}-s{c[2]}")
def test_each_expert_and_block_is_pre_clipped_as_a_float64_svd_of_its_own(case):
    shape, batch_dims, split, _ = case
    g = torch.Generator().manual_seed(1)
    W0 = torch.randn(shape, generator=g, dtype=torch.float64)
    G = 3 * torch.randn(shape, generator=g, dtype=torch.float64)
    W = W0.clone().requires_grad_()
    opt = so.SGDM(
        [W],
        lr=ETA,
        momentum=0.0,
        weight_decay=0.0,
        clip_c=None,
        pre_clip_c=0.9,
        clip_method="eigh",
        clip_batch_dims=batch_dims,
        clip_split=split,
    )
    W.grad = G.clone()
    opt.step()
    expected = W0.clone()
    for index, _ in _blocks(shape, batch_dims, split, False):
        block = G[index]
        matrix = block.reshape(block.shape[0], -1)
        expected[index] -= ETA * _svd_op("soft_clip", 0.9)(matrix).reshape(block.shape)
    torch.testing.assert_close(W.detach(), expected, rtol=0, atol=1e-12)


def test_whole_tensor_clipping_of_an_expert_stack_differs_from_per_expert():
    """The default rule sees (E, m·n): a different, wrong, clip for an expert stack."""
    g = torch.Generator().manual_seed(2)
    G = 3 * torch.randn(4, 6, 5, generator=g, dtype=torch.float64)
    results = []
    for batch_dims in (0, 1):
        W = torch.zeros(4, 6, 5, dtype=torch.float64, requires_grad=True)
        opt = so.Spectra(torch.optim.SGD([W], lr=ETA), clip_c=0.7, clip_batch_dims=batch_dims)
        W.grad = G.clone()
        opt.step()
        results.append(W.detach())
    assert (results[0] - results[1]).abs().max() > 1e-2


def test_conv1d_alpha_follows_its_out_in_shape_as_the_equivalent_linear():
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    conv = Conv1D(16, 4).double()  # stores (in, out) = (4, 16)
    linear = nn.Linear(4, 16).double()
    with torch.no_grad():
        linear.weight.copy_(conv.weight.T)
        linear.bias.copy_(conv.bias)
    opt_conv = so.AdamW(spectra.matrix_param_groups(conv, lr=1e-2, clip_c=0.5, clip_method="eigh"))
    opt_linear = so.AdamW(linear.parameters(), lr=1e-2, clip_c=0.5, clip_method="eigh")
    plan = opt_conv.param_plan(opt_conv.param_groups[-1], conv.weight, 0)
    assert opt_conv.param_groups[-1]["clip_transposed"] is True
    assert plan.scale == 2.0  # max(1, √(16/4)) from (out, in) = (16, 4), not (4, 16)
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for _ in range(3):
        for module, opt in ((conv, opt_conv), (linear, opt_linear)):
            opt.zero_grad()
            (module(x) ** 2).mean().mul(100).backward()
            opt.step()
    torch.testing.assert_close(conv.weight.T, linear.weight, rtol=0, atol=1e-12)
    torch.testing.assert_close(conv.bias, linear.bias, rtol=0, atol=1e-12)


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden_dim = 4
        self.gate_up_proj = nn.Parameter(torch.randn(3, 10, 4, dtype=torch.float64))
        self.down_proj = nn.Parameter(torch.randn(3, 4, 5, dtype=torch.float64))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4, dtype=torch.float64)
        self.experts = Experts()
        self.qkv = nn.Linear(4, 12, dtype=torch.float64)
        self.norm = nn.LayerNorm(4, dtype=torch.float64)
        self.conv = nn.Conv2d(2, 3, 3, dtype=torch.float64)


def _layouts(groups):
    out = {}
    for group in groups:
        key = tuple(group.get(k) for k in ("clip_batch_dims", "clip_split", "clip_transposed"))
        for p in group["params"]:
            out[id(p)] = key
    return out


def test_matrix_param_groups_sets_the_layout_of_experts_fused_projections_and_the_rest():
    model = Model()
    groups = spectra.matrix_param_groups(model, lr=3e-3, weight_decay=0.0)
    assert all(g["lr"] == 3e-3 and g["weight_decay"] == 0.0 for g in groups)
    layouts = _layouts(groups)
    assert layouts[id(model.experts.gate_up_proj)] == (1, ((5, 5), 1), None)
    assert layouts[id(model.experts.down_proj)] == (1, None, None)
    assert layouts[id(model.qkv.weight)] == (None, ((4, 4, 4), 0), None)
    for p in (model.embed.weight, model.qkv.bias, model.norm.weight, model.conv.weight):
        assert layouts[id(p)] == (None, None, None)
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    so.AdamW(groups)  # every group fits its tensors
    custom = spectra.matrix_param_groups(model, splits={"qkv.weight": ((8, 4), 0)})
    assert _layouts(custom)[id(model.qkv.weight)] == (None, ((8, 4), 0), None)
    with pytest.raises(ValueError, match="splits names no parameter of the module: nope"):
        spectra.matrix_param_groups(model, splits={"nope": ((2, 2), 0)})


def test_matrix_param_groups_reads_in_out_expert_stacks_from_the_hidden_size():
    experts = Experts()
    experts.gate_up_proj = nn.Parameter(torch.randn(3, 4, 10))  # (E, H, 2I): (in, out)
    experts.down_proj = nn.Parameter(torch.randn(3, 5, 4))  # (E, I, H)
    layouts = _layouts(spectra.matrix_param_groups(experts))
    assert layouts[id(experts.gate_up_proj)] == (1, ((5, 5), 2), True)
    assert layouts[id(experts.down_proj)] == (1, None, True)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"clip_batch_dims": -1}, "clip_batch_dims must be an int >= 0, got -1"),
        ({"clip_batch_dims": True}, "clip_batch_dims must be an int >= 0, got True"),
        ({"clip_transposed": "yes"}, "clip_transposed must be one of True, False, got 'yes'"),
        ({"clip_split": [4, 4]}, r"clip_split must be None or \(sizes, dim\).*got \[4, 4\]"),
        ({"clip_split": ((0, 8), 0)}, r"clip_split must be .*got \(\(0, 8\), 0\)"),
        ({"clip_split": ((4, 4), "0")}, r"clip_split must be .*got \(\(4, 4\), '0'\)"),
        ({"clip_split": ((3, 3), 0)}, r"clip_split=\(\(3, 3\), 0\): parameter 0 .* \(8, 6\)"),
        ({"clip_split": ((4, 4), 2)}, r"clip_split=\(\(4, 4\), 2\): parameter 0"),
        ({"clip_batch_dims": 1}, r"clip_batch_dims=1, .*: parameter 0 of its group has shape"),
    ],
)
def test_bad_layout_settings_are_refused_at_construction_by_name(settings, message):
    p = torch.zeros(8, 6, requires_grad=True)
    with pytest.raises(ValueError, match=message):
        so.AdamW([p], **settings)
    opt = so.AdamW([torch.zeros(2, 2, requires_grad=True)])
    with pytest.raises(ValueError, match=message):
        opt.add_param_group({"params": [p], **settings})
    assert len(opt.param_groups) == 1


def _train(opt, params, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = 3 * torch.randn(p.shape, generator=g, dtype=p.dtype)
        opt.step()


def test_resume_keeps_the_layout_settings_and_continues_as_one_run(tmp_path):
    model = Model()
    reference = Model()
    reference.load_state_dict(model.state_dict())
    make = lambda m, strip=False: so.AdamW(  # noqa: E731
        [
            {k: v for k, v in g.items() if not (strip and k.startswith("clip_"))}
            for g in spectra.matrix_param_groups(m, lr=1e-2, clip_c=0.5, clip_method="eigh")
        ]
    )
    opt, ref_opt = make(model), make(reference)
    _train(opt, list(model.parameters()), 2, seed=5)
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    # the resumed optimizer is built without the layout: loading puts the saved one back
    resumed = make(model, strip=True)
    assert all("clip_split" not in g or g["clip_split"] is None for g in resumed.param_groups)
    resumed.load_state_dict(torch.load(tmp_path / "opt.pt", weights_only=True))
    assert [g.get("clip_split") for g in resumed.param_groups] == [
        g.get("clip_split") for g in ref_opt.param_groups
    ]
    assert [g["clip_batch_dims"] for g in resumed.param_groups] == [0, 1, 1, 0]
    _train(resumed, list(model.parameters()), 2, seed=6)
    _train(ref_opt, list(reference.parameters()), 2, seed=5)
    _train(ref_opt, list(reference.parameters()), 2, seed=6)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_saved_layout_that_does_not_fit_the_parameters_is_refused_on_load():
    p = torch.zeros(3, 6, 4, requires_grad=True)
    saved = so.AdamW([p], clip_batch_dims=1).state_dict()
    other = so.AdamW([torch.zeros(6, 4, requires_grad=True)])
    with pytest.raises(ValueError, match=r"load_state_dict: param group 0: clip_batch_dims=1"):
        other.load_state_dict(saved)


def test_fsdp1_flattened_parameters_are_refused_and_plain_vectors_are_not():
    flat = torch.zeros(12, requires_grad=True)
    flat._fsdp_flattened = True  # what FSDP1 marks its FlatParameter and its 1-D views with
    for make in (lambda ps: so.AdamW(ps), lambda ps: so.Spectra(torch.optim.AdamW(ps))):
        with pytest.raises(ValueError, match=r"flattened FSDP1 .*fully_shard instead$"):
            make([flat])
        make([torch.zeros(12, requires_grad=True)])  # a bias or a norm: as before


def test_the_baselines_refuse_layout_settings_they_would_ignore():
    p = torch.zeros(3, 4, 5, requires_grad=True)
    for cls in (so.DMuon, so.SOAP):
        with pytest.raises(
            ValueError, match=f"{cls.__name__} takes no clip_batch_dims \\(got 1\\)"
        ):
            cls([{"params": [p], "clip_batch_dims": 1}], lr=1e-3)
        cls([{"params": [p], "clip_batch_dims": 0}], lr=1e-3)  # the default says nothing


def test_a_three_dimensional_table_outside_an_experts_module_keeps_the_default_rule():
    vit = nn.Module()
    vit.pos_embed = nn.Parameter(torch.zeros(1, 16, 8))  # a position table, not experts
    groups = spectra.matrix_param_groups(vit)
    assert len(groups) == 1 and "clip_batch_dims" not in groups[0]


@pytest.mark.parametrize("layout", [{"clip_batch_dims": 1}, {"clip_split": ((3, 5), 1)}])
def test_the_adaptive_pre_clip_keeps_a_running_scale_per_expert_and_block(layout):
    # each matrix of a stack (or block of a fused tensor) steps as its own parameter would: its
    # own σ̂, running scale and threshold. The reference: the same matrices as separate
    # parameters (columns 3 and 5 of a split along dim 1 as two (6, 3)/(6, 5) tensors)
    torch.manual_seed(0)
    stacked = torch.randn(4, 6, 8) if "clip_batch_dims" in layout else torch.randn(6, 8)
    scales = [1.0, 30.0, 0.3, 3.0]  # very different gradient scales per matrix
    kw = {"lr": 1e-2, "clip_c": 1.0, "pre_clip_kappa": 2.0, "clip_method": "eigh"}

    def parts(t):
        return list(t.unbind(0)) if t.dim() == 3 else list(t.split((3, 5), dim=1))

    whole = stacked.clone().requires_grad_()
    opt = so.AdamW([{"params": [whole], **layout}], **kw)
    separate = [x.clone().requires_grad_() for x in parts(stacked)]
    ref = so.AdamW(separate, **kw)
    for step in range(4):
        gen = torch.Generator().manual_seed(step)
        grads = [scales[i] * torch.randn(x.shape, generator=gen) for i, x in enumerate(separate)]
        whole.grad = torch.stack(grads) if stacked.dim() == 3 else torch.cat(grads, dim=1)
        for x, g in zip(separate, grads, strict=True):
            x.grad = g.clone()
        opt.step()
        ref.step()
    for got, want in zip(parts(whole.detach()), separate, strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-6)
    emas = opt.state[whole]["pre_clip_ema"]
    assert isinstance(emas, list) and len(emas) == len(separate)
    assert emas == pytest.approx([ref.state[x]["pre_clip_ema"] for x in separate], rel=1e-12)
    # and it resumes: the list of scales is saved and loaded as it is
    again = so.AdamW([{"params": [whole], **layout}], **kw)
    again.load_state_dict(opt.state_dict())
    assert again.state[whole]["pre_clip_ema"] == emas
