"""The atomic writers of ``spectra_lab.files``: CSV tables and matplotlib figures."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from spectra_lab.files import save_figure, write_csv


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_write_csv_round_trips_sequence_rows(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["a", "b"], [(1, 0.1), (2, "x,y"), [3, float("inf")]])
    assert path == tmp_path / "t.csv"
    with path.open() as f:
        rows = list(csv.reader(f))
    assert rows == [["a", "b"], ["1", "0.1"], ["2", "x,y"], ["3", "inf"]]
    assert path.read_text().endswith("inf\n")
    assert not _leftovers(tmp_path)


def test_write_csv_dict_rows_follow_the_header(tmp_path):
    rows = [{"b": 2, "a": 1, "extra": 9}, {"a": 3}]
    path = write_csv(tmp_path / "t.csv", ("a", "b"), rows)
    with path.open() as f:
        assert list(csv.DictReader(f)) == [{"a": "1", "b": "2"}, {"a": "3", "b": ""}]


def test_write_csv_float_format_and_generator_rows(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["x"], ((v,) for v in (1 / 3, 2.0)), float_format=".3g")
    assert path.read_text() == "x\n0.333\n2\n"


def test_write_csv_failure_keeps_the_old_file(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["a"], [[1]])

    def rows():
        yield [2]
        raise RuntimeError("no more rows")

    with pytest.raises(RuntimeError):
        write_csv(path, ["a"], rows())
    assert path.read_text() == "a\n1\n"
    assert not _leftovers(tmp_path)


def test_save_figure_writes_the_suffix_format_and_closes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, magic in (("f.png", b"\x89PNG"), ("f.pdf", b"%PDF"), ("f.svg", b"<?xml")):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        path = save_figure(fig, tmp_path / "sub" / name, dpi=30)
        assert path == tmp_path / "sub" / name
        assert path.read_bytes().startswith(magic)
        assert not plt.fignum_exists(fig.number)
    assert not _leftovers(tmp_path / "sub")


def test_save_figure_failure_keeps_the_old_file_and_closes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots()
    path = save_figure(fig, tmp_path / "f.png", dpi=20)
    old = path.read_bytes()
    fig, _ = plt.subplots()
    with pytest.raises(ValueError):
        save_figure(fig, tmp_path / "f.png", dpi=-5)
    assert not plt.fignum_exists(fig.number)
    assert path.read_bytes() == old
    assert not _leftovers(tmp_path)


def test_files_module_does_not_import_matplotlib():
    code = "import sys, spectra_lab.files; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
