"""``spectra bench ops`` on a tiny run, and the ``bench`` dispatcher (no timing assertions)."""

from __future__ import annotations

import json
import math
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from spectra_lab.bench import matrices, ops_report
from spectra_lab.bench import ops as bench_ops
from spectra_lab.cli import main


def test_bench_ops_quick_writes_a_complete_table(tmp_path, capsys):
    out = tmp_path / "ops.json"
    args = ["bench", "ops", "--quick", "--no-progress", "--inputs", "adam_spike", "sign"]
    rc = main([*args, "--out", str(out)])
    assert rc == 0
    payload = json.loads(out.read_text())
    from spectra_lab.machine import cpu_bf16, cpu_model, source_commit

    # the report names its machine: the CPU's model and how it runs bf16, the commit
    assert payload["cpu_bf16"] == cpu_bf16() and payload["cpu"] == cpu_model()
    assert payload["commit"] == source_commit() and payload["threads"] >= 1
    cells = payload["cells"]
    names = set(bench_ops.methods(1.0))
    n_groups = len(matrices.QUICK_SHAPES) * len(matrices.DTYPES) * 2
    assert len(cells) == n_groups * len(names)
    assert {cell["method"] for cell in cells} == names
    for cell in cells:
        assert cell["time_ms"] > 0 and cell["runs"] == 1
        if cell["method"] == "paper_fp32":
            assert cell["vs_paper_fp32"] == 1.0
        if cell["method"] in ("auto", "polar", "eigh", "svd"):
            assert cell["rel_err"] <= 1e-2, cell
    # the paper's method fails on the spiked input, as documented
    spiked = [c for c in cells if c["input"] == "adam_spike" and c["method"] == "paper_fp32"]
    assert all(c["rel_err"] > 0.5 for c in spiked)
    printed = capsys.readouterr().out
    for title in ("Median time of one call (ms)", "Time ÷ time of paper_fp32", "Relative"):
        assert title in printed
    assert "Summary over all rows" in printed and "Reading the tables:" in printed
    assert max(len(line) for line in printed.splitlines()) <= 100  # a 100-column terminal
    assert not list(tmp_path.glob(".bench-*"))  # the temporary file was renamed away


def test_bench_ops_writes_markdown_for_other_suffixes(tmp_path):
    out = tmp_path / "ops.md"
    args = ["bench", "ops", "--quick", "--no-progress", "--dtypes", "fp32", "--inputs", "gauss"]
    assert main([*args, "--out", str(out)]) == 0
    cells_table, summary = out.read_text().split("\n\n")[1:3]
    assert cells_table.count("\n| ") == len(matrices.QUICK_SHAPES)  # one line per shape
    assert summary.startswith("| method | cells |")
    assert summary.count("\n| ") == len(bench_ops.methods(1.0))


def test_bench_ops_rejects_bad_repeats(capsys):
    assert main(["bench", "ops", "--repeats", "0"]) == 2
    assert "--repeats" in capsys.readouterr().err


def test_bench_ops_does_not_import_the_optimizer_benchmark(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "spectra_lab.bench.optim", raising=False)
    args = ["bench", "ops", "--quick", "--no-progress", "--dtypes", "fp32", "--inputs", "gauss"]
    assert main([*args, "--shapes", "768x768"]) == 0  # --quick overrides the shapes
    assert "spectra_lab.bench.optim" not in sys.modules


# --------------------------------------------------------------------------- --sizes


def test_bench_ops_sizes_times_square_inputs_and_draws_the_figure(tmp_path, capsys):
    out, png = tmp_path / "sizes.json", tmp_path / "sizes.png"
    names = ["auto", "paper_fp32", "paper_bf16", "orth_muon", "orth_muon_fp32"]
    args = ["bench", "ops", "--sizes", "16", "32", "--dtypes", "fp32", "--methods", *names]
    args += ["--paper-bf16", "always", "--repeats", "2", "--threads", "1", "--no-progress"]
    assert main([*args, "--out", str(out), "--plot-sizes", str(png)]) == 0
    cells = json.loads(out.read_text())["cells"]
    assert len(cells) == 2 * len(names)  # one cell per (method, size); default kind only
    assert {(c["method"], c["shape"]) for c in cells} == {
        (name, shape) for name in names for shape in ("16x16", "32x32")
    }
    assert {(c["dtype"], c["input"]) for c in cells} == {("fp32", bench_ops.SIZES_INPUT)}
    for c in cells:
        assert math.isfinite(c["time_ms"]) and c["time_ms"] > 0 and 1 <= c["runs"] <= 2
        assert math.isfinite(c["rel_err"])
        if c["method"] == "auto":
            assert c["rel_err"] <= 1e-2
    assert png.read_bytes().startswith(b"\x89PNG")
    printed = capsys.readouterr().out
    assert re.search(r"^16x16 +fp32 +adam_spike", printed, re.M)  # the usual tables, n x n
    assert "Median time (ms) against n" in printed
    assert max(len(line) for line in printed.splitlines()) <= 100
    # the sizes table: median ms per method and the SSC/orthogonalization ratios
    table = ops_report.sizes_table([ops_report.Cell(**c) for c in cells])
    ms = {(c["method"], c["shape"]): c["time_ms"] for c in cells}
    row = next(line for line in table.splitlines() if line.startswith("| fp32 | adam_spike | 32 |"))
    ratio = ms["paper_fp32", "32x32"] / ms["orth_muon_fp32", "32x32"]
    assert row.rstrip(" |").split(" | ")[-2] == f"{ratio:.2f}"
    assert "paper_bf16/orth_muon | paper_fp32/orth_muon_fp32 | auto/orth_muon_fp32 |" in table


def test_bench_ops_sizes_follow_inputs_and_dtypes(tmp_path):
    out, png = tmp_path / "sizes.md", tmp_path / "sizes.png"
    args = ["bench", "ops", "--sizes", "8", "12", "8", "--inputs", "sign", "gauss", "--quick"]
    args += ["--methods", "auto", "orth_muon_fp32", "--no-progress", "--paper-bf16", "never"]
    assert main([*args, "--out", str(out), "--plot-sizes", str(png)]) == 0
    sizes = out.read_text().split("\n\n")[3]
    rows = [line.split(" | ")[:3] for line in sizes.splitlines()[2:]]
    expected = {(d, k, n) for d in ("fp32", "bf16") for k in ("sign", "gauss") for n in ("8", "12")}
    assert len(rows) == len(expected)  # the repeated size is timed once
    assert {(d.lstrip("| "), k, n) for d, k, n in rows} == expected
    assert png.stat().st_size > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sizes", "16", "0"], "--sizes must be an int >= 1, got 0"),
        (["--sizes", "-4"], "--sizes must be an int >= 1, got -4"),
        (["--sizes", "16", "abc"], "invalid int value: 'abc'"),
        (["--sizes", "16", "--shapes", "768x768"], "not allowed with argument"),
        (["--sizes", "16", "--inputs", "recorded"], "--sizes times synthetic inputs only"),
        (["--plot-sizes", "x.png", "--quick"], "--plot-sizes needs --sizes"),
    ],
)
def test_bench_ops_rejects_bad_sizes_in_one_line(extra, message, capsys):
    try:
        rc = main(["bench", "ops", "--no-progress", *extra])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_square_size_reads_only_square_labels():
    assert matrices.square_size("48x48") == 48
    assert list(matrices.square_shapes([4, 2, 4])) == ["4x4", "2x2"]
    for label in ("48x80", "2x32x32", "axa"):
        with pytest.raises(ValueError, match="square"):
            matrices.square_size(label)


def test_bench_optim_is_dispatched_to_its_module(monkeypatch):
    calls = []
    stub = types.ModuleType("spectra_lab.bench.optim")
    stub.add_arguments = lambda parser: parser.add_argument("--steps", type=int, default=1)
    stub.run = lambda args: calls.append(args.steps) or 0
    monkeypatch.setitem(sys.modules, "spectra_lab.bench.optim", stub)
    assert main(["bench", "optim", "--steps", "7"]) == 0
    assert calls == [7]


# --------------------------------------------------------------------------- recorded inputs


def test_recorder_recovers_the_adamw_direction_from_the_weights():
    from spectra_lab.generate.record_inputs import _Recorder

    torch.manual_seed(0)
    W = torch.nn.Parameter(torch.randn(6, 5))
    opt = torch.optim.AdamW([{"params": [W], "group": "attn"}], lr=0.1, weight_decay=0.3)
    rec = _Recorder("adamw", {2})
    g1, g2 = torch.randn(6, 5), torch.randn(6, 5)
    for g in (g1, g2):
        W.grad = g.clone()
        rec.pre(opt)
        opt.step()
        rec.post(opt)
    # AdamW's direction at step 2, by hand: bias-corrected moments
    b1, b2, eps = 0.9, 0.999, 1e-8
    m = (1 - b1) * (b1 * g1 + g2) / (1 - b1**2)
    v = (1 - b2) * (b2 * g1**2 + g2**2) / (1 - b2**2)
    expected = m.double() / (v.double().sqrt() + eps)
    (key,) = rec.found
    assert key == "adamw@2/attn"
    assert torch.allclose(rec.found[key].double(), expected, rtol=2e-3, atol=2e-3)


def test_record_inputs_trains_and_saves_directions_at_the_chosen_fractions(tmp_path):
    from spectra_lab.bench.matrices import load
    from spectra_lab.generate.record_inputs import record

    sys.path.insert(0, str(Path(__file__).parent))
    from test_train import write_dataset

    data = write_dataset(tmp_path / "data")
    out = tmp_path / "dirs.pt"
    found = record(
        out, ("adamw", "signum"), steps=4, fractions=(0.25, 1.0), progress=False,
        dataset=str(data), preset="tiny", seq_len=16, batch_size=2, eval_batches=1,
        device="cpu",
    )  # fmt: skip
    loaded = load(out)
    assert set(loaded) == set(found)
    steps = {key.split("/")[0] for key in loaded}
    assert steps == {"adamw@1", "adamw@4", "signum@1", "signum@4"}
    for U in loaded.values():
        assert U.dim() == 2 and torch.isfinite(U).all() and U.abs().max() > 0
    # Signum's direction is a sign matrix (momentum's sign), up to the recovery's rounding
    signum = [U for key, U in loaded.items() if key.startswith("signum")]
    assert all(torch.allclose(U.abs(), torch.ones_like(U), atol=1e-3) for U in signum)


def test_bench_ops_reads_recorded_inputs(tmp_path, capsys):
    from spectra_lab.bench.matrices import DEFAULT_FILE

    args = ["bench", "ops", "--quick", "--no-progress", "--dtypes", "fp32", "--inputs"]
    args += ["recorded", "--methods", "auto", "paper_fp32", "--out", str(tmp_path / "o.json")]
    assert main(args) == 0
    cells = json.loads((tmp_path / "o.json").read_text())["cells"]
    recorded = torch.load(DEFAULT_FILE, weights_only=True)["directions"]
    assert {c["input"] for c in cells} == set(recorded)
    for c in cells:
        if c["method"] == "auto":
            assert c["rel_err"] <= 1e-2 and c["sigma_over_c"] > 0


# --------------------------------------------------------------------------- H100 model


def test_gpu_model_counts_the_flops_and_launches_of_both_methods(capsys):
    from spectra_lab.estimate import gpu_model

    # the counter: compute operations only (the transpose view is not a launch)
    A, B = torch.randn(4, 5), torch.randn(4, 3)
    with gpu_model._KernelCounter() as counter:
        (A.mT @ B).add(1.0).sum()
    assert counter.ops == {"mm": 1, "add": 1, "sum": 1}

    mats = gpu_model.matrices(*gpu_model.MODELS["124m"])
    assert len(mats) == 2 + 12 * 7  # embedding, head, 7 matrices per layer
    rows = gpu_model.step_model("124m", 30.0, efficiency=0.5, t_launch_us=10.0)
    paper = sum(4 * m * m * n + 30 * 2 * m**3 for m, n in mats)
    assert rows["paper-bf16"]["gflop"] == pytest.approx(paper / 1e9)
    per_paper = gpu_model.count_kernels("paper", 30.0) + 6
    assert rows["paper-bf16"]["launches"] == per_paper * len(mats)
    assert 30 * 3 < per_paper < 200  # at least the 30 products and updates of 10 NS steps
    k = rows["polar-fp32"]["steps"]
    polar = sum(4 * m * m * n + (1 + 4 * k - 4) * 2 * m**3 for m, n in mats)
    assert rows["polar-fp32"]["gflop"] == pytest.approx(polar / 1e9)
    per_polar = gpu_model.count_kernels("polar", 30.0)
    assert rows["polar-fp32"]["launches"] == len(set(mats)) * per_polar
    ms = paper / (0.5 * 989e12) * 1e3 + per_paper * len(mats) * 10e-3
    assert rows["paper-bf16"]["ms"] == pytest.approx(ms)
    # split bf16: three bf16 products per product, two for the Gram matrix and G²; each of the
    # 4K - 1 products (Gram, G², 4K - 4 in the iteration, the final one) writes each operand's
    # parts into its concatenation (a copy, a subtraction rounding into place and a copy of the
    # repeated part: six kernels a product), but the Gram matrix and G² write [X₁ X₂] and
    # [X₁/2 X₁] (two kernels each) and add C + Cᵀ: five
    split = rows["polar-bf16x3"]
    split_flops = 3 * polar - sum(2 * m * m * n + 2 * m**3 for m, n in mats)
    assert split["gflop"] == pytest.approx(split_flops / 1e9)
    products = 4 * k - 1
    extra = 6 * (products - 2) + 5 * 2
    assert split["launches"] == len(set(mats)) * (per_polar + extra)
    ms = split_flops / (0.5 * 989e12) * 1e3 + split["launches"] * 10e-3
    assert split["ms"] == pytest.approx(ms)
    assert "polar-bf16x3" not in gpu_model.step_model("124m", 300.0)  # α > 1e4: float32
    # the CUDA default at 780M (split products for mixed) and torch's Muon, the 780M bar's
    # reference: five steps of XXᵀ, A² and BX on each hidden matrix, one matrix at a time
    from spectra.ops.mixed import exact_steps
    from spectra.ops.quintics import inverse_sqrt_schedule
    from spectra_lab.bench.flops import mixed_split_flops

    ell = 1.0 / math.sqrt(1.0 + 30.0**2)
    exact = exact_steps(inverse_sqrt_schedule(ell, 1e-3), ell)
    split = rows["mixed-bf16x3"]
    assert split["gflop"] == pytest.approx(sum(mixed_split_flops(s, k, exact) for s in mats) / 1e9)
    assert split["launches"] == len(set(mats)) * gpu_model.count_kernels("mixed-bf16x3", 30.0)
    hidden = [(m, n) for m, n in mats if n < 10000]
    assert len(hidden) == 12 * 7
    muon = rows["torch-muon"]
    muon_flops = sum(5 * (4 * m * m * n + 2 * m**3) for m, n in hidden)
    assert muon["gflop"] == pytest.approx(muon_flops / 1e9)
    assert muon["launches"] == len(hidden) * gpu_model.muon_launches()
    assert 5 * 3 < gpu_model.muon_launches() < 60  # at least its 15 products
    assert main(["bench", "gpu-model", "--sigma-over-c", "10"]) == 0
    assert "| 780m | 10 | polar-fp32" in capsys.readouterr().out
    assert main(["bench", "gpu-model", "--efficiency", "2"]) == 2
    assert "--efficiency" in capsys.readouterr().err
