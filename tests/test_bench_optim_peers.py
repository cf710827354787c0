"""``spectra bench optim``'s peer rows: torch's Muon with torch's AdamW, torch's fused AdamW and
spectra's D-Muon, in the same process and on the same shapes as SPECTRA, with their ratios."""

from __future__ import annotations

import argparse

import torch

from spectra_lab.bench import optim as bench
from spectra_lab.bench.peers import MuonWithAdamW, fused_adamw_note

SHAPES = [(512, 32), (32, 32), (32, 32), (64, 32), (32, 64), (32,), (32,), (512, 32)]


def test_torch_muon_row_is_torchs_muon_on_the_hidden_matrices_and_adamw_on_the_rest():
    vocab = 12000  # above MUON_MAX_DIM: the embedding and head go to AdamW
    shapes = [(vocab, 8), (16, 16), (24, 16), (16, 24), (16,), (vocab, 8)]
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
    ref = [p.detach().clone().requires_grad_() for p in params]
    pair = MuonWithAdamW(params)
    muon, adamw = pair.optimizers
    hidden = {id(p) for p in muon.param_groups[0]["params"]}
    assert hidden == {id(params[i]) for i in (1, 2, 3)}
    assert {id(p) for p in adamw.param_groups[0]["params"]} == {id(params[i]) for i in (0, 4, 5)}
    # the reference: torch's docs' two optimizers, built by hand on copies
    ref_opts = [
        torch.optim.Muon([ref[i] for i in (1, 2, 3)], lr=0.02, momentum=0.95),
        torch.optim.AdamW([ref[i] for i in (0, 4, 5)], lr=3e-4, weight_decay=0.01),
    ]
    for step in range(3):
        for p, r in zip(params, ref, strict=True):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step))
            r.grad = p.grad.clone()
        pair.step()
        for o in ref_opts:
            o.step()
    for p, r in zip(params, ref, strict=True):
        torch.testing.assert_close(p, r, rtol=0, atol=0)
        assert not torch.equal(p, torch.zeros_like(p))
    # the memory count sees both optimizers' state: Muon's momentum, AdamW's two moments
    state = bench.optimizer_tensors(params, pair)
    moments = sum(p.numel() for i, p in enumerate(params) if i in (1, 2, 3))
    moments += 2 * sum(p.numel() for i, p in enumerate(params) if i in (0, 4, 5))
    counted = sum(t.numel() for t in state) - 2 * sum(p.numel() for p in params)
    assert moments <= counted <= moments + 3  # + AdamW's step counters


def test_fused_adamw_runs_on_the_cpu_and_its_refusal_is_a_note_elsewhere():
    assert fused_adamw_note(torch.device("cpu"), torch.float32) is None
    note = fused_adamw_note(torch.device("meta"), torch.float32)
    assert note is not None and note.startswith("torch-adamw-fused skipped: ")
    params, opt = bench._setup("torch-adamw-fused", bench.BenchSettings(SHAPES))
    assert opt.defaults["fused"] is True
    before = [p.detach().clone() for p in params]
    ref = [p.detach().clone().requires_grad_() for p in params]
    for r, p in zip(ref, params, strict=True):
        r.grad = p.grad.clone()
    opt.step()
    torch.optim.AdamW(ref, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.1, foreach=False).step()
    for p, r, b in zip(params, ref, before, strict=True):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)
        assert not torch.equal(p, b)


def test_peer_rows_run_beside_spectra_with_ratios_to_adamw_and_to_muon():
    settings = bench.BenchSettings(SHAPES, repeats=3, warmup=1, measure_memory=False)
    methods = ("torch-adamw", "torch-adamw-fused", "torch-muon", "spectra-dmuon", "spectra-adamw")
    report = bench.run_benchmark(settings, methods)
    rows = {r["method"]: r for r in report["rows"]}
    assert list(rows) == list(methods)
    for r in rows.values():
        assert r["step_s"] > 0
        assert r["time_ratio"] == r["step_s"] / rows["torch-adamw"]["step_s"]
        assert r["vs_muon"] == r["step_s"] / rows["torch-muon"]["step_s"]
    assert rows["torch-muon"]["vs_muon"] == 1.0
    table = bench.format_table(report)
    assert "| method | step (s) | × torch | × torch Muon | × paper bf16 |" in table
    line = next(x for x in table.splitlines() if x.startswith("| `spectra-adamw` |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3] == f"{rows['spectra-adamw']['vs_muon']:.2f}" and len(cells) == 9
    # without torch-muon the table keeps its earlier columns (the stored reports' layout)
    report = bench.run_benchmark(settings, ("torch-adamw", "spectra-dmuon"))
    assert "× torch Muon" not in bench.format_table(report)
    assert all("vs_muon" not in r for r in report["rows"])


def test_bench_optim_profile_writes_the_top_operators_of_one_step(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "profile.txt"
    args = parser.parse_args(["--matrices", "4", "32", "--methods", "spectra-dmuon",
                              "torch-adamw", "--repeats", "1", "--no-memory", "--device",
                              "cpu", "--profile", str(out)])  # fmt: skip
    assert bench.run(args) == 0
    text = out.read_text()
    assert text.startswith("one spectra-dmuon step, 4 tensors of 0.0M parameters")
    assert "aten::" in text and "Self CPU" in text
    assert "| `spectra-dmuon` |" in capsys.readouterr().out


def test_the_capturable_and_bf16_first_rows_run_on_the_cpu_and_the_graph_row_is_a_note(capsys):
    # the rows' optimizers: the capturable step (its lr a device tensor) and the bf16-first
    # settings; the CUDA graph row needs CUDA and says so on the CPU
    from spectra_lab.bench.capturable import CompiledStep, GraphStep, graph_note, make_capturable

    params = [torch.randn(16, 8, requires_grad=True), torch.randn(8, requires_grad=True)]
    opt = bench.make_optimizer("spectra-adamw-mixed-bf16", params, 1e-3, 10.0)
    group = opt.param_groups[0]
    assert (group["clip_method"], group["clip_ns_dtype"]) == ("mixed", "bfloat16")
    eager = make_capturable("spectra-adamw-capturable", params, 1e-3, 10.0)
    assert eager.defaults["capturable"] and torch.is_tensor(eager.param_groups[0]["lr"])
    assert isinstance(make_capturable("spectra-adamw-compiled", params, 1e-3, 10.0), CompiledStep)
    assert isinstance(make_capturable("spectra-adamw-graph", params, 1e-3, 10.0), GraphStep)
    split = make_capturable("spectra-adamw-capturable-bf16", params, 1e-3, 10.0)
    assert split.defaults["capturable"] and split.param_groups[0]["clip_ns_dtype"] == torch.bfloat16
    graph = make_capturable("spectra-adamw-graph-bf16", params, 1e-3, 10.0)
    assert isinstance(graph, GraphStep)
    assert graph.base.param_groups[0]["clip_ns_dtype"] == torch.bfloat16
    bounded = make_capturable("spectra-adamw-graph-bf16-r100", params, 1e-3, 10.0).base
    group = bounded.param_groups[0]
    assert (group["clip_ns_dtype"], group["clip_ratio_bound"]) == (torch.bfloat16, 100.0)
    assert "CUDA graphs need a CUDA device" in graph_note(torch.device("cpu"))
    argv = [
        "--matrices",
        "2",
        "16",
        "--methods",
        "torch-adamw",
        "spectra-adamw-polar-bf16",
        "spectra-adamw-capturable",
        "spectra-adamw-graph",
        "spectra-adamw-capturable-bf16",
        "spectra-adamw-graph-bf16",
        "spectra-adamw-capturable-bf16-r100",
        "--repeats",
        "1",
        "--no-memory",
    ]
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.run(parser.parse_args(argv)) == 0
    out = capsys.readouterr().out
    assert "`spectra-adamw-polar-bf16`" in out and "`spectra-adamw-capturable`" in out
    assert "spectra-adamw-graph skipped: CUDA graphs need a CUDA device, not cpu" in out
    assert "`spectra-adamw-capturable-bf16`" in out
    assert "`spectra-adamw-capturable-bf16-r100`" in out
    assert "spectra-adamw-graph-bf16 skipped: CUDA graphs need a CUDA device, not cpu" in out


def test_every_bench_report_names_its_machine():
    # the CPU's model and bf16 support (or the GPU), the threads, torch and the commit
    from spectra_lab.machine import device_about

    about = device_about("cpu")
    assert about["gpu"] is None and about["cpu"] and about["cpu_bf16"]
    assert about["threads"] == torch.get_num_threads() and about["torch"] == torch.__version__
    assert about["commit"] is None or len(about["commit"]) >= 7


def test_a_row_that_fails_is_named_with_its_error_and_the_others_are_measured(tmp_path):
    # a CUDA graph cannot be captured on the CPU: that row fails, the rows around it run
    settings = bench.BenchSettings(SHAPES, repeats=2, warmup=1, measure_memory=False)
    report = bench.run_benchmark(settings, ("torch-adamw", "spectra-adamw-graph", "spectra-adamw"))
    rows = {r["method"]: r for r in report["rows"]}
    graph = rows["spectra-adamw-graph"]
    assert graph["step_s"] is None and graph["error"]
    assert rows["spectra-adamw"]["step_s"] > 0
    assert rows["spectra-adamw"]["time_ratio"] == (
        rows["spectra-adamw"]["step_s"] / rows["torch-adamw"]["step_s"]
    )
    table = bench.format_table(report)
    assert "`spectra-adamw-graph` failed: " in table and "| `spectra-adamw` |" in table


def test_gpu_check_keeps_the_rows_a_part_measured_beside_those_that_failed(tmp_path, monkeypatch):
    import json

    from spectra_lab.gpucheck import check as gpu_check

    rows = [
        {"method": "torch-adamw", "step_s": 0.004, "time_ratio": 1.0, "peak_ratio": 1.0},
        {"method": "spectra-adamw-compiled", "step_s": None, "error": "InductorError: x"},
        {"method": "spectra-adamw", "step_s": 0.04, "time_ratio": 10.0, "peak_ratio": 1.1},
    ]

    def fake(cmd, timeout):
        path = cmd[cmd.index("--json") + 1]
        (tmp_path / path.rsplit("/", 1)[-1]).write_text(json.dumps({"rows": rows}))
        return 1, "one row failed"

    monkeypatch.setattr(gpu_check, "run_process", fake)
    part = gpu_check.check_bench_optim(tmp_path, 10.0, False, "capturable")
    assert part["status"] == "partial"
    assert part["failed_rows"] == {"spectra-adamw-compiled": "InductorError: x"}
    assert part["step_ms"] == {"torch-adamw": 4.0, "spectra-adamw": 40.0}
    from spectra_lab.gpucheck.summary import capturable_table

    lines = capturable_table(part)
    assert "| `spectra-adamw` | 40.0 | 10.00 | 1.10 |" in lines
    assert "`spectra-adamw-compiled` failed: InductorError: x" in lines
