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
    "machine",
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
    "blocks",
    "pages",
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


#: the most lines a hand-written module may have (a generated one says so in its first line)
MAX_MODULE_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every import between the project's modules, wherever it stands: at the top, inside a
    function, or under ``if TYPE_CHECKING:``. ``from pkg import name`` counts as an import of
    the submodule ``pkg.name`` where there is one, else of ``pkg``."""
    trees = {module_name(p): (p, tree) for p, tree in modules()}
    graph: dict[str, set[str]] = {name: set() for name in trees}
    for name, (path, tree) in trees.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in trees else base
                           for a in node.names]  # fmt: skip
            graph[name] |= {t for t in targets if t in trees and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_not_even_type_only_or_lazy_ones():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_type_only_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_every_hand_written_module_fits_in_one_sitting():
    long = [
        f"{path.relative_to(SRC)} ({len(text.splitlines())})"
        for path in sorted(SRC.rglob("*.py"))
        if len((text := path.read_text()).splitlines()) > MAX_MODULE_LINES
        and not text.lstrip('r"').startswith("Generated by")
    ]
    assert long == []
