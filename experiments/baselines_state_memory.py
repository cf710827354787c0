"""Measure the optimizer state of docs/baselines.md's memory tables: the bytes each baseline
(torch's AdamW, D-Muon, SOAP) holds after one step on a Llama-like float32 model, its state by
the formula of the harness's registry, and the formula at the paper's model sizes.

    python experiments/baselines_state_memory.py --json docs/data/baselines_state_memory.json

The tables of docs/baselines.md are rendered from the file (``spectra docs``).
"""

from __future__ import annotations

import argparse

from spectra_lab.files import write_json_atomic

#: The paper's three model sizes of baselines.md's formula table: label and preset.
PAPER_SIZES = (("160M", "160m"), ("780M", "780m"), ("820M", "820m"))
#: The paper's vocabulary (GPT-2's, padded to a multiple of 64).
PAPER_VOCAB = 50304
#: The Llama-like model of baselines.md's measured table: preset, vocabulary, overrides.
MEASURED_MODEL = ("cpu-small", 32000, {"d_model": 256, "n_heads": 4, "mlp_hidden": 688})
#: baselines.md's rows: label, the optimizer's entry in the harness's registry (its formula).
BASELINES = (("AdamW (torch)", "adamw"), ("D-Muon", "dmuon"), ("SOAP", "soap"))


def _shapes(preset: str, vocab: int, **overrides: int) -> list[tuple[int, ...]]:
    """The parameter shapes of ``spectra_lab``'s Llama ``preset`` (built on the meta device)."""
    import torch

    from spectra_lab.model.llama import Llama, model_config

    with torch.device("meta"):
        model = Llama(model_config(preset, vocab, **overrides))
    return [tuple(p.shape) for p in model.parameters()]


def _optimizers(params: list) -> list:
    """torch's AdamW, D-Muon and SOAP with their defaults (D-Muon's default split)."""
    import torch

    from spectra.optim import SOAP, DMuon

    return [torch.optim.AdamW(params), DMuon(params), SOAP(params)]


def _formulas(params: list) -> list[int]:
    """Each baseline's state elements by the paper's formula (the registry's ``Recipe.state``)."""
    from spectra_lab.train.optimizers import OPTIMIZERS

    optimizers = zip(BASELINES, _optimizers(params), strict=True)
    return [OPTIMIZERS[name].state.elements(opt) for (_, name), opt in optimizers]


def _state_bytes(value: object) -> int:
    """The bytes of the tensors in ``value`` (an optimizer's state), one-element tensors (torch's
    ``step``) left out."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size() if value.numel() > 1 else 0
    if isinstance(value, dict):
        value = list(value.values())
    return sum(map(_state_bytes, value)) if isinstance(value, (list, tuple)) else 0


def measure_memory() -> dict:
    """The file's content: the state bytes of each baseline after one step on the Llama-like
    float32 model of :data:`MEASURED_MODEL` (zero gradients) and its state by the formula, that
    model's parameter split, and the formulas at the paper's sizes."""
    import torch

    from spectra.optim.baselines.dmuon import default_use_muon
    from spectra_lab.machine import device_about

    preset, vocab, overrides = MEASURED_MODEL
    params = [torch.zeros(s, requires_grad=True) for s in _shapes(preset, vocab, **overrides)]
    for p in params:
        p.grad = torch.zeros_like(p)
    measured = []
    for opt in _optimizers(params):
        opt.step()
        measured.append(_state_bytes(list(opt.state.values())))
    sizes = []
    for label, paper_preset in PAPER_SIZES:
        with torch.device("meta"):
            shapes = _shapes(paper_preset, PAPER_VOCAB)
            meta = [torch.empty(s, requires_grad=True) for s in shapes]
        sizes.append({
            "model": label,
            "preset": paper_preset,
            "vocab": PAPER_VOCAB,
            "parameters": sum(p.numel() for p in meta),
            "formula_elements": _formulas(meta),
        })  # fmt: skip
    model = {
        "preset": preset,
        "vocab": vocab,
        **overrides,
        "parameters": sum(p.numel() for p in params),
        "muon": sum(p.numel() for p in params if default_use_muon(p)),
        "dtype": "float32",
    }
    return {
        "what": "optimizer state of torch's AdamW, D-Muon and SOAP (docs/baselines.md)",
        "optimizers": [label for label, _ in BASELINES],
        "machine": device_about("cpu"),
        "model": model,
        "state_bytes": measured,
        "formula_elements": _formulas(params),
        "paper_sizes": sizes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    out = "docs/data/baselines_state_memory.json"
    parser.add_argument("--json", default=out, help=f"where to write it ({out})")
    write_json_atomic(parser.parse_args(argv).json, measure_memory())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
