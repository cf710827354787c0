"""The GPU step's peak memory over torch AdamW's, modelled on the CPU at the 124M shapes.

Runs each optimizer's second step along the code path of a CUDA step and counts the bytes of
the tensors alive at its peak (:mod:`spectra_lab.bench.live_bytes`), beside torch AdamW's
(foreach). The bar of the GPU step is 1.10× by default. Prints a table and writes
``docs/data/gpu_step_memory_model.json``::

    python experiments/gpu_step_memory_model.py

``--large``: eight layers of the 780M shapes (width 1280, SwiGLU 3584, its vocabulary), where
CUDA's ``mixed`` takes split bf16 products (``spectra.ops.mixed.MIXED_SPLIT_FROM``), beside
its float32 products (about five minutes on two cores), into
``docs/data/gpu_step_memory_model_780m.json``::

    python experiments/gpu_step_memory_model.py --large
"""

from __future__ import annotations

import argparse
import time

import spectra.optim as so
from spectra_lab.bench.live_bytes import gpu_path_peak, model_shapes, write_model_report

ROWS = {
    "spectra-adamw (mixed, the CUDA default)": {"clip_method": "mixed"},
    "spectra-adamw-capturable (mixed)": {"clip_method": "mixed", "capturable": True},
    "spectra-adamw-polar": {"clip_method": "polar"},
    "spectra-adamw-capturable-bf16 (split products of three parts)": {
        "clip_method": "mixed",
        "capturable": True,
        "clip_ns_dtype": "bfloat16",
    },
    "spectra-adamw-capturable-bf16-r100 (two parts under clip_ratio_bound=100)": {
        "clip_method": "mixed",
        "capturable": True,
        "clip_ns_dtype": "bfloat16",
        "clip_ratio_bound": 100.0,
    },
}


#: The rows at eight layers of the 780M shapes
LARGE_ROWS = {
    "spectra-adamw (mixed, the CUDA default: split bf16 products)": {"clip_method": "mixed"},
    "spectra-adamw-mixed-fp32 (float32 products)": {
        "clip_method": "mixed",
        "clip_ns_dtype": "float32",
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the JSON written (default: under docs/data/)")
    parser.add_argument("--large", action="store_true", help="eight layers of the 780M shapes")
    args = parser.parse_args()
    out = args.out or f"docs/data/gpu_step_memory_model{'_780m' if args.large else ''}.json"
    shapes, where = model_shapes(args.large)
    rows = []
    for name, kw in (LARGE_ROWS if args.large else ROWS).items():
        started = time.perf_counter()
        ratio = gpu_path_peak(lambda ps, kw=kw: so.AdamW(ps, lr=1e-3, clip_c=10.0, **kw), shapes)
        rows.append({"row": name, "peak_vs_torch_adamw": round(ratio, 4)})
        print(f"| {name} | {ratio:.3f} | {time.perf_counter() - started:.0f} s |", flush=True)
    write_model_report(
        out,
        "the GPU step's peak over torch AdamW's (foreach), modelled on the CPU along "
        f"the CUDA code path (spectra_lab.bench.live_bytes), {where}, float32",
        shapes,
        rows,
    )


if __name__ == "__main__":
    main()
