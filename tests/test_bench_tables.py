"""The benchmarks' tables: Markdown, and plain text cut into blocks for a terminal."""

from __future__ import annotations

from spectra_lab.bench.tables import markdown_table, text_table


def test_markdown_table_aligns_by_letter():
    text = markdown_table(["a", "b", "c"], [["x", "1", "2"]], "lr")
    assert text == "| a | b | c |\n|---|---:|---|\n| x | 1 | 2 |\n"


def test_text_table_fits_in_one_block_when_narrow():
    text = text_table(["name", "value"], [["alpha", "1.5"], ["b", "10"]])
    assert text.splitlines() == ["name   value", "-----  -----", "alpha    1.5", "b         10"]


def test_text_table_cuts_wide_tables_into_blocks_repeating_the_keys():
    header = ["row", *(f"column{i}" for i in range(12))]
    rows = [[f"r{j}", *(f"{i * j:.3f}" for i in range(12))] for j in range(3)]
    text = text_table(header, rows, keys=1, width=40)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 40
    assert lines[0] == "(columns 1–4 of 12)" and len(lines[2]) == 39  # 4 columns fill it
    blocks = sum(line.startswith("(column") for line in lines)
    assert blocks == 4 and "(column 12 of 12)" in lines
    assert sum(line.startswith("row ") for line in lines) == blocks  # the keys in each block
    assert sum(line.startswith("r2 ") for line in lines) == blocks
    for i in range(12):  # every column is set once
        assert sum(f"column{i} " in line + " " for line in lines) == 1


def test_text_table_header_on_two_lines_and_alignment():
    text = text_table(["k", "long_\nname", "n"], [["a", "1", "2"]], align="lrl")
    assert text.splitlines() == ["   long_", "k   name  n", "-  -----  -", "a      1  2"]
