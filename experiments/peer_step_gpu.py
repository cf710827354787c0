"""The optimizer step beside the peers a GPU user would pick, at the 124M and 780M shapes.

Rows, each on fresh parameters with fixed random gradients, all in one process and at the
same shapes (``spectra_lab.bench.optim.llama_shapes``):

* ``torch-adamw`` (foreach) and ``torch-adamw-fused`` (``fused=True``);
* ``torch-muon``: ``torch.optim.Muon`` (5 bf16 Newton–Schulz steps) on the hidden matrices
  and torch AdamW on the embedding, the output head and the norms, as torch's docs set it up;
* ``spectra-dmuon``: spectra's D-Muon;
* ``spectra-adamw`` (the default clip method) and ``spectra-adamw-mixed``.

Times are medians of device-synchronised steps. Usage (a CUDA GPU, or the CPU at a smaller
size)::

    PYTHONPATH=src python experiments/peer_step_gpu.py --out peer_step.json
    PYTHONPATH=src python experiments/peer_step_gpu.py --device cpu --sizes tiny --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

import spectra
from spectra_lab.bench.optim import llama_shapes
from spectra_lab.files import write_json_atomic

SIZES = {  # layers, width, SwiGLU hidden, vocabulary
    "124m": (12, 768, 2048, 50304),
    "780m": (32, 1280, 3584, 50304),
    "tiny": (2, 128, 256, 1024),
}
ROWS = ("torch-adamw", "torch-adamw-fused", "torch-muon", "spectra-dmuon", "spectra-adamw",
        "spectra-adamw-mixed")  # fmt: skip
KW = {"lr": 1e-3, "weight_decay": 0.1}


class Pair:
    """torch's Muon on the hidden matrices, torch AdamW on the rest."""

    def __init__(self, params: list[torch.Tensor], vocab: int) -> None:
        hidden = [p for p in params if p.dim() == 2 and p.shape[0] != vocab]
        rest = [p for p in params if not (p.dim() == 2 and p.shape[0] != vocab)]
        self.opts = [torch.optim.Muon(hidden, **KW), torch.optim.AdamW(rest, foreach=True, **KW)]

    def step(self) -> None:
        for o in self.opts:
            o.step()


def make(row: str, params: list[torch.Tensor], vocab: int) -> Any:
    if row == "torch-adamw":
        return torch.optim.AdamW(params, foreach=True, **KW)
    if row == "torch-adamw-fused":
        return torch.optim.AdamW(params, fused=True, **KW)
    if row == "torch-muon":
        return Pair(params, vocab)
    if row == "spectra-dmuon":
        return spectra.DMuon(params, **KW)
    if row == "spectra-adamw":
        return spectra.AdamW(params, clip_c=10.0, **KW)
    return spectra.AdamW(params, clip_c=10.0, clip_method="mixed", **KW)


def fresh_params(size: str, device: torch.device) -> list[torch.Tensor]:
    """Parameters of ``size``'s shapes with fixed random gradients, drawn on ``device``."""
    g = torch.Generator(device=device).manual_seed(0)
    params = [(0.02 * torch.randn(s, generator=g, device=device)).requires_grad_()
              for s in llama_shapes(*SIZES[size])]  # fmt: skip
    for p in params:
        p.grad = 0.01 * torch.randn(p.shape, generator=g, device=device)
    return params


def time_row(row: str, size: str, device: torch.device, repeats: int, warmup: int) -> dict:
    vocab = SIZES[size][3]
    params = fresh_params(size, device)
    opt = make(row, params, vocab)
    for _ in range(warmup):
        opt.step()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return {"row": row, "size": size, "step_ms": 1e3 * statistics.median(times),
            "times_ms": [1e3 * t for t in times]}  # fmt: skip


def write_profile(path: str, device: torch.device) -> None:
    """torch.profiler's table of one default Spectra-AdamW step at the 124M shapes."""
    params = fresh_params("124m", device)
    opt = make("spectra-adamw", params, SIZES["124m"][3])
    for _ in range(3):
        opt.step()
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with torch.profiler.profile(activities=acts) as prof:
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    with open(path, "w") as f:
        f.write(prof.key_averages().table(sort_by=key, row_limit=30) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", nargs="+", choices=tuple(SIZES), default=["124m", "780m"])
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument(
        "--profile",
        default=None,
        help="write torch.profiler's top kernels of one 124M spectra-adamw step here",
    )
    args = ap.parse_args()
    device = torch.device(args.device)
    results = []
    for size in args.sizes:
        for row in args.rows:
            r = time_row(row, size, device, args.repeats, args.warmup)
            results.append(r)
            print(f"{size:>5} {row:<20} {r['step_ms']:9.2f} ms", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    about = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
             "torch": torch.__version__, "results": results}  # fmt: skip
    if args.out:
        write_json_atomic(args.out, about)
    if args.profile:
        write_profile(args.profile, device)
    print(json.dumps({r["size"] + " " + r["row"]: round(r["step_ms"], 2) for r in results}))


if __name__ == "__main__":
    main()
