"""The ``spectra`` command line.

Each subcommand lives in its own module, which provides ``add_arguments(parser)``
and ``run(args) -> int``. Modules are imported only when their subcommand runs,
so ``spectra --help`` stays fast and a missing optional extra affects only the
subcommand that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Any

from spectra_lab.errors import UserError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("spectra_lab.train.cli", "train a Llama-style model (the main job)"),
    "prepare-data": ("spectra_lab.data.cli", "download/tokenize a corpus into .bin shards"),
    "sample": ("spectra_lab.runs.sample", "generate text from a checkpoint"),
    "compare": ("spectra_lab.runs.compare", "plot the validation curves of several runs"),
    # the export of spectra_lab.runs.export with the offline task's files beside it
    "export": ("spectra_lab.eval.export", "write a run in the Hugging Face Llama format"),
    "eval": ("spectra_lab.eval.cli", "downstream scores of a run through lm-eval"),
    "synth": ("spectra_lab.synth.cli", "the paper's synthetic experiments"),
    "sweep": ("spectra_lab.sweep.cli", "a grid of training runs x seeds, resumable, with a report"),
    "analyze": ("spectra_lab.analyze.cli", "spectral diagnostics: spectra, noise, weight norms"),
    "bench": ("spectra_lab.bench.cli", "benchmarks of operators and optimizers"),
    "mup": ("spectra_lab.mup.cli", "μP tools: the coordinate check"),
    "docs": ("spectra_lab.pages", "render the docs' figures from their stored data, or check them"),
}
#: Subcommands of a group whose modules live in rooms above the group's own (which may not
#: import them): group -> {name: (module, one-line help)}, handed to the group's
#: ``add_arguments`` after its own. Under ``spectra bench``: the analytic estimates, the GPU
#: check and the recorder of the operator benchmark's inputs, beside the measurements.
MORE_SUBCOMMANDS: dict[str, dict[str, tuple[str, str]]] = {
    "bench": {
        "plan": (
            "spectra_lab.estimate.plan",
            "expected step time and memory per GPU of training configs, without running them",
        ),
        "gpu-model": (
            "spectra_lab.estimate.gpu_model",
            "flop and launch-count model of soft clipping on an H100 (not a measurement)",
        ),
        "gpu-check": (
            "spectra_lab.gpucheck.check",
            "every GPU check at once: CUDA tests, bench ops/optim, 124M training (make gpu-check)",
        ),
        "record-inputs": (
            "spectra_lab.generate.record_inputs",
            "record update directions from real cpu-small runs for bench ops",
        ),
    },
}


#: a negative number, also with an exponent (argparse's own pattern has none)
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Negative numbers in every notation are values, not flags: ``--lr -1e-3``.
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> None:  # one line, exit code 2
        self.exit(2, f"{self.prog}: error: {message}\n")


#: the distribution that installs the ``spectra`` command
DISTRIBUTION = "spectra-optim"


def package_version() -> str:
    """The installed distribution's version, or the package's own where it is not installed
    (run from a source tree through ``PYTHONPATH``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        import spectra

        return getattr(spectra, "__version__", "unknown")


class _Version(argparse.Action):
    """``--version``: the version is looked up only when asked for (it costs a metadata scan)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"{parser.prog} {package_version()}")
        parser.exit(0)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="spectra", description="Spectral clipping for LLM training.")
    parser.add_argument(
        "--version", action=_Version, nargs=0, default=argparse.SUPPRESS,
        help="print the version of spectra and exit",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    wanted = None
    if argv:
        wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:
            add_arguments = importlib.import_module(module).add_arguments
            if name in MORE_SUBCOMMANDS:
                add_arguments(p, MORE_SUBCOMMANDS[name])
            else:
                add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    args.argv = argv  # what a launcher of several processes hands on
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except UserError as exc:  # bad arguments, config, data or checkpoint: one line
        if os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 speaks for all
            print(f"spectra {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"spectra {args.command}: interrupted", file=sys.stderr)
        return 130
