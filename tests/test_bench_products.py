"""``spectra bench products``: each kind runs the product it names (against a float64 product),
its flops and rates, and the command's one-line errors and report."""

from __future__ import annotations

import json

import pytest
import torch

from spectra_lab.bench import products
from spectra_lab.cli import main


def _operands(b: int = 2, m: int = 24, k: int = 40, n: int = 16) -> tuple:
    g = torch.Generator().manual_seed(0)
    return torch.randn(b, m, k, generator=g), torch.randn(b, k, n, generator=g)


@pytest.mark.parametrize(
    ("kind", "tol"),
    [
        ("fp32", 1e-6),  # float32 sums
        ("bf16", 8e-3),  # a bf16 result: one rounding of 2⁻⁹
        ("bf16-fp32", 1e-6),  # bf16 operands (compared with their own product), float32 result
        ("split", 3e-5),  # three bf16 products: within 3·2⁻¹⁸ of |A||B|
        ("split-gram", 3e-5),  # A Aᵀ from two
    ],
)
def test_each_kind_runs_the_product_it_names(kind, tol):
    A, B = _operands()
    out = products.operations(A, B)[kind]()
    A64, B64 = A.double(), B.double()
    if kind.startswith("bf16"):  # the product of the bf16 copies
        A64, B64 = A.bfloat16().double(), B.bfloat16().double()
    ref = A64 @ (A64.mT if kind == "split-gram" else B64)
    scale = A64.abs() @ (A64.abs().mT if kind == "split-gram" else B64.abs())
    assert out.dtype == (torch.bfloat16 if kind == "bf16" else torch.float32)
    assert ((out.double() - ref).abs() <= tol * scale).all()


def test_the_rows_give_the_flops_over_the_median_time():
    shapes = [(2, 8, 12, 4), (1, 16, 16, 16)]
    rows = products.measure(shapes, products.KINDS, torch.device("cpu"), repeats=2)
    assert [(r["shape"], r["kind"]) for r in rows] == [
        (s, k) for s in ("2x8x12x4", "1x16x16x16") for k in products.KINDS
    ]
    for r in rows:
        shape = tuple(int(x) for x in r["shape"].split("x"))
        b, m, k, n = shape
        flops = 2 * b * m * k * (m if r["kind"] == "split-gram" else n)
        assert products.product_flops(r["kind"], shape) == flops
        assert r["tflops"] * r["ms"] == pytest.approx(flops / 1e9)
    fp32 = {r["shape"]: r["ms"] for r in rows if r["kind"] == "fp32"}
    for r in rows:
        assert r["vs_fp32"] == pytest.approx(r["ms"] / fp32[r["shape"]])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--shapes", "2x64x0x3"], "got '2x64x0x3'"),
        (["--shapes", "2x64x3"], "four positive integers"),
        (["--repeats", "0"], "--repeats must be an int >= 1, got 0"),
        (["--kinds", "fp16"], "invalid choice: 'fp16'"),
    ],
)
def test_bad_arguments_are_one_line(argv, needle, capsys):
    try:  # the parser exits; a check after parsing returns the status
        code = main(["bench", "products", "--device", "cpu", *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_the_command_prints_the_table_and_writes_the_report(tmp_path, capsys):
    out = tmp_path / "products.json"
    argv = ["bench", "products", "--device", "cpu", "--shapes", "2x8x12x4", "--kinds", "fp32",
            "split", "--repeats", "2", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| 2x8x12x4 | split |" in table
    report = json.loads(out.read_text())
    assert report["repeats"] == 2 and report["machine"]["gpu"] is None
    assert [r["kind"] for r in report["rows"]] == ["fp32", "split"]
