"""``spectra bench memory``: optimizer-state memory per optimizer, measured against the formula.

For each optimizer of the harness's registry, on a model preset: the elements held in
``optimizer.state`` after one step (tensors of one element, such as step counters, are
counted apart), next to the formula of "Enhancing LLM Training via Spectral Clipping",
Table memory-optimizer, in units of the model's parameter count M:

===================  ==========================================  ==========================
optimizer            state buffers                               formula
===================  ==========================================  ==========================
AdamW                m, v                                        2M
AdEMAMix             m_fast, m_slow, v                           3M
Signum, SGD-M        m                                           M
D-Muon               m (Muon matrices), m, v (AdamW parameters)  M_muon + 2·M_adamw
SOAP                 m, v, GG and Q per dimension d ≤ D          2M + Σ_{d ≤ D} 2d²
MARS (AdamW)         m, v, g_prev (matrices)                     2M + M_2d (≈ 3M)
===================  ==========================================  ==========================

SPECTRA adds no state: ``spectra-X`` has the formula of ``X``. Each formula is part of the
optimizer's row of the registry (``Recipe.state`` in :mod:`spectra_lab.train.optimizers`).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from spectra_lab.bench.step import build
from spectra_lab.errors import CLIError

DEFAULT_OPTIMIZERS = (
    "adamw", "spectra-adamw", "ademamix", "spectra-ademamix", "signum", "spectra-signum",
    "mars", "spectra-mars", "dmuon", "soap",
)  # fmt: skip


def formula(name: str, optimizer: torch.optim.Optimizer) -> tuple[int, str]:
    """The paper's state size for ``optimizer`` (elements) and the formula in words, from the
    registry's row of ``name`` (``Recipe.state``)."""
    from spectra_lab.train.optimizers import OPTIMIZERS

    if name not in OPTIMIZERS:
        raise ValueError(f"no memory formula for {name!r}")
    state = OPTIMIZERS[name].state
    return state.elements(optimizer), state.words


def measure(name: str, preset: str, seed: int = 0) -> dict[str, Any]:
    """State elements of ``name`` after one step on ``preset``, against :func:`formula`."""
    _, model, _, optimizer = build(name, preset, seed=seed, steps=10, warmup_steps=1)
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = 1e-3 * torch.randn(p.shape, generator=gen)
    optimizer.step()
    big = small = 0

    def count(value: Any) -> None:
        nonlocal big, small
        if isinstance(value, torch.Tensor):
            if value.numel() > 1:
                big += value.numel()
            else:
                small += value.numel()
        elif isinstance(value, (list, tuple)):
            for item in value:
                count(item)
        elif isinstance(value, dict):
            for item in value.values():
                count(item)

    for state in optimizer.state.values():
        count(state)
    expected, words = formula(name, optimizer)
    params = sum(p.numel() for p in model.parameters())
    return {
        "optimizer": name,
        "parameters": params,
        "state_elements": big,
        "scalars": small,
        "formula": words,
        "formula_elements": expected,
        "factor": big / params,
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from spectra_lab.train.optimizers import OPTIMIZERS

    parser.add_argument("--preset", default="cpu-small", help="model preset (cpu-small)")
    parser.add_argument(
        "--optimizer", nargs="+", choices=sorted(OPTIMIZERS), default=list(DEFAULT_OPTIMIZERS),
        metavar="OPT", help="optimizers of the registry (default: the paper's and their twins)",
    )  # fmt: skip
    parser.add_argument("--json", help="also write the rows here (what docs/ renders)")


def format_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of :func:`measure`'s rows: state per parameter, measured and by the
    paper's formula."""
    lines = ["| optimizer | state (x M) | formula | formula (x M) | measured = formula |",
             "|---|---:|---|---:|---|"]  # fmt: skip
    for r in rows:
        same = "yes" if r["state_elements"] == r["formula_elements"] else "no"
        lines.append(f"| {r['optimizer']} | {r['factor']:.3f} | {r['formula']} "
                     f"| {r['formula_elements'] / r['parameters']:.3f} | {same} |")  # fmt: skip
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from spectra_lab.model.llama import PRESETS

    if args.preset not in PRESETS:
        raise CLIError(f"--preset must be one of {', '.join(PRESETS)}, got {args.preset!r}")
    rows = []
    for name in args.optimizer:
        try:
            rows.append(measure(name, args.preset))
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    print(f"preset {args.preset}: M = {rows[0]['parameters']:,} parameters\n")
    print(format_table(rows))
    if args.json:
        from spectra_lab.files import write_json_atomic
        from spectra_lab.machine import device_about

        report = {"preset": args.preset, "machine": device_about("cpu"), "rows": rows}
        write_json_atomic(args.json, report)
    return 0
