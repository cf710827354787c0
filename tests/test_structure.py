"""The shape of the code: functions short enough to read in one sitting, the harness's rooms
and the library's floors importing downwards only (no loop between their packages)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
#: the longest a function may be, in lines
MAX_LINES = 80
#: the harness's rooms, lowest first: a room may import only those before it
ORDER = (
    "errors",
    "files",
    "model",
    "data",
    "runs",
    "train",
    "analyze",
    "eval",
    "synth",
    "sweep",
    "mup",
    "bench",
    "estimate",
    "generate",
    "gpucheck",
    "cli",
    "__main__",
)


#: the library's floors, lowest first: a floor may import only those before it
LIBRARY_ORDER = ("validate", "ops", "optim", "monitor", "__init__")


def modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text())) for p in sorted(SRC.rglob("*.py"))]


def room(path: Path) -> str:
    return path.relative_to(SRC / "spectra_lab").with_suffix("").parts[0]


def test_every_function_fits_in_one_sitting():
    long = [
        f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
        for path, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_LINES
    ]
    assert long == []


def test_harness_rooms_import_downwards_only():
    upward = []
    for path, tree in modules():
        if SRC / "spectra_lab" not in path.parents:
            continue
        here = room(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("spectra_lab."):
                there = node.module.split(".")[1]
                if there != here and ORDER.index(there) > ORDER.index(here):
                    upward.append(f"{path.relative_to(SRC)}:{node.lineno} {here} -> {there}")
    assert upward == []


def test_every_room_is_placed():
    rooms = {room(p) for p in (SRC / "spectra_lab").rglob("*.py")} - {"__init__"}
    assert rooms <= set(ORDER)


def test_library_never_imports_the_harness():
    for path, tree in modules():
        if SRC / "spectra" in path.parents:
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    assert not (node.module or "").startswith("spectra_lab"), path


def test_library_floors_import_downwards_only():
    upward = []
    for path, tree in modules():
        if SRC / "spectra" not in path.parents:
            continue
        here = path.relative_to(SRC / "spectra").with_suffix("").parts[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("spectra."):
                there = node.module.split(".")[1]
                if there != here and LIBRARY_ORDER.index(there) > LIBRARY_ORDER.index(here):
                    upward.append(f"{path.relative_to(SRC)}:{node.lineno} {here} -> {there}")
    assert upward == []
