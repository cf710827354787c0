"""The GPU step's peak memory over torch AdamW's, modelled on the CPU at the 124M shapes.

Runs each optimizer's second step along the code path of a CUDA step and counts the bytes of
the tensors alive at its peak (:mod:`spectra_lab.bench.live_bytes`), beside torch AdamW's
(foreach). The bar of the GPU step is 1.10× by default. Prints a table and writes
``docs/data/gpu_step_memory_model.json``::

    python experiments/gpu_step_memory_model.py
"""

from __future__ import annotations

import argparse
import time

import spectra.optim as so
from spectra_lab.bench.live_bytes import gpu_path_peak, write_model_report
from spectra_lab.bench.optim import llama_shapes

ROWS = {
    "spectra-adamw (mixed, the CUDA default)": {"clip_method": "mixed"},
    "spectra-adamw-capturable (mixed)": {"clip_method": "mixed", "capturable": True},
    "spectra-adamw-polar": {"clip_method": "polar"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/data/gpu_step_memory_model.json")
    args = parser.parse_args()
    shapes = llama_shapes()
    rows = []
    for name, kw in ROWS.items():
        started = time.perf_counter()
        ratio = gpu_path_peak(lambda ps, kw=kw: so.AdamW(ps, lr=1e-3, clip_c=10.0, **kw), shapes)
        rows.append({"row": name, "peak_vs_torch_adamw": round(ratio, 4)})
        print(f"| {name} | {ratio:.3f} | {time.perf_counter() - started:.0f} s |", flush=True)
    write_model_report(
        args.out,
        "the GPU step's peak over torch AdamW's (foreach), modelled on the CPU along "
        "the CUDA code path (spectra_lab.bench.live_bytes), 124M shapes, float32",
        shapes,
        rows,
    )


if __name__ == "__main__":
    main()
