"""SPECTRA under torch.distributed, with 2 gloo processes on CPU, against one process.

* Replicated parameters (DDP): the spectral work is divided among the ranks, and the weights
  equal one process's.
* Sharded parameters (FSDP2, ``fully_shard``): uneven and empty shards; the weights equal an
  unsharded run's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import spectra.optim as so
from spectra.optim import plan as spectra_plan

WORLD = 2
SHAPES = [(7, 5), (7, 5), (5, 3), (9, 4), (1, 4), (5,)]  # odd rows: uneven and empty shards

OPTIMIZERS = {
    "AdamW": lambda ps, **kw: so.AdamW(ps, lr=1e-2, **kw),
    "Signum": lambda ps, **kw: so.Signum(ps, lr=1e-2, **kw),
    "AdEMAMix": lambda ps, **kw: so.AdEMAMix(ps, lr=1e-2, **kw),
    "MARS": lambda ps, **kw: so.MARS(ps, lr=1e-2, **kw),
    "SGDM": lambda ps, **kw: so.SGDM(ps, lr=5e-2, momentum=0.5, **kw),
    "Spectra(torch AdamW)": lambda ps, **kw: so.Spectra(
        torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1), **kw
    ),
}
#: The baselines have their own steps (no SPECTRA chain); under FSDP2 they see whole matrices.
BASELINES = {
    # float64 Newton–Schulz: its Gram-route form equals the iteration on the whole matrix to
    # rounding (in bf16 the whole-matrix iteration's own rounding is 10–20%)
    "DMuon": lambda ps: so.DMuon(ps, lr=1e-2, ns_dtype="float64"),
    "SOAP": lambda ps: so.SOAP(ps, lr=1e-2, precondition_frequency=2),
}
SPECTRA_KW = {"clip_c": 0.3, "pre_clip_c": 2.0}
STEPS = 3


def _spawn(fn, tmp_path: Path, *args) -> None:
    mp.spawn(_worker, args=(fn, str(tmp_path), args), nprocs=WORLD, join=True)


def _worker(rank: int, fn, tmp: str, args) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=WORLD)
    try:
        fn(rank, Path(tmp), *args)
        # no rank tears the group down (and its file store) while another still uses it
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).requires_grad_() for s in SHAPES]


def _grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [3 * torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]


def _train_plain(name: str, split_work: bool = True) -> list[torch.Tensor]:
    ps = _params()
    opt = OPTIMIZERS[name](ps, split_work=split_work, **SPECTRA_KW)
    for k in range(STEPS):
        for p, g in zip(ps, _grads(k), strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in ps]


# --------------------------------------------------------------------------- DDP: the split


def _replicated_worker(rank: int, tmp: Path) -> None:
    calls: list[tuple[int, ...]] = []
    real = spectra_plan.soft_clip

    def counting(X, c, **kw):
        calls.append(tuple(X.shape))
        return real(X, c, **kw)

    spectra_plan.soft_clip = counting
    out = {name: _train_plain(name) for name in OPTIMIZERS}
    spectra_plan.soft_clip = real
    torch.save({"params": out, "calls": calls}, tmp / f"replicated_{rank}.pt")


def test_ddp_split_divides_the_spectral_work_and_equals_one_process(tmp_path):
    _spawn(_replicated_worker, tmp_path)
    ranks = [torch.load(tmp_path / f"replicated_{r}.pt") for r in range(WORLD)]
    for name in OPTIMIZERS:
        reference = _train_plain(name)
        for rank in ranks:
            for a, b in zip(rank["params"][name], reference, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # Every clipped matrix was clipped on exactly one rank: the matrices with a pre and a post
    # operator (5 of the 6 tensors) per step and optimizer, split between the two ranks.
    # (The constructor's probe of clip_method acts on a 2×2 identity; it is not counted.)
    per_rank = [sum(c[0] for c in rank["calls"] if c[1:] != (2, 2)) for rank in ranks]
    assert sum(per_rank) == 2 * 5 * STEPS * len(OPTIMIZERS)
    assert all(n > 0 for n in per_rank)


MIXED_SHAPES = [(24, 40)] * 6 + [(40, 24)] * 3 + [(40,)]


def _train_mixed() -> list[torch.Tensor]:
    # float32 matrices whose directions (SGD-M's: the gradients' scale) span σ_max/c ≈ 1–100,
    # so that each batch's largest α, which sets the batch's schedule, depends on which
    # matrices share it
    g = torch.Generator().manual_seed(0)
    ps = [torch.randn(s, generator=g).requires_grad_() for s in MIXED_SHAPES]
    opt = so.SGDM(ps, lr=1e-2, clip_c=0.5, clip_method="mixed")
    for _ in range(STEPS):
        for i, p in enumerate(ps):
            p.grad = 0.05 * 100 ** (i / 8) * torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach() for p in ps]


def _mixed_worker(rank: int, tmp: Path) -> None:
    torch.save(_train_mixed(), tmp / f"mixed_{rank}.pt")


def test_ddp_split_takes_whole_batches_so_a_batch_shared_schedule_equals_one_process(tmp_path):
    # "mixed" runs one schedule per batch, set by the batch's largest α: the ranks divide the
    # batches one process forms, not the matrices, and the weights equal one process's
    _spawn(_mixed_worker, tmp_path)
    reference = _train_mixed()
    for r in range(WORLD):
        for a, b in zip(torch.load(tmp_path / f"mixed_{r}.pt"), reference, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_replicated_owners_take_the_batches_of_one_process():
    from spectra.ops.batched import batch_indices

    op = spectra_plan.SpectralOp("soft_clip", 0.5, "mixed")
    mats = [torch.zeros(s) for s in [(24, 40)] * 6 + [(40, 24)] * 3]
    # one batch per shape (under MATMUL_MIN_BATCH elements), or two matrices a batch
    assert batch_indices([(op, mats)]) == [(0, list(range(6))), (0, [6, 7, 8])]
    assert batch_indices([(op, mats)], max_elements=2 * 960) == [
        (0, [0, 1]), (0, [2, 3]), (0, [4, 5]), (0, [6, 7]), (0, [8])
    ]  # fmt: skip


ADAPTIVE_KW = {"clip_c": 0.3, "pre_clip_kappa": 0.5, "pre_clip_beta": 0.5}


def _train_adaptive() -> list[torch.Tensor]:
    ps = _params()
    opt = so.AdamW(ps, lr=1e-2, **ADAPTIVE_KW)
    for k in range(STEPS + 2):
        for p, g in zip(ps, _grads(k), strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in ps]


def _adaptive_worker(rank: int, tmp: Path) -> None:
    torch.save(_train_adaptive(), tmp / f"adaptive_{rank}.pt")


def test_adaptive_pre_clip_under_ddp_equals_one_process(tmp_path):
    _spawn(_adaptive_worker, tmp_path)
    reference = _train_adaptive()
    for r in range(WORLD):
        for a, b in zip(torch.load(tmp_path / f"adaptive_{r}.pt"), reference, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _unreplicated_worker(rank: int, tmp: Path) -> None:
    ps = _params(seed=rank)  # a different model on each rank
    opt = so.AdamW(ps)
    for p in ps:
        p.grad = torch.ones_like(p)
    try:
        opt.step()
    except ValueError as exc:
        (tmp / f"error_{rank}.txt").write_text(str(exc))


def test_split_refuses_parameters_that_differ_across_ranks(tmp_path):
    _spawn(_unreplicated_worker, tmp_path)
    for r in range(WORLD):
        assert "split_work=False" in (tmp_path / f"error_{r}.txt").read_text()


def test_owners_are_balanced_by_cost_not_count():
    shapes = [(100, 100)] + [(10, 10)] * 10
    owners = so.replicated.assign_owners(shapes, 2)
    assert owners[0] == 0 and set(owners[1:]) == {1}


# --------------------------------------------------------------------------- FSDP2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # 7 and 9 rows are uneven over 2 ranks; the 1-row matrix leaves rank 1 an empty shard.
        self.a = nn.Linear(5, 7, bias=False, dtype=torch.float64)
        self.b = nn.Linear(7, 9, bias=True, dtype=torch.float64)
        self.c = nn.Linear(9, 1, bias=False, dtype=torch.float64)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def _net_run(
    name: str, sharded: bool, device: str = "cpu", world: int = WORLD
) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = Net().to(device)
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device, (world,))
        for m in (net.a, net.b, net.c):
            fully_shard(m, mesh=mesh)
        fully_shard(net, mesh=mesh)
    params = list(net.parameters())
    opt = BASELINES[name](params) if name in BASELINES else OPTIMIZERS[name](params, **SPECTRA_KW)
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(16, 5, generator=g, dtype=torch.float64).to(device)  # same on every rank
        loss = 1e3 * net(x).square().mean()  # large gradients: the clips act
        loss.backward()
        opt.step()
        opt.zero_grad()
    out = {}
    for key, value in net.state_dict().items():
        out[key] = value.full_tensor() if hasattr(value, "full_tensor") else value
    return {k: v.detach().cpu().clone() for k, v in out.items()}


def _fsdp_worker(rank: int, tmp: Path) -> None:
    out = {name: _net_run(name, sharded=True) for name in [*OPTIMIZERS, *BASELINES]}
    torch.save(out, tmp / f"fsdp_{rank}.pt")


def test_fsdp2_sharded_parameters_equal_the_unsharded_run(tmp_path):
    _spawn(_fsdp_worker, tmp_path)
    for r in range(WORLD):
        got = torch.load(tmp_path / f"fsdp_{r}.pt")
        for name in [*OPTIMIZERS, *BASELINES]:
            ref = _net_run(name, sharded=False)
            for key, value in ref.items():
                torch.testing.assert_close(
                    got[name][key],
                    value,
                    rtol=1e-10,
                    atol=1e-12,
                    msg=lambda m, n=name, k=key: f"{n} {k}: {m}",
                )


@pytest.fixture(autouse=True)
def _no_stray_env(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    yield
    assert not dist.is_initialized()


os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


# --------------------------------------------------------------------------- the benchmark


def test_bench_dist_times_split_and_unsplit_steps_and_models_the_volume(tmp_path, capsys):
    import argparse
    import json

    from spectra_lab.bench import dist as bench

    clipped, total = bench.clipped_and_total("tiny", 100)
    v = bench.volume_model(clipped, total, 4, bytes_per=4)
    assert v["ddp_allreduce"] == pytest.approx(2 * 0.75 * total * 4)
    assert v["ddp_split"] == pytest.approx(0.75 * clipped * 4)
    assert v["fsdp2_spectral"] == clipped * 4
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "dist.json"
    args = parser.parse_args(
        [
            "--preset",
            "tiny",
            "--vocab",
            "100",
            "--procs",
            "1",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--volume",
            "tiny",
            "--traffic-procs",
            "4",
            "--model-presets",
            "124m",
            "--ranks",
            "8",
            "--json",
            str(out),
        ]
    )
    assert bench.run(args) == 0
    report = json.loads(out.read_text())
    assert [r["procs"] for r in report["timing"]] == [1, 2]
    assert all(r["split"] > 0 and r["unsplit"] > 0 for r in report["timing"])
    printed = capsys.readouterr().out
    assert "split (s)" in printed and "MiB received per rank" in printed
    # the counted bytes are what the routes' model says, layout by layout (the model leaves
    # out the step's two finite checks: an all-reduce of one float32 each, 6 bytes a rank)
    layouts = {r["layout"]: r for r in report["traffic"]}
    assert set(layouts) == set(bench.LAYOUTS)
    for r in layouts.values():
        assert sum(r["received"]) / 4 == pytest.approx(r["model"], abs=16)
    # the Gram route moves less than the gather of whole matrices under FSDP2
    assert layouts["fsdp2-gram"]["model"] < layouts["fsdp2-whole"]["model"]
    assert layouts["fsdp2-gram"]["calls"].get("reduce_", 0) > 0
    (row,) = report["traffic_model"]
    assert row["preset"] == "124m" and row["fsdp2-gram"] < row["fsdp2-whole"]


def test_unsupported_dtensor_layouts_are_refused_by_name():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Shard, distribute_tensor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        cube = init_device_mesh("cpu", (1, 1, 1))  # a 3-D mesh
        placements = [Shard(0), Shard(1), Shard(0)]
        p = nn.Parameter(distribute_tensor(torch.randn(4, 4), cube, placements))
        opt = so.AdamW([torch.zeros(2, requires_grad=True), p])
        p.grad = distribute_tensor(torch.randn(4, 4), cube, placements)
        with pytest.raises(ValueError, match=r"parameter 0 of group 0 of shape \(4, 4\) .*3-D"):
            opt.step()
        square = init_device_mesh("cpu", (1, 1), mesh_dim_names=("a", "b"))
        q = nn.Parameter(distribute_tensor(torch.randn(4, 4), square, [Shard(0), Shard(1)]))
        q.grad = distribute_tensor(torch.randn(4, 4), square, [Shard(0), Shard(1)])
        opt = so.AdamW([q])
        opt.step()  # a 2-D mesh is taken
        from torch.distributed.tensor import DTensor

        bad = nn.Parameter(DTensor.from_local(torch.randn(4, 4), square, [Shard(0), Partial()]))
        bad.grad = DTensor.from_local(torch.randn(4, 4), square, [Shard(0), Partial()])
        with pytest.raises(ValueError, match="Partial"):
            so.AdamW([bad]).step()
        row = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        q = nn.Parameter(distribute_tensor(torch.randn(4, 4), row, [Shard(0)]))
        opt = so.AdamW([q], pre_clip_kappa=2.0)
        q.grad = distribute_tensor(torch.randn(4, 4), row, [Shard(0)])
        with pytest.raises(ValueError, match=r"adaptive pre-clipping .* \(shape \(4, 4\)\)"):
            opt.step()
    finally:
        dist.destroy_process_group()


def test_bench_dist_measures_only_the_layouts_a_process_count_can_take():
    # cpu-small has 6 heads: 4 tensor-parallel processes cannot split them (the trainer says
    # so), 2 can, and the 2-D mesh of 4 puts 2 on its tensor-parallel side
    from spectra_lab.bench.dist import LAYOUTS, _layouts_for
    from spectra_lab.model import model_config

    assert model_config("cpu-small", 4096).n_heads == 6
    assert _layouts_for(list(LAYOUTS), 4, "cpu-small", 4096) == [x for x in LAYOUTS if x != "tp"]
    assert _layouts_for(list(LAYOUTS), 2, "cpu-small", 4096) == [x for x in LAYOUTS if x != "2d"]
