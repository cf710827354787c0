"""The library's import surface: torch is its only dependency."""

import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_library_imports_without_the_harness_dependencies():
    code = (
        "import sys\n"
        "for name in ('numpy', 'matplotlib', 'tqdm', 'yaml', 'tokenizers', 'tiktoken', 'scipy'):\n"
        "    sys.modules[name] = None\n"
        "import spectra, spectra.ops\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": SRC, "PATH": ""},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_cli_help_lists_every_subcommand(capsys):
    from spectra_lab.cli import SUBCOMMANDS, main

    assert main([]) == 0
    text = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in text
