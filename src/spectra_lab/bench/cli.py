"""``spectra bench``: dispatch to the operator and optimizer benchmarks.

Each benchmark module provides ``add_arguments(parser)`` and ``run(args) -> int``. A module is
imported only when its sub-subcommand is parsed, so ``spectra bench ops`` never imports the
optimizer benchmark and ``spectra bench --help`` imports neither.

``BENCHMARKS`` are the measurements of this package. The other ``spectra bench`` commands (the
analytic estimates, the GPU check, the recorder of ``bench ops``' inputs) live in rooms above
this one, which it may not import: ``spectra_lab.cli`` hands their names to
:func:`add_arguments`, and they are dispatched the same way.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping

BENCHMARKS: dict[str, tuple[str, str]] = {
    "ops": ("spectra_lab.bench.ops", "time and accuracy of the spectral operators"),
    "optim": ("spectra_lab.bench.optim", "time and memory per step of the optimizers"),
    "dist": ("spectra_lab.bench.dist", "the spectral work divided among DDP ranks"),
    "memory": (
        "spectra_lab.bench.memory",
        "optimizer-state memory per optimizer against the paper's formula",
    ),
    "step": (
        "spectra_lab.bench.step",
        "a training step's time and the optimizer's share (the paper's timing table)",
    ),
    "products": (
        "spectra_lab.bench.products",
        "the rate of each kind of matrix product the soft clip runs (float32, bf16, split)",
    ),
}


class _LazyParser(argparse.ArgumentParser):
    """A sub-parser that imports its module and adds its arguments on first use."""

    lazy_module: str | None = None

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        if self.lazy_module is not None:
            module, self.lazy_module = self.lazy_module, None
            try:
                loaded = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
                self.error(f"this benchmark is not available ({module} is missing)")
            loaded.add_arguments(self)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # one line, exit code 2, like the main parser
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_arguments(
    parser: argparse.ArgumentParser, more: Mapping[str, tuple[str, str]] | None = None
) -> None:
    """A sub-subcommand per benchmark, then one per entry of ``more`` (name -> (module,
    one-line help)), each module imported only when its sub-subcommand is parsed."""
    table = {**BENCHMARKS, **(more or {})}
    parser.set_defaults(bench_names=tuple(table))
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", parser_class=_LazyParser)
    for name, (module, help_text) in table.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.lazy_module = module
        p.set_defaults(bench_module=module)


def run(args: argparse.Namespace) -> int:
    module = getattr(args, "bench_module", None)
    if module is None:
        from spectra_lab.errors import CLIError

        names = getattr(args, "bench_names", tuple(BENCHMARKS))
        raise CLIError(f"choose a benchmark: {', '.join(names)}")
    return int(importlib.import_module(module).run(args) or 0)
