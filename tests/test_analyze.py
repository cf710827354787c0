"""``spectra analyze``: the subspace distances against hand-computed cases and the paper's
formulas, and the three commands on tiny runs, their numbers against independent float64
computations.

Tiny runs on the synthetic token stream of ``test_train``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from spectra_lab.analyze.recorders import NOISE_SEED_OFFSET, record_steps
from spectra_lab.analyze.subspace import noise_signal_distances, subspace_distances
from spectra_lab.cli import main
from spectra_lab.runs.checkpoint import read_checkpoint
from spectra_lab.runs.records import read_jsonl
from spectra_lab.train.trainer import train
from test_train import write_dataset

pytestmark = pytest.mark.usefixtures("one_thread")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def train_dataset(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "markov")


# ---------------------------------------------------------------------------------------
# subspace distances


def basis(*columns: list[float]) -> torch.Tensor:
    return torch.tensor(columns, dtype=torch.float64).T


def test_identical_subspaces_are_at_distance_zero_whatever_their_bases():
    g = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(20, 3, generator=g, dtype=torch.float64)).Q
    R = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64)).Q  # another basis
    for other in (U, U @ R, -U):
        spec, chord = subspace_distances(U, other)
        assert spec == pytest.approx(0.0, abs=1e-12) and chord == pytest.approx(0.0, abs=1e-12)


def test_orthogonal_subspaces_are_at_distance_one():
    e = torch.eye(6, dtype=torch.float64)
    assert subspace_distances(e[:, :2], e[:, 2:4]) == pytest.approx((1.0, 1.0), abs=1e-15)
    assert subspace_distances(e[:, :1], e[:, 5:]) == pytest.approx((1.0, 1.0), abs=1e-15)


@pytest.mark.parametrize("theta", [1e-6, 0.3, math.pi / 4, 1.2])
def test_lines_at_a_known_angle_are_at_its_sine(theta):
    u1 = basis([1.0, 0.0, 0.0])
    u2 = basis([math.cos(theta), math.sin(theta), 0.0])
    spec, chord = subspace_distances(u1, u2)
    assert spec == pytest.approx(math.sin(theta), rel=1e-12)  # accurate down to small angles
    assert chord == pytest.approx(math.sin(theta), rel=1e-12)


def test_planes_with_two_principal_angles_give_max_and_rms_of_the_sines():
    a, b = 0.4, 1.1  # principal angles of the two planes in R^4
    U1 = basis([1, 0, 0, 0], [0, 1, 0, 0])
    U2 = basis([math.cos(a), 0, math.sin(a), 0], [0, math.cos(b), 0, math.sin(b)])
    spec, chord = subspace_distances(U1, U2)
    assert spec == pytest.approx(math.sin(b), rel=1e-12)
    assert chord == pytest.approx(math.sqrt((math.sin(a) ** 2 + math.sin(b) ** 2) / 2), rel=1e-12)
    # d_r(N, G): the larger side; here the right sides are identical
    d = noise_signal_distances((U1, U1), (U2, U1))
    assert d["spectral"] == d["spectral_left"] == spec and d["spectral_right"] < 1e-12
    assert d["chordal"] == d["chordal_left"] == chord


def test_distances_equal_the_papers_formulas_on_random_subspaces():
    # Appendix D.2: A = U1ᵀU2, B = I − AAᵀ, d_spec = √λ_max(B), d_chord = √(tr B / r)
    rng = np.random.default_rng(1)
    for m, r in ((10, 3), (50, 5), (8, 8)):
        U1 = np.linalg.qr(rng.standard_normal((m, r)))[0]
        U2 = np.linalg.qr(rng.standard_normal((m, r)))[0]
        A = U1.T @ U2
        B = np.eye(r) - A @ A.T
        spec, chord = subspace_distances(torch.from_numpy(U1), torch.from_numpy(U2))
        assert spec == pytest.approx(math.sqrt(max(np.linalg.eigvalsh(B).max(), 0)), abs=1e-7)
        assert chord == pytest.approx(math.sqrt(max(np.trace(B), 0) / r), abs=1e-7)


def test_record_steps_are_the_papers_iterations_and_bad_fractions_are_refused():
    assert record_steps([0, 0.05, 0.5, 0.99], 16000) == [1, 800, 8000, 15840]
    assert record_steps([0, 0.05, 0.5, 0.99], 300) == [1, 15, 150, 297]
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        record_steps([1.0], 10)
    with pytest.raises(ValueError, match="some of them equal"):
        record_steps([0.0, 0.05], 10)


# ---------------------------------------------------------------------------------------
# the commands


def tiny_argv(dataset: Path, out: Path, *extra: str) -> list[str]:
    argv = ["--preset", "tiny", "--dataset", str(dataset), "--out", str(out), "--no-progress"]
    argv += ["--set", "seq_len=32", "--batch-size", "8", "--device", "cpu", "--set", "lr=1e-2"]
    argv += ["--set", "eval_batches=2", "--set", "checkpoint_interval=0"]
    return [*argv, *extra]


class Capture:
    """A ``train(watch=...)`` observer keeping raw float64 copies at ``steps``: the gradient
    and the weights before the step, the weights after it."""

    def __init__(self, ctx, names, steps):
        self.params = dict(ctx.model.named_parameters())
        self.names, self.steps, self.k, self.seen = names, steps, ctx.start, {}

    def before_step(self):
        if self.k + 1 in self.steps:
            self.seen[self.k + 1] = {
                n: (self.params[n].grad.double().clone(), self.params[n].detach().double().clone())
                for n in self.names
            }

    def after_step(self):
        if self.k + 1 in self.steps:
            for n in self.names:
                self.seen[self.k + 1][n] += (self.params[n].detach().double().clone(),)
        self.k += 1
        return {}


def test_analyze_spectra_records_gradient_and_update_spectra(train_dataset, tmp_path, capsys):
    out = tmp_path / "spectra"
    argv = tiny_argv(train_dataset, out, "--steps", "6", "--set", "warmup_steps=1")
    argv += ["--optimizer", "torch-adamw", "--at", "0,0.5"]
    assert main(["analyze", "spectra", *argv]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "spectra.json").read_text())
    assert data["steps"] == [1, 3] and data["fractions"] == [0.0, 0.5]
    # default layers: the embedding, the first attention and MLP matrices of each block
    names = ["tok_embeddings.weight", "layers.0.attn.wq.weight", "layers.0.mlp.w1.weight",
             "layers.1.attn.wq.weight", "layers.1.mlp.w1.weight"]  # fmt: skip
    assert list(data["layers"]) == names
    for name in ("spectra_grad.png", "spectra_update.png"):
        assert (out / name).read_bytes()[:8] == PNG
    assert "layers.0.attn.wq.weight step 3: grad σmax" in printed

    # The same run again with an independent observer: raw tensors, numpy float64 SVDs.
    cfg = dataclasses.replace(
        load_cfg(out), out_dir=str(tmp_path / "again"), overwrite=False, progress=False
    )
    captured = []
    train(cfg, watch=lambda ctx: captured.append(Capture(ctx, names, [1, 3])) or captured[0])
    rows = [r for r in read_jsonl(tmp_path / "again" / "metrics.jsonl") if r["kind"] == "train"]
    lr = {r["step"]: r["lr"] for r in rows}
    for name in names:
        wd = cfg.weight_decay if name.startswith("layers.") else 0.0  # hidden and attn decay
        for record in data["layers"][name]["records"]:
            step = record["step"]
            grad, before, after = captured[0].seen[step][name]
            sg = np.linalg.svd(grad.numpy(), compute_uv=False)
            update = -(after.numpy() - (1 - lr[step] * wd) * before.numpy()) / lr[step]
            su = np.linalg.svd(update, compute_uv=False)
            assert record["lr"] == pytest.approx(lr[step], rel=1e-12)
            assert record["weight_decay"] == wd
            np.testing.assert_allclose(record["grad_sigma"], sg, rtol=1e-9, atol=1e-12 * sg[0])
            np.testing.assert_allclose(record["update_sigma"], su, rtol=1e-9, atol=1e-9 * su[0])
            assert record["grad"]["sigma_max"] == pytest.approx(sg[0], rel=1e-9)
            median = np.median(sg)
            assert record["grad"]["max_over_median"] == pytest.approx(sg[0] / median, rel=1e-9)
            if su[-1] > 1e-8 * su[0]:  # a condition number above round-off
                assert record["update"]["cond"] == pytest.approx(su[0] / su[-1], rel=1e-6)
    # the recorder left the run as it would be without it
    plain = dataclasses.replace(cfg, out_dir=str(tmp_path / "plain"))
    train(plain)
    analysed = [r["loss"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    plain_rows = read_jsonl(tmp_path / "plain" / "metrics.jsonl")
    assert analysed == [r["loss"] for r in plain_rows if r["kind"] == "train"]


def load_cfg(run: Path):
    from spectra_lab.train.config import TrainConfig, load_saved_config

    return TrainConfig(**load_saved_config(run / "config.yaml"))


def test_analyze_noise_measures_signal_noise_spikes_and_distances(train_dataset, tmp_path, capsys):
    out = tmp_path / "noise"
    layers = ["layers.0.attn.wq.weight", "layers.1.mlp.w2.weight"]
    argv = tiny_argv(train_dataset, out, "--steps", "4", "--set", "warmup_steps=1")
    argv += ["--optimizer", "torch-adamw", "--at", "0,0.5"]
    argv += ["--layers", "layers.0.attn.wq,layers.1.mlp.w2"]  # ".weight" may be left out
    argv += ["--signal-batch", "12", "--samples", "3", "--rank", "2"]
    assert main(["analyze", "noise", *argv]) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "noise.json").read_text())
    assert data["steps"] == [1, 2] and list(data["layers"]) == layers
    for name in ("noise_spectra.png", "noise_distances.png"):
        assert (out / name).read_bytes()[:8] == PNG
    assert "median d_spec" in printed

    # Step 1 sees the initial weights: rebuild them, and the windows from the same sampler.
    from spectra_lab.data import BatchSampler, TokenDataset
    from spectra_lab.train.build import build_model

    cfg = load_cfg(out)
    model, _ = build_model(cfg, 64)
    params = dict(model.named_parameters())
    sampler = BatchSampler(TokenDataset(train_dataset / "train.bin", 32), 8,
                           seed=cfg.seed + NOISE_SEED_OFFSET)  # fmt: skip
    batches = [sampler.next_batch() for _ in range(4)]  # 32 windows: 12 signal, then 3 samples
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])

    def gradients(xb, yb):
        model.zero_grad()
        model(xb, yb)[1].backward()
        return {n: params[n].grad.double().numpy().copy() for n in layers}

    signal = gradients(x[:12], y[:12])  # one batch: the mean over the 12 sequences
    r = 2
    for name in layers:
        record = data["layers"][name]["records"][0]
        G = signal[name]
        UG, SG, VGt = np.linalg.svd(G)
        np.testing.assert_allclose(record["signal_sigma"], SG, rtol=1e-4, atol=1e-6 * SG[0])
        assert record["signal_norm"] == pytest.approx(SG[0], rel=1e-4)
        m = data["layers"][name]["shape"]
        assert m == list(G.shape)
        assert data["layers"][name]["chordal_chance"] == pytest.approx(
            math.sqrt(1 - r / max(G.shape))
        )
        for j in range(3):
            N = gradients(x[12 + j : 13 + j], y[12 + j : 13 + j])[name] - G
            UN, SN, VNt = np.linalg.svd(N)
            np.testing.assert_allclose(record["noise_sigma"][j], SN[:r], rtol=1e-4)
            # d_r: the paper's formulas on each side, the larger side
            sides = []
            for A1, A2 in ((UN[:, :r], UG[:, :r]), (VNt[:r].T, VGt[:r].T)):
                B = np.eye(r) - (A1.T @ A2) @ (A1.T @ A2).T
                sides.append((np.sqrt(max(np.linalg.eigvalsh(B).max(), 0)),
                              np.sqrt(max(np.trace(B), 0) / r)))  # fmt: skip
            assert record["spectral"][j] == pytest.approx(max(s[0] for s in sides), abs=1e-3)
            assert record["chordal"][j] == pytest.approx(max(s[1] for s in sides), abs=1e-3)
        ratios = [s[0] / record["signal_norm"] for s in record["noise_sigma"]]
        summary = record["summary"]
        assert summary["fraction_noise_top_above_signal"] == sum(q > 1 for q in ratios) / 3
        assert summary["noise_top_over_signal_median"] == pytest.approx(sorted(ratios)[1])
    later = data["layers"][layers[0]]["records"][1]
    assert later["step"] == 2 and all(0 <= d <= 1 for d in later["spectral"] + later["chordal"])


def test_analyze_norms_sums_the_weight_norms_of_runs(train_dataset, tmp_path, capsys):
    runs = []
    for optimizer in ("adamw", "spectra-adamw"):
        out = tmp_path / optimizer
        argv = tiny_argv(train_dataset, out, "--steps", "5", "--set", "warmup_steps=1")
        assert main(["train", *argv, "--optimizer", optimizer, "--monitor-every", "2"]) == 0
        runs.append(out)
    capsys.readouterr()
    assert main(["analyze", "norms", *map(str, runs), "--out", str(tmp_path / "norms")]) == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "norms" / "norms.json").read_text())
    assert (tmp_path / "norms" / "norms.png").read_bytes()[:8] == PNG
    for run, entry in zip(runs, data["runs"], strict=True):
        assert entry["label"] == run.name and entry["steps"] == [1, 3, 5]
        state = read_checkpoint(run / "ckpt" / "step_0000005.pt")["model"]
        matrices = [t.double() for t in state.values() if t.dim() >= 2]
        # the sums over every weight matrix of the final weights, in float64
        linf = sum(t.abs().max().item() for t in matrices)
        fro = sum(torch.linalg.vector_norm(t).item() for t in matrices)
        assert entry["sum_weight_linf"][-1] == pytest.approx(linf, rel=1e-12)
        assert entry["sum_weight_fro"][-1] == pytest.approx(fro, rel=1e-12)
        assert f"{run.name}: step 5 | Σ‖X‖_∞ {linf:.4g}" in printed


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["spectra", "--at", "0,1.5"], "fractions must be in [0, 1), got 1.5"),
        (["spectra", "--at", "0,x"], "--at expects comma-separated fractions"),
        (["spectra", "--at", "0,0.001"], "some of them equal"),
        (["spectra", "--layers", "layers.0.atn.wq"], "did you mean 'layers.0.attn.wq.weight'"),
        (["noise", "--samples", "0"], "--samples must be >= 1"),
        (["spectra", "--parallel", "fsdp2"], "needs parallel=ddp"),
    ],
)
def test_bad_analyze_input_is_a_one_line_error(argv, needle, train_dataset, tmp_path, capsys):
    kind, *rest = argv
    full = ["analyze", kind, *tiny_argv(train_dataset, tmp_path / "out", "--steps", "40"), *rest]
    assert main(full) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err


def test_analyze_without_out_or_with_a_bad_run_is_a_one_line_error(tmp_path, capsys):
    for argv, needle in (
        (["analyze", "spectra"], "--out is required"),
        (["analyze", "noise", str(tmp_path), "--out", str(tmp_path / "x")], "no config.yaml"),
        (["analyze", "norms", str(tmp_path), "--out", str(tmp_path / "x")], "not a run directory"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err, err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    (tmp_path / "run" / "config.yaml").write_text("optimizer: adamw\n")
    assert main(["analyze", "norms", str(tmp_path / "run"), "--out", str(tmp_path / "x")]) == 2
    assert "train it with --monitor-every N" in capsys.readouterr().err


def _spectra_data(which: str = "update") -> dict:
    g = np.random.default_rng(0)
    steps = [1, 5]
    records = []
    for step in steps:
        s = np.sort(g.lognormal(size=16))[::-1]
        stats = {"sigma_max": s[0], "sigma_min": s[-1], "cond": s[0] / s[-1]}
        stats["max_over_median"] = s[0] / np.median(s)
        records.append({"step": step, f"{which}_sigma": s.tolist(), which: stats})
    return {"optimizer": "adamw", "steps": steps, "layers": {"layers.0.attn.wq.weight": {
        "records": records}, "layers.0.mlp.w1.weight": {"records": records}}}  # fmt: skip


@pytest.mark.parametrize("which", ["grad", "update"])
def test_spectra_figure_labels_its_axes_and_keeps_its_numbers_above_the_bars(which):
    import matplotlib.pyplot as plt

    from spectra_lab.analyze.plots import spectra_figure

    fig = spectra_figure(_spectra_data(which), which)
    fig.canvas.draw()  # the title's mathtext parses
    axes = np.asarray(fig.axes).reshape(2, 2)
    assert all("singular value" in ax.get_xlabel() for ax in axes[-1])
    assert [ax.get_ylabel() for ax in axes[:, 0]] == ["L0.attn.wq\ncount", "L0.mlp.w1\ncount"]
    assert "$" in fig._suptitle.get_text() and "{k+1}" not in fig._suptitle.get_text().split("$")[0]
    renderer = fig.canvas.get_renderer()
    for ax in axes.flat:
        (box,) = [t for t in ax.texts if "σmax" in t.get_text()]
        tallest = max(patch.get_height() for patch in ax.patches)
        text_bottom = ax.transData.inverted().transform(box.get_window_extent(renderer).p0)[1]
        assert text_bottom > tallest  # the statistics sit above every bar
    plt.close(fig)
