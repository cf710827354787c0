"""``spectra sweep``: grid expansion, skipping and resuming runs, aggregation over seeds."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from spectra_lab.cli import main
from spectra_lab.sweep.grid import Run, SweepError, check_unchanged, read_grid, status
from spectra_lab.sweep.report import aggregate
from spectra_lab.train.trainer import train

sys.path.insert(0, str(Path(__file__).parent))
from test_train import write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "markov", n_train=6000, n_val=2048)


def base(dataset: Path, **kw) -> dict:
    values = dict(
        dataset=str(dataset), preset="tiny", seq_len=16, batch_size=4, steps=6, warmup_steps=1,
        eval_interval=3, eval_batches=2, checkpoint_interval=3, keep_checkpoints=1,
        plot=False, progress=False, device="cpu", optimizer="torch-adamw",
    )  # fmt: skip
    values.update(kw)
    return values


def write_grid(path: Path, **data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Stop(Exception):
    pass


def stop_during_step_4(config) -> None:
    """Train ``config`` and interrupt it during step 4: its checkpoint is at step 3."""

    def stop_at_4(step, record):
        if step == 4:
            raise Stop

    with pytest.raises(Stop):
        train(config, on_step=stop_at_4)


def test_grid_expands_cases_times_grid_times_seeds(tmp_path, dataset):
    grid = write_grid(
        tmp_path / "g.yaml",
        base=base(dataset),
        cases=[{"optimizer": "adamw"}, {"optimizer": "spectra-adamw", "clip_c": 5.0}],
        grid={"lr": [1e-3, 2e-3, 4e-3]},
        seeds=[0, 1],
    )
    runs = read_grid(grid, tmp_path / "out")
    assert len(runs) == 2 * 3 * 2
    names = [r.name for r in runs]
    assert len(set(names)) == len(names)
    assert "optimizer=spectra-adamw,clip_c=5,lr=0.002,seed=1" in names
    run = runs[names.index("optimizer=spectra-adamw,clip_c=5,lr=0.002,seed=1")]
    assert (run.config.optimizer, run.config.clip_c, run.config.lr, run.config.seed) == (
        "spectra-adamw",
        5.0,
        0.002,
        1,
    )
    assert run.config.out_dir == str(tmp_path / "out" / "runs" / run.name)
    assert run.config.steps == 6 and run.group == "optimizer=spectra-adamw,clip_c=5,lr=0.002"
    assert all(status(r) == "new" for r in runs)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"grid": {"lrr": [1e-3]}}, "unknown config field 'lrr'"),
        ({"grid": {"lr": [-1.0]}}, "'lr'"),
        ({"grid": {"lr": 1e-3}}, "non-empty list"),
        ({"grid": {"seed": [1, 2]}}, "under 'seeds'"),
        ({"seeds": [1, 1]}, "repeats a seed"),
        ({"sweep": {}}, "unknown key 'sweep'"),
    ],
)
def test_bad_grid_files_give_one_line_errors(tmp_path, capsys, data, message):
    grid = write_grid(tmp_path / "g.yaml", **data)
    with pytest.raises(SweepError, match=message):
        read_grid(grid, tmp_path / "out")
    assert main(["sweep", str(grid), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message.strip("'") in err


def test_sweep_runs_skips_finished_runs_resumes_partial_ones_and_reports(tmp_path, dataset, capsys):
    grid = write_grid(
        tmp_path / "g.yaml", base=base(dataset), grid={"lr": [3e-3, 3e-2]}, seeds=[0, 1]
    )
    out = tmp_path / "sweep"
    runs = read_grid(grid, out)
    # One run was stopped half way: interrupted during step 4, its checkpoint is at step 3.
    partial = runs[0]
    stop_during_step_4(partial.config)
    assert status(partial) == "partial"

    argv = ["sweep", str(grid), "--out", str(out), "--workers", "2", "--threads", "1"]
    assert main([*argv, "--no-plot"]) == 0
    assert all(status(r) == "done" for r in runs)
    # the resumed run went on from its checkpoint: one record per step, no repeats
    steps = [
        r["step"]
        for r in map(json.loads, (Path(partial.config.out_dir) / "metrics.jsonl").open())
        if r["kind"] == "train"
    ]
    assert steps == [1, 2, 3, 4, 5, 6]

    # aggregation against the runs' own summaries
    report = json.loads((out / "results.json").read_text())
    for lr in (3e-3, 3e-2):
        losses = [
            json.loads((Path(r.config.out_dir) / "summary.json").read_text())["val_loss"]
            for r in runs
            if r.point["lr"] == lr
        ]
        (group,) = [g for g in report["groups"] if g["point"]["lr"] == lr]
        assert group["mean"] == pytest.approx(statistics.fmean(losses))
        assert group["std"] == pytest.approx(statistics.stdev(losses))
        assert group["seeds_done"] == 2
    (best,) = report["best"]
    assert best["mean"] == min(g["mean"] for g in report["groups"])
    # step times: the median of each run's logged t_step after the warm-up steps
    for record, run in zip(report["runs"], runs, strict=True):
        logged = [
            r for r in map(json.loads, (Path(run.config.out_dir) / "metrics.jsonl").open())
            if r["kind"] == "train" and r["step"] > 5
        ]  # fmt: skip
        assert record["step_s"] == pytest.approx(statistics.median(r["t_step"] for r in logged))
        assert record["optimizer_s"] == pytest.approx(
            statistics.median(r["t_optimizer"] for r in logged)
        )
        # the machine each run.json records, kept where the run folders are not
        about = json.loads((Path(run.config.out_dir) / "run.json").read_text())["machine"]
        assert record["machine"] == about and about["threads"] == 1
    from spectra_lab.bench.machines import machine_of, runs_machines

    gone = tmp_path / "results-only"
    gone.mkdir()
    (gone / "results.json").write_text((out / "results.json").read_text())
    assert runs_machines(gone) == f"{machine_of(about)} (4 runs)"
    for g in report["groups"]:
        steps = [r["step_s"] for r in report["runs"] if r["point"] == g["point"]]
        assert g["step_s"] == pytest.approx(statistics.median(steps))
    assert "± " in (out / "results.md").read_text()

    # a second invocation trains nothing: every summary stays as it was
    stamps = {r.name: (Path(r.config.out_dir) / "summary.json").stat().st_mtime_ns for r in runs}
    assert main(argv) == 0
    assert stamps == {
        r.name: (Path(r.config.out_dir) / "summary.json").stat().st_mtime_ns for r in runs
    }
    assert (out / "curves.png").stat().st_size > 0
    assert (out / "tuning.png").stat().st_size > 0
    assert (out / "grid.yaml").read_text() == grid.read_text()

    # the grid changed under the finished runs: refused in one line, nothing trained
    capsys.readouterr()
    changed = write_grid(
        tmp_path / "g2.yaml", base=base(dataset, eval_batches=3), grid={"lr": [3e-3, 3e-2]},
        seeds=[0, 1],
    )  # fmt: skip
    assert main(["sweep", str(changed), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "eval_batches = 2" in err and "now says 3" in err


def test_a_sweep_resumes_when_its_out_is_spelled_another_way(tmp_path, dataset, monkeypatch):
    grid = write_grid(tmp_path / "g.yaml", base=base(dataset), grid={"lr": [3e-3]})
    monkeypatch.chdir(tmp_path)
    (run,) = read_grid(grid, tmp_path / "out")  # started with --out /abs/path/out
    stop_during_step_4(run.config)
    (again,) = read_grid("g.yaml", "out")  # and again from the same folder with --out out
    assert again.config.out_dir == "out/runs/lr=0.003,seed=1337" != run.config.out_dir
    check_unchanged(again)  # the same folder: no error
    assert status(again) == "partial"
    assert main(["sweep", "g.yaml", "--out", "out", "--no-plot"]) == 0
    steps = [
        r["step"]
        for r in map(json.loads, (Path(run.config.out_dir) / "metrics.jsonl").open())
        if r["kind"] == "train"
    ]
    assert steps == [1, 2, 3, 4, 5, 6]  # resumed from its checkpoint at step 3


def test_a_sweep_out_that_is_a_file_is_one_line(tmp_path, dataset, capsys):
    grid = write_grid(tmp_path / "g.yaml", base=base(dataset), grid={"lr": [3e-3]})
    (tmp_path / "out").write_text("a file")
    assert main(["sweep", str(grid), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"spectra sweep: error: --out {tmp_path / 'out'}: {tmp_path / 'out'} is a file, not a "
        "directory; give another --out"
    )
    assert (tmp_path / "out").read_text() == "a file"


def test_aggregate_reports_missing_seeds_without_inventing_numbers(tmp_path, dataset):
    grid = write_grid(tmp_path / "g.yaml", base=base(dataset), seeds=[0, 1, 2])
    runs = read_grid(grid, tmp_path / "out")
    train(runs[1].config)
    report = aggregate(runs)
    (group,) = report["groups"]
    assert group["seeds_done"] == 1 and group["std"] is None
    loss = json.loads((Path(runs[1].config.out_dir) / "summary.json").read_text())["val_loss"]
    assert group["mean"] == pytest.approx(loss)
    assert [r["status"] for r in report["runs"]] == ["new", "done", "new"]


def test_a_run_saved_before_a_field_existed_is_not_refused(tmp_path):
    """A config.yaml without a field that was added later: the run had that field's default."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("base: {preset: tiny, steps: 2}\ngrid:\n  lr: [1.0e-3]\n")
    (run,) = read_grid(grid, tmp_path / "out")
    folder = Path(run.config.out_dir)
    folder.mkdir(parents=True)
    saved = {**run.config.to_dict(), "warmup_steps": run.config.warmup}  # as the trainer saves
    saved.pop("mup_base_width")  # as an older version would have written it
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    check_unchanged(run)  # no error
    saved["mup_base_width"] = 128  # a value other than the default is a different run
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(SweepError, match="mup_base_width = 128"):
        check_unchanged(run)


@pytest.mark.parametrize(("start", "cut"), [(5.0, False), (9.5, True)])
def test_curves_png_keeps_every_point_inside_or_says_what_is_cut(start, cut, tmp_path, monkeypatch):
    import math

    from spectra_lab.sweep import report as sweep_report
    from spectra_lab.sweep.grid import Run
    from spectra_lab.train.config import TrainConfig

    runs = []
    for method, final in (("adamw", 4.45), ("spectra-adamw", 4.26)):
        for seed in range(2):
            out = tmp_path / f"{method}-{seed}"
            out.mkdir()
            losses = [final + (start - final) * math.exp(-s / 40) + seed / 99 for s in (0, 50, 99)]
            (out / "metrics.jsonl").write_text("".join(
                json.dumps({"kind": "eval", "step": s, "val_loss": v}) + "\n"
                for s, v in zip((0, 50, 99), losses, strict=True)))  # fmt: skip
            runs.append(Run(f"{method}-{seed}", {"optimizer": method}, seed,
                            TrainConfig(out_dir=str(out))))  # fmt: skip
    figures = []
    monkeypatch.setattr(sweep_report, "save_figure", lambda fig, *a, **k: figures.append(fig))
    groups = [{"group": r.group} for r in runs]
    sweep_report.plot_curves(runs, {"best": [], "groups": groups}, tmp_path / "curves.png")
    (ax,) = figures[0].axes
    bottom, top = ax.get_ylim()
    values = [y for line in ax.lines for y in line.get_ydata()]
    assert bottom < min(values)
    if cut:
        assert top < max(values) and "off the top" in ax.get_title()
    else:
        assert top > max(values) and "off the top" not in ax.get_title()


def train_steps(log: Path) -> list[int]:
    records = (json.loads(line) for line in log.read_text().splitlines())
    return [r["step"] for r in records if r["kind"] == "train"]


def two_runs(tmp_path: Path, dataset: Path, steps: int) -> tuple[list[str], Run, Run]:
    """The arguments of a sweep of two runs, the first of ``steps`` steps (seconds, long enough
    to be caught running), the second of 20, and the two runs."""
    settings = base(dataset, steps=steps, eval_interval=steps, checkpoint_interval=steps)
    cases = [{"lr": 1e-3}, {"lr": 2e-3, "steps": 20}]
    grid = write_grid(tmp_path / "g.yaml", base=settings, cases=cases)
    out = tmp_path / "out"
    first, second = read_grid(grid, out)
    return ["sweep", str(grid), "--out", str(out), "--threads", "1", "--no-progress"], first, second


def start_once_running(args: list[str], run: Run) -> subprocess.Popen:
    """``spectra <args>`` in a session of its own, returned once ``run`` has logged a step."""
    entry = "import sys; from spectra_lab.cli import main; sys.exit(main())"
    sweep = subprocess.Popen(
        [sys.executable, "-c", entry, *args],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = Path(run.config.out_dir) / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (log.exists() and log.stat().st_size) and sweep.poll() is None:
        assert time.monotonic() < deadline, f"{run.name} never logged a step"
        time.sleep(0.02)
    return sweep


@pytest.mark.parametrize("sig, whole_group", [(signal.SIGTERM, False), (signal.SIGINT, True)])
def test_a_signal_stops_the_sweep_at_a_checkpoint_and_the_same_command_goes_on(
    tmp_path, dataset, sig, whole_group
):
    """SIGTERM to the sweep alone (``kill PID``) or Ctrl-C to its process group: the running run
    writes a checkpoint, no other run starts, no process outlives the sweep, and the same
    command then finishes every run, the stopped one resumed."""
    steps = 400  # the signal comes after the first step is logged, well before the last
    args, first, second = two_runs(tmp_path, dataset, steps)
    sweep = start_once_running(args, first)
    if whole_group:
        os.killpg(sweep.pid, sig)
    else:
        sweep.send_signal(sig)
    _, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 128 + sig, err
    name = signal.Signals(sig).name
    assert err.strip().splitlines()[-1] == (
        f"spectra sweep: error: {name}: the sweep stopped (1 running run(s) stopped where they "
        "resume, 1 not started); the same command goes on"
    )
    assert "failed" not in err
    assert (status(first), status(second)) == ("partial", "new")
    # no process of the sweep's group is left: its run did not go on training on its own
    deadline = time.monotonic() + 30
    while True:
        try:
            os.killpg(sweep.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a process of the sweep outlived it"
        time.sleep(0.1)
    log = Path(first.config.out_dir) / "metrics.jsonl"
    stopped_at = max(train_steps(log))
    assert 0 < stopped_at < steps

    assert main(args) == 0
    assert (status(first), status(second)) == ("done", "done")
    assert train_steps(log) == list(range(1, steps + 1))  # each once: resumed, not restarted


def test_a_run_whose_process_dies_is_reported_and_the_others_go_on(tmp_path, dataset):
    """A run's process killed outright (SIGKILL, as the out-of-memory killer sends) cannot
    report how it ended: the sweep names it as failed with its exit code, trains the next run
    and ends with status 1."""
    args, first, second = two_runs(tmp_path, dataset, steps=400)
    sweep = start_once_running(args, first)
    children = Path(f"/proc/{sweep.pid}/task/{sweep.pid}/children").read_text().split()
    (worker,) = [
        int(pid)
        for pid in children
        if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()  # not the resource tracker
    ]
    os.kill(worker, signal.SIGKILL)
    _, err = sweep.communicate(timeout=120)
    assert sweep.returncode == 1, err
    assert f"failed: {first.name}: its process ended (exit code -9) before it could report" in err
    assert status(second) == "done"


def test_a_second_sweep_on_the_same_out_stops_in_one_line(tmp_path, dataset, capsys):
    """Two sweeps training into one directory would interleave their runs' files: the second
    one stops before it trains, naming the first one's pid, and goes ahead once it is gone."""
    grid = write_grid(tmp_path / "g.yaml", base=base(dataset), grid={"lr": [1e-3]})
    out = tmp_path / "out"
    out.mkdir()
    args = ["sweep", str(grid), "--out", str(out), "--threads", "1", "--no-progress"]
    with open(out / ".sweep.lock", "w") as first:  # what a running sweep holds
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        first.write("4242\n")
        first.flush()
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"spectra sweep: error: --out {out}: another sweep (pid 4242) is ")
        assert len(err.splitlines()) == 1
        assert not (out / "runs").exists()  # nothing trained
    assert main(args) == 0  # the first one gone (its lock with it), the sweep runs
    (run,) = read_grid(grid, out)
    assert status(run) == "done"
