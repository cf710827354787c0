"""Tables of the benchmarks: Markdown for files and docs, aligned plain text for a terminal.

:func:`markdown_table` is the one writer of the benchmarks' Markdown tables.
:func:`text_table` sets the same kind of table in fixed-width columns for a terminal of
``width`` characters: the first ``keys`` columns name the row and the others hold numbers;
when the numbers do not fit beside the row names in one block, the table is cut into blocks
of columns, each repeating the row names.
"""

from __future__ import annotations

from collections.abc import Sequence

#: the width of the terminal the printed tables are set for
TERMINAL_WIDTH = 100
GAP = "  "


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A Markdown table (lines end in ``\\n``); ``align`` has one letter a column, ``l`` or
    ``r`` (``r`` right-aligns the column; columns past its end are left-aligned)."""
    seps = ["---:" if align[i : i + 1] == "r" else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(seps) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _set_row(cells: Sequence[str], widths: Sequence[int], align: str) -> str:
    parts = [
        cell.ljust(w) if a == "l" else cell.rjust(w)
        for cell, w, a in zip(cells, widths, align, strict=True)
    ]
    return GAP.join(parts).rstrip()


def _header_lines(header: Sequence[str]) -> list[list[str]]:
    """The header cells cut at their newlines, as lines (shorter cells padded at the top)."""
    split = [h.split("\n") for h in header]
    depth = max(len(parts) for parts in split)
    split = [[""] * (depth - len(parts)) + parts for parts in split]
    return [[parts[i] for parts in split] for i in range(depth)]


def _blocks(widths: list[int], keys: int, width: int) -> list[list[int]]:
    """The value columns' indices cut into runs that fit in ``width`` beside the keys."""
    used = sum(widths[:keys]) + len(GAP) * (keys - 1)  # each value column adds GAP + width
    blocks: list[list[int]] = [[]]
    room = width - used
    for i in range(keys, len(widths)):
        need = widths[i] + len(GAP)
        if blocks[-1] and need > room:
            blocks.append([])
            room = width - used
        blocks[-1].append(i)
        room -= need
    return blocks


def text_table(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    keys: int = 1,
    width: int = TERMINAL_WIDTH,
    align: str = "",
) -> str:
    """``rows`` under ``header`` in aligned columns, at most ``width`` characters a line where
    the row names leave room for at least one value column.

    The first ``keys`` columns name the row; they are left-aligned and the others
    right-aligned unless ``align`` gives a column its letter (``l`` or ``r``). A header cell
    may hold newlines: it is then set on several lines, bottom-aligned. Value columns that do
    not fit are set in further blocks under the first, each with the row names and a line
    ``(columns i–j of n)``. Lines end in ``\n``.
    """
    head_lines = _header_lines(header)
    widths = [max(len(str(r[i])) for r in (*head_lines, *rows)) for i in range(len(header))]
    letters = "".join(align[i : i + 1] or ("l" if i < keys else "r") for i in range(len(header)))
    blocks = _blocks(widths, keys, width)
    out = []
    for n, block in enumerate(blocks):
        cols = [*range(keys), *block]
        sub_widths, sub_align = [widths[i] for i in cols], "".join(letters[i] for i in cols)
        if len(blocks) > 1:
            first, last = block[0] - keys + 1, block[-1] - keys + 1
            span = f"column {first}" if first == last else f"columns {first}–{last}"
            out.append(f"({span} of {len(widths) - keys})")
        for line in head_lines:
            out.append(_set_row([line[i] for i in cols], sub_widths, sub_align))
        out.append(_set_row(["-" * w for w in sub_widths], sub_widths, sub_align))
        out += [_set_row([str(r[i]) for i in cols], sub_widths, sub_align) for r in rows]
        if n < len(blocks) - 1:
            out.append("")
    return "\n".join(out) + "\n"
