"""Spectral clipping of sharded matrices without gathering them (the Gram route), on gloo.

FSDP2 (``fully_shard``, ``Shard(0)``), tensor parallelism (``ColwiseParallel`` and
``RowwiseParallel``) and a 2-D mesh (FSDP on one dimension, TP on the other), with 2 and 4
processes, against one process on the same global batch. Every rank records the matrices it
assembles whole: none of them may be one the Gram route takes.
"""

from __future__ import annotations

import itertools
import logging
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import spectra.optim as so
from spectra.optim import distributed as spectra_dist
from spectra.optim.layout import MatrixLayout
from spectra.optim.plan import SpectralOp

OPTIMIZERS = {
    "AdamW": lambda ps: so.AdamW(ps, lr=1e-2, clip_c=0.3),
    "Signum": lambda ps: so.Signum(ps, lr=1e-2, clip_c=0.3),
    "AdamW pre-clip": lambda ps: so.AdamW(ps, lr=1e-2, clip_c=0.3, pre_clip_c=2.0),
    "AdamW hard": lambda ps: so.AdamW(ps, lr=1e-2, clip_c=0.3, post="hard_clip"),
    # the Gram route runs "mixed" itself from G (bf16 steps included), not the exact clip
    "AdamW mixed": lambda ps: so.AdamW(ps, lr=1e-2, clip_c=0.3, clip_method="mixed"),
    # SGD-M: AdamW's first direction here has a singular value of 1e-9·σ_max, which the SVD
    # orthogonalizes to 1 and the Gram route (resolving σ down to 1.5e-8·σ_max) to 0
    "SGDM orth": lambda ps: so.SGDM(ps, lr=1e-2, post="orthogonalize"),
    "SGDM orth muon": lambda ps: so.SGDM(
        ps, lr=1e-2, post="orthogonalize", clip_method="muon", clip_ns_dtype="float64"
    ),
    "MARS": lambda ps: so.MARS(ps, lr=1e-2, clip_c=0.3),
    # a relative threshold: each matrix's norm summed over its shards
    "SGDM kappa": lambda ps: so.SGDM(ps, lr=1e-2, clip_kappa=0.3),
    "Spectra(torch AdamW)": lambda ps: so.Spectra(
        torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), clip_c=0.3
    ),
    "DMuon": lambda ps: so.DMuon(ps, lr=1e-2, ns_dtype="float64"),
    "DMuon soft": lambda ps: so.DMuon(ps, lr=1e-2, soft_kappa=0.3),
}
STEPS = 3


class Net(nn.Module):
    """Matrices tall and wide. Under FSDP2 their rows are uneven over 2 and 4 ranks (``A, C =
    21, 17``), and f's 3 rows leave a rank of 4 an empty shard; tensor parallelism's layers need
    sizes its ranks divide (``A, C = 20, 16``)."""

    def __init__(self, A: int = 21, C: int = 17) -> None:
        super().__init__()
        self.a = nn.Linear(6, A, bias=True, dtype=torch.float64)  # tall: rows are long
        self.b = nn.Linear(A, 5, bias=False, dtype=torch.float64)  # wide: columns are long
        self.c = nn.Linear(5, C, bias=False, dtype=torch.float64)  # tall
        self.d = nn.Linear(C, 3, bias=False, dtype=torch.float64)  # wide
        self.e = nn.Linear(3, 1, bias=False, dtype=torch.float64)  # wide, one row
        self.f = nn.Linear(1, 3, bias=False, dtype=torch.float64)  # tall, three rows

    def forward(self, x):
        h = torch.tanh(self.b(torch.tanh(self.a(x))))
        h = torch.tanh(self.d(torch.tanh(self.c(h))))
        return self.f(torch.tanh(self.e(h)))


def _parallelize(net: Net, layout: str, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    tp_plan = {"a": ColwiseParallel(), "b": RowwiseParallel(),
               "c": ColwiseParallel(), "d": RowwiseParallel()}  # fmt: skip
    if layout == "fsdp2":
        mesh = init_device_mesh("cpu", (world,))
        for m in (net.a, net.b, net.c, net.d, net.e, net.f):
            fully_shard(m, mesh=mesh)
        fully_shard(net, mesh=mesh)
    elif layout == "tp":
        parallelize_module(net, init_device_mesh("cpu", (world,)), tp_plan)
    else:  # 2d: FSDP over "dp", TP over "tp"
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(net, mesh["tp"], tp_plan)
        for m in (net.a, net.b, net.c, net.d, net.e, net.f):
            fully_shard(m, mesh=mesh["dp"])
        fully_shard(net, mesh=mesh["dp"])


def _run(
    name: str, layout: str | None, world: int = 1, gram: set | None = None
) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = Net() if layout in (None, "fsdp2") else Net(20, 16)
    if layout not in (None, "plain"):
        _parallelize(net, layout, world)
    for p in net.parameters():
        if gram is not None and p.dim() == 2 and spectra_dist.is_sharded(p):
            if spectra_dist.route_of(p, tuple(p.shape)).gram:
                gram.add(tuple(p.shape))
    opt = OPTIMIZERS[name](list(net.parameters()))
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(16, 6, generator=g, dtype=torch.float64)  # the same on every rank
        loss = 1e3 * net(x).square().mean()  # large gradients: the clips act
        loss.backward()
        opt.step()
        opt.zero_grad()
    out = {key: spectra_dist.whole(value) for key, value in net.state_dict().items()}
    return {k: v.detach().clone() for k, v in out.items()}


class Logged(logging.Handler):
    """The records of a logger, kept."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _worker(rank: int, tmp: str, world: int, layout: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world)
    assembled: list[tuple[int, ...]] = []
    real = spectra_dist.assemble

    def recording(u, p):
        assembled.append(tuple(p.shape))
        return real(u, p)

    spectra_dist.assemble = recording
    # DTensor's warning about several collectives in one redistribution (a 2-D mesh)
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    logged = Logged()
    logger.addHandler(logged)
    try:
        gram: set[tuple[int, ...]] = set()
        out = {name: _run(name, layout, world, gram) for name in OPTIMIZERS}
        torch.save(
            {"params": out, "assembled": assembled, "gram": gram, "logged": logged.messages},
            Path(tmp) / f"{layout}_{rank}.pt",
        )
        dist.barrier()
    finally:
        logger.removeHandler(logged)
        spectra_dist.assemble = real
        dist.destroy_process_group()


#: matrices the Gram route must take (by the volume model of route_of): FSDP2 splits rows, so
#: the tall ones; TP splits a's and c's rows (colwise) and b's and d's columns (rowwise), their
#: long sides; the 2-D mesh adds FSDP's rows to both
GRAM = {
    ("fsdp2", 2): {(21, 6), (17, 5)},
    ("fsdp2", 4): {(21, 6), (17, 5), (3, 1)},
    ("tp", 2): {(20, 6), (5, 20), (16, 5), (3, 16)},
    ("tp", 4): {(20, 6), (5, 20), (16, 5), (3, 16)},
    ("2d", 4): {(20, 6), (5, 20), (16, 5), (3, 16)},
}


@pytest.mark.parametrize(
    ("layout", "world"), [("fsdp2", 2), ("fsdp2", 4), ("tp", 2), ("tp", 4), ("2d", 4)]
)
def test_sharded_layouts_equal_one_process_without_gathering_gram_route_matrices(
    tmp_path, layout, world
):
    mp.spawn(_worker, args=(str(tmp_path), world, layout), nprocs=world, join=True)
    reference = {name: _run(name, None if layout == "fsdp2" else "plain") for name in OPTIMIZERS}
    for r in range(world):
        got = torch.load(tmp_path / f"{layout}_{r}.pt")
        for name, ref in reference.items():
            for key, value in ref.items():
                torch.testing.assert_close(
                    got["params"][name][key],
                    value,
                    rtol=1e-5,
                    atol=1e-8,
                    msg=lambda m, k=key, n=name: f"{n} {k}: {m}",
                )
        # no rank assembled a matrix the Gram route took
        assert GRAM[layout, world] <= got["gram"]
        assert not set(got["assembled"]) & got["gram"], (got["assembled"], got["gram"])
        # the 2-D mesh's gathers run one mesh dimension at a time: no warning from DTensor
        assert got["logged"] == []


def test_route_is_chosen_by_volume():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        tall = distribute_tensor(torch.zeros(64, 8), mesh, [Shard(0)])
        wide = distribute_tensor(torch.zeros(8, 64), mesh, [Shard(0)])
        # one rank: nothing is split, the whole-matrix route moves nothing
        assert not spectra_dist.route_of(tall, (64, 8)).gram
        assert spectra_dist.route_of(distribute_tensor(torch.zeros(8, 8), mesh, [Replicate()]),
                                     (8, 8)).volume == 0  # fmt: skip
        assert not spectra_dist.route_of(wide, (8, 64)).gram
    finally:
        dist.destroy_process_group()


def dtensor_stub(sizes: tuple[int, ...], dims: tuple[int, ...], shape=None):
    """What the routes' volume model reads of a float32 DTensor on a mesh of ``sizes``, split
    along tensor dimensions ``dims`` (one per mesh dimension): no process needed."""
    from torch.distributed.tensor import Shard

    class Mesh:
        pass

    class Stub:
        device_mesh = Mesh()
        dtype = torch.float32
        device = torch.device("cpu")

    Mesh.shape = sizes
    Stub.shape, Stub.placements = shape, tuple(Shard(d) for d in dims)
    return Stub()


@pytest.mark.parametrize(
    ("shape", "placements", "sizes", "gram"),
    [
        ((50304, 768), ["S0"], (8,), True),  # the 124M head, rows split: Gram 768²
        ((768, 3072), ["S0"], (8,), False),  # a wide matrix split along its short side
        ((768, 768), ["S0"], (8,), False),  # square: its Gram matrix moves as much
        ((3072, 768), ["S0", "S0"], (8, 8), True),
        ((768, 3072), ["S0", "S1"], (8, 8), True),  # FSDP rows × TP columns
    ],
)
def test_volume_model(shape, placements, sizes, gram):
    """The model of route_of on stand-ins for DTensors of large meshes (no process needed)."""
    stub = dtensor_stub(sizes, tuple(int(p[1]) for p in placements))
    route = spectra_dist.route_of(stub, shape)
    assert route.gram == gram
    m, n = shape
    total = 1
    for s in sizes:
        total *= s
    if not gram:
        # bytes received per rank: the all-gather and the owner's scatter (1-D meshes here)
        assert route.volume == pytest.approx((1 - 1 / total) * m * n * 4 * (1 + 1 / total))


os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


# --------------------------------------------------------------------------- both routes, 2-D


#: (shape, placements on a 2×2 mesh): square and oblong, even and uneven, FSDP × TP-like
MATRICES = [
    ((6, 6), "S0 S1"),
    ((7, 5), "S0 S0"),
    ((5, 9), "S0 S1"),
    ((9, 4), "S1 S0"),
    ((3, 11), "R S1"),
    ((11, 3), "S0 R"),
]


def _placements(spec: str) -> list:
    from torch.distributed.tensor import Replicate, Shard

    return [Replicate() if s == "R" else Shard(int(s[1])) for s in spec.split()]


def _spiked(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(4)
    X = torch.randn(6, 64, generator=g, dtype=torch.float64)
    X[0] += 100.0  # one direction with σ ≈ 800
    return X.to(dtype)


def _routes_worker(rank: int, tmp: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from spectra.optim.plan import SpectralOp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=4)
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    logged = Logged()
    logger.addHandler(logged)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        ops = [SpectralOp("soft_clip", 0.7), SpectralOp("hard_clip", 0.7),
               SpectralOp("orthogonalize", None)]  # fmt: skip
        out = {}
        for gram in (True, False):
            spectra_dist.GRAM_ROUTE = gram
            g = torch.Generator().manual_seed(3)
            for shape, spec in MATRICES:
                full = torch.randn(shape, generator=g, dtype=torch.float64)
                p = distribute_tensor(full, mesh, _placements(spec))
                for op in ops:
                    u = p.to_local().clone()
                    spectra_dist.apply_sharded([(op, u, p, shape)])
                    out[gram, shape, op.kind] = spectra_dist.assemble(u, p)
        # float32 with σ_max/c ≈ 1e3: the Gram route's float32 pass hands it to float64
        spike = _spiked(torch.float32)
        p = distribute_tensor(spike, mesh, _placements("S1 S1"))
        u = p.to_local().clone()
        spectra_dist.apply_sharded([(SpectralOp("soft_clip", 0.7), u, p, tuple(spike.shape))])
        out["spike"] = spectra_dist.assemble(u, p)
        out["fsdp_tp"] = _fsdp_over_tp(mesh, ops[0])
        out["logged"] = logged.messages
        torch.save(out, Path(tmp) / f"routes_{rank}.pt")
        dist.barrier()
    finally:
        logger.removeHandler(logged)
        spectra_dist.GRAM_ROUTE = True
        dist.destroy_process_group()


def _fsdp_over_tp(mesh, op) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(whole matrix, op on its shards, assembled)`` for FSDP2 over tensor parallelism's
    layouts: colwise weights are ``(_StridedShard(0), Shard(0))``, wide here, so they take the
    whole-matrix route; 6 rows split unevenly over the 2 × 2 mesh, 8 evenly."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    sizes = [22, 6, 22, 8, 3]
    net = nn.Sequential(*[nn.Linear(a, b, bias=False, dtype=torch.float64)
                          for a, b in itertools.pairwise(sizes)])  # fmt: skip
    wholes = [m.weight.detach().clone() for m in net]
    plan = {str(i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(4)}
    parallelize_module(net, mesh["tp"], plan)
    for m in net:
        fully_shard(m, mesh=mesh["dp"])
    out = []
    with torch.no_grad():  # as in a step
        for whole, m in zip(wholes, net, strict=True):
            p = m.weight
            u = p.to_local().clone()
            spectra_dist.apply_sharded([(op, u, p, tuple(p.shape))])
            out.append((whole, spectra_dist.assemble(u, p)))
    return out


def test_both_routes_on_a_2d_mesh_equal_the_operator_on_the_whole_matrix(tmp_path):
    from spectra.optim.plan import SpectralOp

    mp.spawn(_routes_worker, args=(str(tmp_path),), nprocs=4, join=True)
    g = torch.Generator().manual_seed(3)
    fulls = {shape: torch.randn(shape, generator=g, dtype=torch.float64) for shape, _ in MATRICES}
    ops = [SpectralOp("soft_clip", 0.7), SpectralOp("hard_clip", 0.7),
           SpectralOp("orthogonalize", None)]  # fmt: skip
    for r in range(4):
        got = torch.load(tmp_path / f"routes_{r}.pt")
        for gram in (True, False):
            for shape, _ in MATRICES:
                for op in ops:
                    want = op(fulls[shape].unsqueeze(0))[0]
                    torch.testing.assert_close(
                        got[gram, shape, op.kind], want, rtol=1e-9, atol=1e-12
                    )
        # against the exact clip (float64 SVD), as accurate as the single-process operator
        spike = _spiked(torch.float32)
        exact = SpectralOp("soft_clip", 0.7, "svd")(spike.double().unsqueeze(0))[0]
        single = SpectralOp("soft_clip", 0.7)(spike.unsqueeze(0))[0]
        err = (got["spike"].double() - exact).norm() / exact.norm()
        assert err <= max(2 * (single.double() - exact).norm() / exact.norm(), 1e-6)
        for whole, result in got["fsdp_tp"]:
            want = ops[0](whole.unsqueeze(0))[0]
            torch.testing.assert_close(result, want, rtol=1e-9, atol=1e-12)
        # S0 S0 and FSDP2 over TP are gathered one mesh dimension at a time, which DTensor's
        # single redistribution would do too, with a warning about it
        assert got["logged"] == []


# --------------------------------------------------------------------------- Gram route, per block

_OPS = [SpectralOp("soft_clip", 0.7), SpectralOp("hard_clip", 0.7),
        SpectralOp("orthogonalize", None)]  # fmt: skip

#: (shape, layout, placements, mesh): tensors of several matrices whose shards cut their
#: matrices, each of which the Gram route must clip as its own
BLOCKED = [
    # expert stacks, rows or columns split (tensor parallelism of experts)
    ((3, 14, 4), MatrixLayout(1), "S1", (4,)),
    ((3, 4, 13), MatrixLayout(1), "S2", (4,)),
    # a fused gate/up of unequal blocks, its rows split by FSDP2: a cut falls inside a block
    # and a rank's shard can lie in one block or in two
    ((22, 4), MatrixLayout(0, (9, 13), 0), "S0", (4,)),
    # GPT-2's Conv1D c_attn: (in, out) storage, q/k/v along its columns, columns split
    ((4, 30), MatrixLayout(0, (10, 10, 10), 1, True), "S1", (4,)),
    # experts split over one mesh dimension and their rows over the other
    ((4, 18, 3), MatrixLayout(1), "S0 S1", (2, 2)),
    # rows reduced, columns gathered: the gathered side whole, the reduced one split
    ((2, 20, 6), MatrixLayout(1, (8, 12), 1), "S1 S2", (2, 2)),
]


def _blocked_worker(rank: int, tmp: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=4)
    assembled: list[tuple[int, ...]] = []
    real_assemble = spectra_dist.assemble

    def assemble(u, p):
        assembled.append(tuple(p.shape))
        return real_assemble(u, p)

    try:
        g = torch.Generator().manual_seed(5)
        out, routes = {}, {}
        for shape, layout, spec, sizes in BLOCKED:
            mesh = init_device_mesh("cpu", sizes)
            full = torch.randn(shape, generator=g, dtype=torch.float64)
            p = distribute_tensor(full, mesh, _placements(spec))
            routes[shape] = spectra_dist.layout_route(p, layout).gram
            for op in _OPS:
                u = p.to_local().clone()
                spectra_dist.assemble = assemble
                try:
                    spectra_dist.apply_sharded([(op, u, p, shape)], [layout])
                finally:
                    spectra_dist.assemble = real_assemble
                out[shape, op.kind] = real_assemble(u, p)
        torch.save({"out": out, "routes": routes, "assembled": assembled},
                   Path(tmp) / f"blocked_{rank}.pt")  # fmt: skip
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_gram_route_clips_each_expert_and_block_of_a_sharded_tensor_as_its_own(tmp_path):
    mp.spawn(_blocked_worker, args=(str(tmp_path),), nprocs=4, join=True)
    g = torch.Generator().manual_seed(5)
    fulls = [torch.randn(shape, generator=g, dtype=torch.float64) for shape, *_ in BLOCKED]
    for r in range(4):
        got = torch.load(tmp_path / f"blocked_{r}.pt")
        assert got["assembled"] == []  # no rank held a whole tensor
        for (shape, layout, *_), full in zip(BLOCKED, fulls, strict=True):
            assert got["routes"][shape]
            for op in _OPS:
                # the reference: each matrix of the whole tensor, alone, by a float64 SVD
                want = full.clone()
                for X in layout.matrices(want):
                    X.copy_(SpectralOp(op.kind, op.c, "svd")(X.unsqueeze(0))[0])
                torch.testing.assert_close(got["out"][shape, op.kind], want, rtol=1e-9, atol=1e-11)


#: 64 experts of (4096, 1024)
EXPERTS = (64, 4096, 1024)


def test_layout_route_reduces_over_the_axis_whose_gram_matrices_are_smaller():
    experts = MatrixLayout(1)
    # experts over the first mesh dimension, their long rows over the second: a Gram matrix of
    # 1024² per expert (float32), reduced over 8 ranks, each holding 8 experts
    route = spectra_dist.layout_route(dtensor_stub((8, 8), (0, 1), EXPERTS), experts)
    assert (route.gram, route.transposed, route.reduce_dims, route.gather_dims) == (
        True, True, (1,), ())  # fmt: skip
    assert route.volume == pytest.approx((1 - 1 / 8) * 4 * 64 * (2 * 1024**2 + 1) / 8)
    # on one mesh dimension: the long rows split, Gram matrices of 1024²; the short columns
    # split, Gram matrices of 4096², larger than the experts themselves: the whole route
    rows = spectra_dist.layout_route(dtensor_stub((8,), (1,), EXPERTS), experts)
    assert rows.gram and rows.transposed
    assert rows.volume == pytest.approx((1 - 1 / 8) * 4 * 64 * (2 * 1024**2 + 1))
    columns = spectra_dist.layout_route(dtensor_stub((8,), (2,), EXPERTS), experts)
    assert not columns.gram
    assert columns.volume == pytest.approx((1 - 1 / 8) * 4 * 64 * 4096 * 1024 * (1 + 1 / 8))
    # experts split alone: each rank holds whole experts and clips them where they lie
    assert spectra_dist.holds_whole_matrices(dtensor_stub((8, 8), (0, 0), EXPERTS), experts)
