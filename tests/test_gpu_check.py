"""``spectra bench gpu-check`` without a GPU: the order of its parts, its budget, the archive
it can write, its argument checks and the tables it renders from the peers' rows."""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

import pytest
import torch

from spectra_lab.bench.capturable import CAPTURABLE_METHODS
from spectra_lab.gpucheck import check as gpu_check
from spectra_lab.gpucheck import runs as gpu_runs

ABOUT = {"date": "d", "gpu": "g", "gpus": 1, "torch": "t", "cuda": "c", "python": "p",
         "commit": None}  # fmt: skip


def test_the_parts_that_time_the_step_beside_its_peers_run_first():
    names = list(gpu_check.PARTS)
    assert names[:6] == [
        "bench_optim", "bench_optim_780m", "profile", "bench_optim_capturable", "tests",
        "bench_products",
    ]  # fmt: skip
    assert names[6:] == ["train", "overhead", "bench_ops", "bench_optim_tf32", "bench_ops_tf32"]
    # both bench optim sizes time torch's Muon, fused AdamW and D-Muon beside SPECTRA
    for args in (gpu_check.OPTIM_ARGS, gpu_check.OPTIM_780M_ARGS):
        methods = args[args.index("--methods") + 1 :]
        methods = methods[: next((i for i, a in enumerate(methods) if a.startswith("--")), None)]
        assert set(gpu_check.PEERS) | {"spectra-adamw", "spectra-adamw-mixed",
                                       "spectra-adamw-mixed-bf16"} <= set(methods)  # fmt: skip
    assert gpu_check.PEERS == ("torch-adamw", "torch-adamw-fused", "torch-muon", "spectra-dmuon")
    assert gpu_check.DEFAULT_BUDGET == 390.0
    # the capturable part times the step without host reads beside the default one
    methods = gpu_check.CAPTURABLE_ARGS
    for m in ("torch-adamw", "spectra-adamw", *CAPTURABLE_METHODS):
        assert m in methods
    # its compilation, the longest row, runs last
    assert methods[methods.index("--repeats") - 1] == "spectra-adamw-compiled"


def _fake_run(monkeypatch, tmp_path, seconds, budget, archive=None, only=None, about=ABOUT):
    """Run the check with every part taking ``seconds[name]`` on a fake clock (capped at the
    timeout it was given) and writing its file; returns the timeouts and the index."""
    now = [0.0]
    given = {}

    def part(name):
        def run(out, timeout):
            given[name] = (now[0], timeout)
            now[0] += min(seconds[name], timeout)
            (out / f"{name}.json").write_text("{}")
            return {"status": "passed", "file": f"{name}.json"}

        return run

    parts = {n: (part(n), limit) for n, (_, limit) in gpu_check.PARTS.items()}
    monkeypatch.setattr(gpu_check.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "about_machine", lambda: about)
    monkeypatch.setattr(gpu_check, "PARTS", parts)
    monkeypatch.setattr(gpu_check, "markdown_summary", lambda out: "the tables")
    ns = argparse.Namespace(budget=budget, out=str(tmp_path / "gpu"), archive=archive, parts=only)
    assert gpu_check.run(ns) == 0
    index = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
    return given, index, now[0]


def test_the_default_budget_runs_the_measuring_parts_and_never_overruns(monkeypatch, tmp_path):
    # every part takes its whole limit: each gets at most the budget left, so the command
    # ends within the budget whatever the parts take
    full = {n: limit for n, (_, limit) in gpu_check.PARTS.items()}
    given, index, spent = _fake_run(monkeypatch, tmp_path, full, gpu_check.DEFAULT_BUDGET)
    assert spent <= gpu_check.DEFAULT_BUDGET
    for start, timeout in given.values():
        assert timeout <= gpu_check.DEFAULT_BUDGET - start
    # with parts as long as their limits, the first four fit (380 s), and the 10 s left start
    # nothing more
    assert list(given) == ["bench_optim", "bench_optim_780m", "profile", "bench_optim_capturable"]
    assert index["parts"]["tests"] == {"status": "not run", "reason": "10 s of budget left"}
    assert spent == 380
    # parts as long as the H200's run of the same parts took, a third longer (an H100), 70 s
    # for the capturable part (an estimate: its compilation) and 12 s for the products (an
    # estimate: one process, a few ms of products): the six measuring parts run, the 22 s left
    # start nothing more (train needs 160)
    h100 = {
        "bench_optim": 55.0,
        "bench_optim_780m": 75.0,
        "bench_products": 12.0,
        "profile": 20.0,
        "bench_optim_capturable": 70.0,
        "tests": 136.0,
        "train": 140.0,
        "overhead": 90.0,
        "bench_ops": 22.0,
        "bench_optim_tf32": 48.0,
        "bench_ops_tf32": 24.0,
    }
    given, index, spent = _fake_run(monkeypatch, tmp_path, h100, gpu_check.DEFAULT_BUDGET)
    assert list(given) == [
        "bench_optim", "bench_optim_780m", "profile", "bench_optim_capturable", "tests",
        "bench_products",
    ]  # fmt: skip
    assert index["parts"]["train"] == {"status": "not run", "reason": "22 s of budget left"}
    assert spent == 55 + 75 + 12 + 20 + 70 + 136 <= 370  # about six minutes
    # a larger budget gives the rest their turn, in order
    given, _, _ = _fake_run(monkeypatch, tmp_path, h100, 800.0)
    assert list(given) == list(gpu_check.PARTS)


def test_the_archive_holds_the_index_the_summary_and_every_part_file(monkeypatch, tmp_path, capsys):
    quick = dict.fromkeys(gpu_check.PARTS, 1.0)
    archive = tmp_path / "gpu_check.tar.gz"
    _fake_run(monkeypatch, tmp_path, quick, 1000.0, archive=str(archive))
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        summary = tar.extractfile("summary.md").read().decode()
    assert names == ["gpu_check.json", "summary.md", *(f"{n}.json" for n in gpu_check.PARTS)]
    assert summary == "the tables\n"
    assert f"{len(names)} files packed into {archive}" in capsys.readouterr().out


def test_a_run_is_kept_whole_under_its_gpu_and_date_and_listed(monkeypatch, tmp_path):
    # the files directly under --out are the latest run's; each run also stays in its own
    # folder, and runs.json lists every run once (a rerun with the same date replaces it)
    quick = dict.fromkeys(gpu_check.PARTS, 1.0)
    _fake_run(monkeypatch, tmp_path, quick, 1000.0)
    out = tmp_path / "gpu"
    kept = out / gpu_runs.gpu_slug(ABOUT["gpu"]) / "d"
    names = ["gpu_check.json", "summary.md", *(f"{n}.json" for n in gpu_check.PARTS)]
    assert sorted(p.name for p in kept.iterdir()) == sorted(names)
    assert (kept / "gpu_check.json").read_bytes() == (out / "gpu_check.json").read_bytes()
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert runs == [{"gpu": "g", "date": "d", "commit": None, "torch": "t", "folder": "g/d",
                     "files": names}]  # fmt: skip
    _fake_run(monkeypatch, tmp_path, quick, 1000.0)
    assert len(json.loads((out / "runs.json").read_text())["runs"]) == 1
    assert "| g | d | unknown | t | `g/d/` |" in gpu_runs.runs_table(out)
    assert gpu_runs.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_runs.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--archive", "out.zip"], "--archive must name a .tar.gz file, got 'out.zip'"),
        (["--archive", "/nonexistent/folder/a.tar.gz"], "--archive '/nonexistent/folder/a.tar.gz'"),
        (["--budget", "0"], "--budget"),
    ],
)
def test_bad_arguments_are_one_line_before_any_gpu_is_looked_for(argv, needle, capsys):
    from spectra_lab.cli import main

    assert main(["bench", "gpu-check", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("spectra bench: error: ")
    assert needle in err


def test_the_summary_of_a_run_with_the_peers_gives_their_ratios_and_memory(tmp_path):
    rows = {"torch-adamw": (4.0, 1.0, 0.1, None, 1.0), "torch-muon": (40.0, 10.0, 1.0, None, 0.9),
            "spectra-adamw": (50.0, 12.5, 1.25, 0.4, 1.5)}  # fmt: skip
    part = {"status": "passed", "file": "bench_optim.json",
            "step_ms": {m: r[0] for m, r in rows.items()},
            "vs_torch_adamw": {m: r[1] for m, r in rows.items()},
            "vs_torch_muon": {m: r[2] for m, r in rows.items()},
            "vs_paper_bf16": {m: r[3] for m, r in rows.items() if r[3] is not None},
            "peak_vs_torch_adamw": {m: r[4] for m, r in rows.items()}}  # fmt: skip
    index = {**ABOUT, "parts": {"bench_optim": part, "tests": {"status": "not run"},
                                "profile": {"status": "passed", "file": "p.txt"}}}  # fmt: skip
    (tmp_path / "gpu_check.json").write_text(json.dumps(index))
    summary = gpu_check.markdown_summary(tmp_path)
    assert "| method | step ms | × torch AdamW | × torch Muon | × paper bf16 |" in summary
    assert "| `torch-muon` | 40.0 | 10.00 | 1.00 | – | 0.90 | – |" in summary
    assert "| `spectra-adamw` | 50.0 | 12.50 | 1.25 | 0.40 | 1.50 | – |" in summary
    assert "CUDA tests" not in summary and "780M" not in summary
    assert f"`{gpu_check.PROFILE_FILE}`" in summary


def test_every_bench_optim_part_passes_arguments_bench_optim_takes():
    from spectra_lab.bench import optim as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    for extra in (gpu_check.OPTIM_ARGS, gpu_check.OPTIM_780M_ARGS, gpu_check.PROFILE_ARGS):
        args = parser.parse_args(["--device", "cuda", *extra])
        assert set(args.methods) <= set(bench.METHODS + bench.EXTRA_METHODS)
    big = parser.parse_args(list(gpu_check.OPTIM_780M_ARGS))
    shapes = bench.llama_shapes(big.layers, big.dim, big.hidden, big.vocab)
    assert (big.layers, big.dim, big.hidden, big.no_memory) == (32, 1280, 3584, True)
    assert 0.75e9 < sum(torch.Size(s).numel() for s in shapes) < 0.8e9  # 779M
    assert parser.parse_args(list(gpu_check.PROFILE_ARGS)).methods == ["spectra-adamw"]


def test_a_targeted_rerun_runs_its_parts_and_keeps_the_rest_with_their_date(monkeypatch, tmp_path):
    quick = dict.fromkeys(gpu_check.PARTS, 1.0)
    _fake_run(monkeypatch, tmp_path, quick, 1000.0)
    later = {**ABOUT, "date": "e", "commit": "abc"}
    given, index, _ = _fake_run(
        monkeypatch, tmp_path, quick, 1000.0, only=["overhead", "tests"], about=later
    )
    assert list(given) == ["tests", "overhead"]  # in the parts' own order
    for name in gpu_check.PARTS:
        part = index["parts"][name]
        if name in ("tests", "overhead"):
            assert "measured" not in part and part["status"] == "passed"
        else:  # kept from the first run, which measured it
            assert part["measured"] == "d" and part["commit"] is None
    # the rerun's own folder holds only what it measured
    kept = tmp_path / "gpu" / gpu_runs.gpu_slug(ABOUT["gpu"]) / "e"
    assert sorted(p.name for p in kept.iterdir()) == sorted(
        ["gpu_check.json", "summary.md", "tests.json", "overhead.json"]
    )
    # on another GPU nothing is kept
    other = {**later, "gpu": "h"}
    _, index, _ = _fake_run(monkeypatch, tmp_path, quick, 1000.0, only=["tests"], about=other)
    assert list(index["parts"]) == ["tests"]


def test_a_copy_directly_under_the_gpu_folder_names_the_run_that_holds_it(tmp_path):
    # a failed or targeted part leaves an older run's copy at the top: it names that run
    import json as _json

    from spectra_lab.bench.machines import gpu_run_of, machine_at
    from spectra_lab.blocks.common import latest_gpu

    gpu = tmp_path / "docs" / "data" / "gpu"
    runs = []
    made = (("2026-01-01 00:00 UTC", "aaa", {"train.json": "old"}),
            ("2026-01-02 00:00 UTC", "bbb", {"tests.json": "new"}))  # fmt: skip
    for date, commit, files in made:
        folder = gpu / "h100" / date[:10]
        folder.mkdir(parents=True)
        index = {"gpu": "NVIDIA H100", "date": date, "commit": commit, "parts": {}}
        (folder / "gpu_check.json").write_text(_json.dumps(index))
        for name, text in files.items():
            (folder / name).write_text(text)
            (gpu / name).write_text(text)
        (gpu / "gpu_check.json").write_text(_json.dumps(index))
        names = ["gpu_check.json", *files]
        runs.append({"gpu": "NVIDIA H100", "date": date, "commit": commit,
                     "folder": f"h100/{date[:10]}", "files": names})  # fmt: skip
    (gpu / "runs.json").write_text(_json.dumps({"runs": runs}))
    (gpu / "own.json").write_text(_json.dumps({"device": "NVIDIA H200", "torch": "t"}))
    assert gpu_run_of(tmp_path, "docs/data/gpu/train.json") == gpu / "h100" / "2026-01-01"
    assert "commit aaa" in machine_at(tmp_path, "docs/data/gpu/train.json")
    assert "commit bbb" in machine_at(tmp_path, "docs/data/gpu/tests.json")
    assert "commit bbb" in machine_at(tmp_path, "docs/data/gpu/gpu_check.json")
    assert gpu_run_of(tmp_path, "docs/data/gpu/own.json") is None
    assert machine_at(tmp_path, "docs/data/gpu/own.json").startswith("NVIDIA H200, torch t")
    # the latest run that holds a file, not the latest run
    assert latest_gpu(tmp_path, "H100") == gpu / "h100" / "2026-01-02"
    assert latest_gpu(tmp_path, "H100", "train.json") == gpu / "h100" / "2026-01-01"


def _trained(cmd: list[str], tokens_per_s: float, step_s: float, steps: int) -> tuple[int, str]:
    """A stand-in for a training run of ``cmd``: its metrics.jsonl with these figures."""
    run = Path(cmd[cmd.index("--out") + 1])
    run.mkdir(parents=True)
    records = [{"kind": "train", "step": k, "tokens_per_s": tokens_per_s, "mfu": 0.2, "loss": 5.0,
                "t_step": step_s, "t_optimizer": 0.01, "peak_mem_gb": 7.0}
               for k in range(1, steps + 1)]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return 0, ""


def test_a_training_run_that_fails_is_a_row_and_the_others_still_run(tmp_path, monkeypatch):
    # the compiled Spectra-AdamW run fails (as torch 2.11's inductor did on an H100): its row
    # names the error, the three others are measured and the part is "partial"
    def fake(cmd, timeout):
        if "--compile" in cmd and "spectra-adamw" in cmd:
            return 1, "Traceback ...\ntorch._inductor.exc.InductorError: AssertionError: "
        rate = 300_000 if "torch-adamw" in cmd else 100_000
        return _trained(cmd, tokens_per_s=rate, step_s=8192 / rate, steps=30)

    monkeypatch.setattr(gpu_check, "run_process", fake)
    monkeypatch.setattr(gpu_check, "write_random_tokens", lambda folder, *a: folder)
    part = gpu_check.check_training(tmp_path, 100.0)
    assert part["status"] == "partial"
    failed = [r for r in part["runs"] if "error" in r]
    assert len(failed) == 1 and failed[0]["compile"] and "InductorError" in failed[0]["error"]
    ok = [r for r in part["runs"] if "error" not in r]
    assert len(ok) == 3
    assert {r["tokens_per_s_vs_torch_adamw"] for r in ok if r["optimizer"] == "spectra-adamw"} == {
        round(100_000 / 300_000, 3)
    }
    stored = json.loads((tmp_path / "train.json").read_text())
    assert stored["runs"] == part["runs"]
    index = {**ABOUT, "parts": {"train": part}}
    (tmp_path / "gpu_check.json").write_text(json.dumps(index))
    summary = gpu_check.markdown_summary(tmp_path)
    assert "| `spectra-adamw` | yes | failed: torch._inductor" in summary
    assert "| `spectra-adamw` | no | 100,000 | 0.33 |" in summary


def test_a_run_stopped_by_the_time_limit_keeps_the_runs_measured_before_it(tmp_path, monkeypatch):
    # the overhead part's capturable run outlasts the part's limit (as the 80 s compile of the
    # whole step did on an H200): the two runs before it are kept, with their overhead, in the
    # part's file
    def fake(cmd, timeout):
        if "optimizer_kwargs={capturable: true}" in cmd:
            return 124, "(stopped after 75 s)"
        ms = 84.0 if "torch-adamw" in cmd else 126.0
        return _trained(cmd, tokens_per_s=32768 / ms * 1e3, step_s=ms / 1e3, steps=14)

    monkeypatch.setattr(gpu_check, "run_process", fake)
    monkeypatch.setattr(gpu_check, "write_random_tokens", lambda folder, *a: folder)
    part = gpu_check.check_overhead(tmp_path, 120.0)
    assert part["status"] == "partial" and part["file"] == "overhead.json"
    done, stopped = part["runs"][:2], part["runs"][2]
    assert [r["optimizer"] for r in done] == ["torch-adamw", "spectra-adamw"]
    assert done[1]["overhead"] == pytest.approx(126.0 / 84.0 - 1.0, abs=1e-4)
    assert stopped["capturable"] and stopped["error"] == "stopped at the part's time limit (120 s)"
    assert json.loads((tmp_path / "overhead.json").read_text())["runs"] == part["runs"]
    # in the training part, the runs after the stopped one are rows that say so
    calls = []

    def slow(cmd, timeout):
        calls.append(cmd)
        return 124, ""

    monkeypatch.setattr(gpu_check, "run_process", slow)
    part = gpu_check.check_training(tmp_path, 100.0)
    assert len(calls) == 1 and len(part["runs"]) == len(gpu_check.TRAIN_RUNS)
    assert part["runs"][0]["error"] == "stopped at the part's time limit (100 s)"
    assert all(r["error"].startswith("not run:") for r in part["runs"][1:])
    assert [r["compile"] for r in part["runs"]] == [c for c, _, _ in gpu_check.TRAIN_RUNS]


def test_a_copy_of_the_checkout_names_its_files_commit_where_told(monkeypatch):
    # a remote machine's copy may carry an older .git than its files: the variable names them
    import subprocess

    from spectra_lab.machine import source_commit

    git = ["git", "rev-parse", "--short", "HEAD"]
    out = subprocess.run(git, capture_output=True, text=True, check=False, cwd=gpu_check.ROOT)
    head = out.stdout.strip() or None
    monkeypatch.delenv("SPECTRA_SOURCE_COMMIT", raising=False)
    assert source_commit() == head
    monkeypatch.setenv("SPECTRA_SOURCE_COMMIT", "abc1234")
    assert source_commit() == "abc1234"


def test_the_summary_names_the_run_of_the_parts_a_targeted_rerun_kept(tmp_path):
    from spectra_lab.gpucheck.summary import markdown_summary

    kept = {"status": "passed", "tests": 2, "passed": 2, "measured": "d0", "commit": "c0"}
    index = {**ABOUT, "parts": {"tests": kept, "train": {"status": "failed"}}}
    (tmp_path / "gpu_check.json").write_text(json.dumps(index))
    summary = markdown_summary(tmp_path)
    assert "A targeted rerun: `tests` below come from the run of d0 at commit c0." in summary
    assert "CUDA tests: 2 of 2 passed" in summary
