"""The soft clip's error against the float64 SVD on spiked spectra, per σ_max/c, for the tables
of docs/operators.md (``spectra docs`` renders them from the file this writes).

Inputs: ``spectra_lab.bench.matrices.spiked`` (the ``tests/test_ops.py`` inputs): singular
values ``c·logspace(0, −3)`` with the largest set to ``σ_max = spike·c``, and the singular
vectors of an Adam-like, a sign or a Gaussian matrix; float32. Three sweeps:

* ``polar``: one 768×3072 matrix per kind, c = 1: ``polar``'s step count and working precision,
  its error in that precision and forced to float32, and the paper's float32 run's (N_s = 10);
* ``eigh``: 256×256 and 256×1024, c = 1: the float32 ``eigh`` path alone (its error range);
* ``split``: 64×128, 128×64 and 192×512, c = 0.7: ``polar`` as it runs by default, ``polar``
  with split bf16 products, and the paper's bf16 run (their error ranges).

    python experiments/operator_errors.py --json docs/data/operator_errors_spiked.json
"""

from __future__ import annotations

import argparse

import torch

from spectra.ops import soft_clip
from spectra.ops.polar import polar_steps
from spectra_lab.bench.matrices import spiked
from spectra_lab.bench.ops import references, rel_err
from spectra_lab.files import write_json_atomic
from spectra_lab.machine import device_about

KINDS = ("adam", "sign", "gauss")


def error(X: torch.Tensor, c: float, **kwargs) -> float:
    return rel_err(soft_clip(X, c, **kwargs), references(X, c)["soft"])


def polar_sweep() -> list[dict]:
    rows = []
    for spike in (1.0, 30.0, 100.0, 316.0, 1000.0):
        inputs = [spiked((768, 3072), 1.0, spike, kind) for kind in KINDS]
        steps, dtype = polar_steps(inputs[0], 1.0)
        rows.append({
            "sigma_over_c": spike, "steps": steps, "dtype": str(dtype).removeprefix("torch."),
            "polar": max(error(X, 1.0, method="polar") for X in inputs),
            "polar_fp32": max(error(X, 1.0, method="polar", ns_dtype=torch.float32)
                              for X in inputs),
            "paper_fp32": max(error(X, 1.0, method="paper", ns_dtype=torch.float32)
                              for X in inputs),
        })  # fmt: skip
    return rows


def eigh_sweep() -> list[dict]:
    rows = []
    for spike in (10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0):
        errs = [error(spiked(shape, 1.0, spike, kind), 1.0, method="eigh", ns_dtype=torch.float32)
                for shape in ((256, 256), (256, 1024)) for kind in KINDS]  # fmt: skip
        rows.append({"sigma_over_c": spike, "min": min(errs), "max": max(errs)})
    return rows


def split_sweep() -> list[dict]:
    methods = {"polar": {"method": "polar"},
               "polar_split_bf16": {"method": "polar", "ns_dtype": torch.bfloat16},
               "paper_bf16": {"method": "paper", "ns_dtype": torch.bfloat16}}  # fmt: skip
    rows = []
    for spike in (1.0, 3.0, 10.0, 30.0, 90.0, 300.0, 1000.0):
        inputs = [spiked(shape, 0.7, spike, kind)
                  for shape in ((64, 128), (128, 64), (192, 512)) for kind in KINDS]  # fmt: skip
        row = {"sigma_over_c": spike}
        for name, kwargs in methods.items():
            errs = [error(X, 0.7, **kwargs) for X in inputs]
            row[name] = [min(errs), max(errs)]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, help="where to write the measured errors")
    args = parser.parse_args(argv)
    report = {"machine": device_about("cpu"), "polar": polar_sweep(), "eigh": eigh_sweep(),
              "split": split_sweep()}  # fmt: skip
    write_json_atomic(args.json, report)
    for key in ("polar", "eigh", "split"):
        for row in report[key]:
            print(key, row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
