"""The operations a GPU step dispatches on its host, counted on the CPU at the 124M shapes.

Runs each optimizer's second step along the code path of a CUDA step and counts the aten
operations it dispatches (:func:`spectra_lab.bench.live_bytes.gpu_path_host_ops`): on a GPU
each is a dispatch on the host, and each ``compute`` one a kernel launch. In the H200's
profile of the default 124M step (docs/data/gpu/profile_124m_step.txt) the host's time
exceeded the kernels', so the count sets the step's time there. Torch AdamW (foreach) is the
reference. Prints a table and writes ``docs/data/gpu_step_host_ops.json``::

    python experiments/gpu_step_host_ops.py

``--large``: eight layers of the 780M shapes, where CUDA's ``mixed`` takes split bf16 products
(``spectra.ops.mixed.MIXED_SPLIT_FROM``), beside its float32 products (about seven minutes on
two cores), into ``docs/data/gpu_step_host_ops_780m.json``::

    python experiments/gpu_step_host_ops.py --large
"""

from __future__ import annotations

import argparse
import time

import torch

import spectra.optim as so
from spectra_lab.bench.live_bytes import gpu_path_host_ops, model_shapes, write_model_report

ROWS = {
    "torch-adamw (foreach)": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True),
    "spectra-adamw (mixed, the CUDA default)": lambda ps: so.AdamW(
        ps, lr=1e-3, clip_c=10.0, clip_method="mixed"
    ),
    "spectra-adamw-capturable (mixed)": lambda ps: so.AdamW(
        ps, lr=torch.tensor(1e-3), clip_c=10.0, clip_method="mixed", capturable=True
    ),
    "spectra-adamw-mixed-bf16 (split bf16 products)": lambda ps: so.AdamW(
        ps, lr=1e-3, clip_c=10.0, clip_method="mixed", clip_ns_dtype=torch.bfloat16
    ),
    "spectra-adamw-polar": lambda ps: so.AdamW(ps, lr=1e-3, clip_c=10.0, clip_method="polar"),
}


#: The rows at eight layers of the 780M shapes
LARGE_ROWS = {
    "torch-adamw (foreach)": ROWS["torch-adamw (foreach)"],
    "spectra-adamw (mixed, the CUDA default: split bf16 products)": lambda ps: so.AdamW(
        ps, lr=1e-3, clip_c=10.0, clip_method="mixed"
    ),
    "spectra-adamw-mixed-fp32 (float32 products)": lambda ps: so.AdamW(
        ps, lr=1e-3, clip_c=10.0, clip_method="mixed", clip_ns_dtype=torch.float32
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the JSON written (default: under docs/data/)")
    parser.add_argument("--large", action="store_true", help="eight layers of the 780M shapes")
    args = parser.parse_args()
    out = args.out or f"docs/data/gpu_step_host_ops{'_780m' if args.large else ''}.json"
    shapes, where = model_shapes(args.large)
    rows = []
    print("| row | operations | compute | views | reads | time |")
    for name, make in (LARGE_ROWS if args.large else ROWS).items():
        started = time.perf_counter()
        mode = gpu_path_host_ops(make, shapes)
        k = mode.kinds
        total = k["compute"] + k["view"] + k["read"]
        rows.append({"row": name, "operations": total, "compute": k["compute"],
                     "view": k["view"], "read": k["read"],
                     "most": dict(mode.names.most_common(12))})  # fmt: skip
        print(f"| {name} | {total} | {k['compute']} | {k['view']} | {k['read']} "
              f"| {time.perf_counter() - started:.0f} s |", flush=True)  # fmt: skip
    write_model_report(
        out,
        "aten operations dispatched by one optimizer step (the second), counted on the "
        "CPU along the CUDA code path (spectra_lab.bench.live_bytes.gpu_path_host_ops), "
        f"{where}, float32",
        shapes,
        rows,
    )


if __name__ == "__main__":
    main()
