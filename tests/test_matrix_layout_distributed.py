"""Expert stacks and fused blocks under torch.distributed (2 gloo processes on CPU): the DDP
split and FSDP2 (its Gram route included) treat each expert and block as its own matrix and
equal one process; FSDP1's
flattened parameters are refused by name."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import spectra
import spectra.optim as so
from spectra.optim import chain
from spectra.optim import distributed as spectra_dist

WORLD = 2
STEPS = 3
SETTINGS = {"lr": 1e-2, "clip_c": 0.5, "pre_clip_c": 2.0, "clip_method": "eigh"}


def _spawn(fn, tmp_path: Path) -> None:
    mp.spawn(_worker, args=(fn, str(tmp_path)), nprocs=WORLD, join=True)


def _worker(rank: int, fn, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=WORLD)
    try:
        fn(rank, Path(tmp))
        dist.barrier()
    finally:
        dist.destroy_process_group()


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden_dim = 6
        # 3 experts: uneven over 2 ranks
        self.gate_up_proj = nn.Parameter(torch.randn(3, 8, 6, dtype=torch.float64))
        self.down_proj = nn.Parameter(torch.randn(3, 6, 4, dtype=torch.float64))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = Experts()
        self.qkv = nn.Linear(6, 18, bias=False, dtype=torch.float64)
        # three tall blocks: FSDP2's cut at row 18 falls inside the second
        self.fused = nn.Linear(6, 36, bias=False, dtype=torch.float64)

    def forward(self, x):
        h = torch.tanh(self.qkv(x)).view(*x.shape[:-1], 3, 6).sum(-2)
        h = h + torch.tanh(self.fused(h)).view(*h.shape[:-1], 6, 6).sum(-2)
        for e in range(3):
            gate, up = (h @ self.experts.gate_up_proj[e].T).chunk(2, dim=-1)
            h = h + torch.tanh(gate) * up @ self.experts.down_proj[e].T
        return h


def _run(mode: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = Net()
    if mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(net, mesh=init_device_mesh("cpu", (WORLD,)))
    groups = spectra.matrix_param_groups(
        net, splits={"fused.weight": ((12, 12, 12), 0)}, **SETTINGS
    )
    opt = so.AdamW(groups, split_work=mode == "ddp")
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(16, 6, generator=g, dtype=torch.float64)
        (1e3 * net(x).square().mean()).backward()
        opt.step()
        opt.zero_grad()
    out = {}
    for key, value in net.state_dict().items():
        out[key] = value.full_tensor() if hasattr(value, "full_tensor") else value
    return {k: v.detach().clone() for k, v in out.items()}


def _split_worker(rank: int, tmp: Path) -> None:
    clipped: list[tuple[int, ...]] = []
    gathered: list[tuple[int, ...]] = []
    by_gram: list[tuple[int, ...]] = []
    real_apply, real_assemble = chain.apply_replicated, spectra_dist.assemble
    real_gram = spectra_dist.apply_gram

    def apply_replicated(items, *args, **kwargs):
        clipped.extend(tuple(X.shape) for _, X in items)
        return real_apply(items, *args, **kwargs)

    def assemble(u, p):
        gathered.append(tuple(p.shape))
        return real_assemble(u, p)

    def apply_gram(items, layouts=None):
        by_gram.extend(tuple(p.shape) for _, _, p, _, _ in items)
        return real_gram(items, layouts)

    chain.apply_replicated, spectra_dist.assemble = apply_replicated, assemble
    spectra_dist.apply_gram = apply_gram
    out = {"ddp": _run("ddp"), "fsdp2": _run("fsdp2")}
    record = {"clipped": clipped, "gathered": gathered, "by_gram": by_gram}
    torch.save({**out, **record}, tmp / f"split_{rank}.pt")


def test_ddp_split_and_fsdp2_clip_each_expert_and_block_and_equal_one_process(tmp_path):
    _spawn(_split_worker, tmp_path)
    reference = _run("one")
    for r in range(WORLD):
        got = torch.load(tmp_path / f"split_{r}.pt")
        for mode in ("ddp", "fsdp2"):
            for key, value in reference.items():
                # the Gram route clips from G, rounded otherwise than the clip of the whole
                # block: 3e-10 apart after 3 steps, where clipping the fused tensor whole
                # instead of block by block moves it by 2e-2 (relative to its largest entry)
                torch.testing.assert_close(
                    got[mode][key], value, rtol=1e-8, atol=1e-10, msg=lambda m, k=key: f"{k}: {m}"
                )
        # the DDP split's items are the matrices: 3 + 3 gate and up blocks, 3 experts of
        # down_proj, q, k and v, the fused tensor's 3 blocks, per pre and post link and step
        per_step = sorted([(4, 6)] * 6 + [(6, 4)] * 3 + [(6, 6)] * 3 + [(12, 6)] * 3)
        assert sorted(got["clipped"]) == sorted(per_step * 2 * STEPS)
        # FSDP2 gives each rank whole experts, which it clips where they lie; the fused q/k/v
        # (its rows split across square blocks, whose Gram matrices move as much) is gathered
        # whole, by the pre and post links; the fused tall blocks take the Gram route, which
        # clips each block as its own without gathering it
        assert got["gathered"] == [(18, 6)] * 2 * STEPS
        assert got["by_gram"] == [(36, 6)] * 2 * STEPS


def _fsdp1_worker(rank: int, tmp: Path) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    messages = []
    for orig in (False, True):
        torch.manual_seed(0)
        layers = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 2))
        cpu = torch.device("cpu")
        net = FullyShardedDataParallel(layers, device_id=cpu, use_orig_params=orig)
        try:
            so.AdamW(net.parameters())
            messages.append("no error")
        except ValueError as err:
            messages.append(str(err))
    torch.save(messages, tmp / f"fsdp1_{rank}.pt")


def test_fsdp1_flat_parameters_are_refused_naming_fsdp1_and_fully_shard(tmp_path):
    _spawn(_fsdp1_worker, tmp_path)
    for r in range(WORLD):
        for message in torch.load(tmp_path / f"fsdp1_{r}.pt"):
            assert message.startswith("AdamW: parameter 0 of its group (shape (")
            assert "is a flattened FSDP1 (FullyShardedDataParallel) shard" in message
            assert message.endswith(
                "shard the model with FSDP2's torch.distributed.fsdp.fully_shard instead"
            )
