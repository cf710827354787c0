"""The generated blocks of README.md and docs/, and the numbers of their prose.

A figure of the pages lives between two markers, ``<!-- PREFIX:NAME -->`` and
``<!-- /PREFIX:NAME -->``: on lines of their own for a table, inside a line for a number or a
phrase. What sits between them is rendered from a stored file, never typed:

* the ``study:`` blocks by ``experiments/study/report.py`` (the reproduction study's sweeps
  under ``results/study/``);
* every other block by :data:`spectra_lab.blocks.BLOCKS` (``spectra docs`` writes them,
  ``spectra docs --check`` compares them with their data).

Outside the blocks, prose holds no measurement. :func:`stray_numbers` lists the numbers of a
page that look like one (a decimal, a power of ten with a mantissa, a number with a unit, ×, %
or ±) and sit outside blocks, code, links and the paper's quotes (``<!-- paper -->`` …
``<!-- /paper -->``); what is not a measurement (versions, settings written ``c = 10``, powers
of ten such as ``1e-5``) is allowed by :data:`ALLOWED`.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from spectra_lab.blocks import BLOCKS
from spectra_lab.errors import UserError

#: The pages: the README and every page under docs/.
PAGE_GLOBS = ("README.md", "docs/*.md")

MARKER = re.compile(r"<!-- ([a-z]+):([\w.-]+) -->")


def pages(root: Path) -> list[Path]:
    """The pages under ``root``, README first."""
    return [p for pattern in PAGE_GLOBS for p in sorted(root.glob(pattern))]


def block_pattern(key: str) -> re.Pattern:
    """The block ``key`` (``PREFIX:NAME``), its body as group 1."""
    k = re.escape(key)
    return re.compile(rf"<!-- {k} -->(.*?)<!-- /{k} -->", re.S)


def keys(text: str) -> list[str]:
    """The blocks of ``text``, in order, each once."""
    return list(dict.fromkeys(f"{p}:{n}" for p, n in MARKER.findall(text)))


def extract(text: str, key: str) -> str | None:
    """The body of the (first) block ``key`` of ``text``, without the indentation its lines
    share with the opening marker; None where there is none."""
    m = block_pattern(key).search(text)
    if m is None:
        return None
    body = m.group(1)
    if not body.startswith("\n"):
        return body
    line = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
    indent = line if not line.strip() else ""
    lines = body[1:].removesuffix(indent).removesuffix("\n").split("\n")
    return "\n".join(s.removeprefix(indent) for s in lines)


def fill(text: str, key: str, body: str) -> str:
    """``text`` with every block ``key`` holding ``body``: on lines of their own where the
    opening marker ends its line, else inside the line (``body`` must then be one line). A
    block on lines of its own keeps the indentation of its opening marker (a table inside a
    list item): every line of ``body`` and the closing marker get it."""
    pattern = block_pattern(key)
    if not pattern.search(text):
        raise ValueError(f"no block <!-- {key} --> … <!-- /{key} -->")

    def sub(m: re.Match) -> str:
        if m.group(1).startswith("\n"):
            line = text[text.rfind("\n", 0, m.start()) + 1 : m.start()]
            indent = line if not line.strip() else ""
            lines = body.rstrip().split("\n")
            inner = "\n" + "\n".join(indent + s if s else s for s in lines) + "\n" + indent
        elif "\n" in body:
            raise ValueError(f"block {key} sits inside a line, and its text has line breaks")
        else:
            inner = body
        return f"<!-- {key} -->{inner}<!-- /{key} -->"

    return pattern.sub(sub, text)


def differences(text: str, bodies: dict[str, str]) -> list[str]:
    """A few lines of diff for each block of ``text`` that ``bodies`` renders otherwise."""
    out = []
    for key, body in bodies.items():
        old = extract(text, key)
        if old is None:
            continue
        new = extract(fill(text, key, body), key)
        if old != new:
            diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), "page", "data",
                                             n=0, lineterm=""))[2:]  # fmt: skip
            out.append(f"{key}: differs from the data")
            out += [f"  {line}" for line in diff[:12]]
    return out


# --------------------------------------------------------------------------- stray numbers

NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+−]?\d+)?")
UNIT = re.compile(r"\s?(?:×|%|ms\b|µs\b|s\b|min\b|GiB|GB|MiB|MB|KiB|tok/s|nats?\b|[GT]FLOP)")

#: What a number outside a block may be, not being a measurement: a version (``torch
#: 2.13.0``), a setting or a definition written with its symbol (``c = 10``, ``σ ≤ 1.5``,
#: ``lr 3e-3``), a
#: power of ten with no mantissa (``1e-5``, a threshold or a tolerance), a model's size
#: (``3.3M``, ``1.5B``), a shape (``16 × 256``), a test's confidence level (``95% level``).
ALLOWED = {
    "version": re.compile(r"(?:torch|Python|transformers|CUDA|lm-eval|version|v)\s*$"),
    "setting": re.compile(r"(?:=|≤|≥|<|>|≈|\blr|\bη|\blrs?\s+of)\s*$"),
    "power of ten": re.compile(r"1e[-+−]?\d+"),
    "size": re.compile(r"[MBk]\b"),
    "shape": re.compile(r"\s?×\s?\d"),
    "confidence level": re.compile(r"% (?:level|quantile|confidence)"),
}


def prose(text: str) -> str:
    """``text`` without its blocks, the paper's quotes, code, links' targets and math."""
    text = re.sub(r"<!-- ([a-z]+:[\w.-]+|paper) -->.*?<!-- /\1 -->", " ", text, flags=re.S)
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = indented_code_removed(text)
    text = re.sub(r"`[^`\n]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"https?://\S+", " ", text)
    return re.sub(r"\$[^$\n]*\$", " ", text)


def indented_code_removed(text: str) -> str:
    """``text`` without its indented code blocks: lines indented by four spaces or more after a
    blank line, outside a list (a list item's continuation lines are indented too)."""
    out, code, in_list, blank = [], False, False, True
    for line in text.split("\n"):
        if not line.strip():
            blank = True
            out.append(line)
            continue
        indented = line.startswith("    ")
        if not indented:
            in_list = bool(re.match(r"\s*(?:[-*+]|\d+\.)\s", line))
        code = indented and not in_list and (blank or code)
        blank = False
        out.append("" if code else line)
    return "\n".join(out)


def stray_numbers(text: str) -> list[str]:
    """The measurements of ``text``'s prose outside blocks (see the module docstring), each
    with a little of its line."""
    out = []
    for line in prose(text).splitlines():
        for m in NUMBER.finditer(line):
            if _measurement(line, m):
                out.append(line[max(0, m.start() - 30) : m.end() + 10].strip())
    return out


def _measurement(line: str, m: re.Match) -> bool:
    s, before, after = m.group(0), line[max(0, m.start() - 14) : m.start()], line[m.end() :]
    if re.match(r"\.\d", after) or ALLOWED["version"].search(before):
        return False  # a version, 2.13.0
    if any(ALLOWED[k].match(after) for k in ("size", "shape", "confidence level")):
        return False
    if UNIT.match(after) or re.match(r"\s*±", after) or re.search(r"±\s*$", before):
        return True
    if ALLOWED["power of ten"].fullmatch(s):
        return False
    return ("." in s or "e" in s) and not ALLOWED["setting"].search(before)


#: The blocks rendered elsewhere: prefix → the command that renders them.
ELSEWHERE = {"study": "python experiments/study/report.py"}


#: The block at the foot of a page that lists the stored files its blocks are rendered from,
#: and the machine each one names (:func:`sources`).
SOURCES = "data:sources"
#: Blocks that index stored files rather than quote their figures: no page's sources.
INDEXES = {"data:machines", "gpu:runs"}

_opened: list[str] | None = None  # the files opened while a block renders
T = TypeVar("T")


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], str | os.PathLike):
        _opened.append(os.fspath(args[0]))


@functools.cache
def _watch_opens() -> None:
    sys.addaudithook(_audit)  # once per process; it only records while _opened is a list


def render(root: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The body of every block of :data:`BLOCKS`, and the stored files each one read (paths
    under ``root``, in ``docs/data/`` or ``results/``), as Python's audit hook saw them open."""
    bodies, read = {}, {}
    for key, make in BLOCKS.items():
        try:
            bodies[key], read[key] = traced(root, lambda make=make: make(root))
        except FileNotFoundError:
            raise
        except (KeyError, ValueError, IndexError, TypeError, StopIteration) as exc:
            raise ValueError(f"block {key}: its data do not give it ({type(exc).__name__}: "
                             f"{exc})") from exc  # fmt: skip
    return bodies, read


def traced(root: Path, make: Callable[[], T]) -> tuple[T, list[str]]:
    """``make()``, and the stored files it opened: paths under ``root``, in ``docs/data/`` or
    ``results/``, in the order first opened."""
    global _opened
    _watch_opens()
    _opened = []
    try:
        out = make()
    finally:
        opened, _opened = _opened, None
    base = root.resolve()
    files = [Path(f).resolve() for f in opened]
    rel = [f.relative_to(base).as_posix() for f in files if f.is_relative_to(base)]
    return out, list(dict.fromkeys(f for f in rel if f.startswith(("docs/data/", "results/"))))


def sources(root: Path, page_keys: list[str], read: dict[str, list[str]]) -> str:
    """The table of a page's sources: each stored file its blocks read, the machine the file
    names (:func:`spectra_lab.bench.machines.machine_at`) and the blocks that read it."""
    from spectra_lab.bench.machines import machine_at

    by_file: dict[str, list[str]] = {}
    for key in page_keys:
        for f in [] if key in INDEXES else read.get(key, []):
            by_file.setdefault(f, []).append(key.split(":", 1)[1])
    rows = ["| stored file | measured on | its blocks on this page |", "|---|---|---|"]
    for f in sorted(by_file):
        blocks = ", ".join(f"`{b}`" for b in by_file[f])
        rows.append(f"| `{f}` | {machine_at(root, f)} | {blocks} |")
    return "\n".join(rows)


def page_bodies(root: Path, text: str, bodies: dict[str, str], read: dict) -> dict[str, str]:
    """The bodies of ``text``'s blocks: :data:`BLOCKS`' and its own sources table."""
    return {**bodies, SOURCES: sources(root, keys(text), read)}


def problems(root: Path) -> list[str]:
    """What is wrong with the pages' blocks: a block nobody renders, one rendered but on no
    page, one that differs from its data (with a diff), a page whose blocks read stored files
    but that has no sources table."""
    bodies, read = render(root)
    out, seen = [], set()
    for page in pages(root):
        text, name = page.read_text(), page.relative_to(root)
        for key in keys(text):
            seen.add(key)
            if key not in bodies and key != SOURCES and key.split(":")[0] not in ELSEWHERE:
                out.append(f"{name}: {key}: no renderer (spectra_lab.pages)")
        if any(read.get(k) for k in keys(text) if k not in INDEXES) and SOURCES not in keys(text):
            out.append(f"{name}: its blocks read stored files, and it has no <!-- {SOURCES} -->")
        out += [f"{name}: {line}" for line in differences(text, page_bodies(root, text, bodies,
                                                                            read))]  # fmt: skip
    out += [f"{key}: rendered but on no page" for key in bodies if key not in seen]
    return out


def write(root: Path) -> list[Path]:
    """Rewrite every block of :data:`BLOCKS` in the pages; the pages changed."""
    from spectra_lab.files import atomic_write

    (bodies, read), changed = render(root), []
    for page in pages(root):
        text = page.read_text()
        new, own = text, page_bodies(root, text, bodies, read)
        for key in keys(text):
            if key in own:
                new = fill(new, key, own[key])
        if new != text:
            atomic_write(page, new)
            changed.append(page)
    return changed


# --------------------------------------------------------------------------- spectra docs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=".", help="the source tree (default: the current folder)")
    p.add_argument("--check", action="store_true",
                   help="write nothing: exit 1, with a diff, where a block differs from its "
                   "data")  # fmt: skip
    p.add_argument(
        "--strays",
        action="store_true",
        help="list the measurements of each page's prose that sit outside a block",
    )
    p.add_argument(
        "--stale",
        action="store_true",
        help="list the stored measurements under docs/data/ that a later commit to the code "
        "they measure makes stale",
    )


def run(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if not (root / "README.md").is_file():
        raise UserError(f"--root {args.root}: no README.md there (run from the source tree)")
    try:
        if args.strays:
            for page in pages(root):
                for s in stray_numbers(page.read_text()):
                    print(f"{page.relative_to(root)}: {s}")
            return 0
        if args.stale:
            from spectra_lab.bench.machines import stale_runs

            found = stale_runs(root)
            print("\n".join(found) or "no stored measurement predates a change to its code")
            return 0
        if args.check:
            found = problems(root)
            print("\n".join(found) or f"all {len(BLOCKS)} blocks agree with their data")
            return 1 if found else 0
        changed = write(root)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    print(f"{len(changed)} page(s) rewritten: {', '.join(str(p) for p in changed) or 'none'}")
    return 0
