r"""Observers of a training run that record what "Enhancing LLM Training via Spectral Clipping"
plots in its Section 4 and Appendix D.2, at chosen steps.

Each is built by ``train(cfg, watch=...)`` from the run's :class:`RunContext`, and the trainer
calls ``before_step()`` (after gradient clipping, before ``optimizer.step()``) and
``after_step()`` (right after it) at every step; both do nothing at other steps than theirs.
They read tensors and never write them, and draw data from their own sampler, so the run's
trajectory is the one it would be without them.

* :class:`SpectraRecorder` ("Singular Value Distribution of Stochastic Gradients and
  Updates"): every singular value of the gradient ``g_k`` the optimizer receives and of the
  update ``U_k``, recovered from the weights with the parameter's own η and λ:
  ``U_k = −(X_{k+1} − (1 − ηλ) X_k) / η`` (for a SPECTRA optimizer ``α·clip(U)``).
* :class:`NoiseRecorder` ("Noise Structure Analysis"): a large-batch gradient ``G`` (the
  signal), ``R`` single-sequence gradients ``g`` and their noise ``N = g − G``; the top-r
  singular values of each ``N`` against ``‖G‖₂`` and the distances ``d_r(N, G)`` between
  their top-r singular subspaces (:mod:`spectra_lab.analyze.subspace`).

The gradients are those of the step's own weights ``X_k``; all spectra are float64 SVDs.
"""

from __future__ import annotations

import difflib
import math
import sys
from typing import Any

import torch
from torch import Tensor, nn

from spectra.monitor import lr_and_weight_decay
from spectra_lab.analyze.subspace import matrix_view, noise_signal_distances, top_singular
from spectra_lab.errors import UserError

#: the paper's training fractions: 0%, 5%, 50% and 99% of the steps
DEFAULT_FRACTIONS = (0.0, 0.05, 0.5, 0.99)
#: the noise analysis draws its windows from a sampler of its own, seeded ``seed + this``
NOISE_SEED_OFFSET = 7919
#: the distances each noise sample gets (``d_r`` = the larger side, and each side)
DISTANCE_KEYS = (
    "spectral",
    "chordal",
    "spectral_left",
    "spectral_right",
    "chordal_left",
    "chordal_right",
)


class AnalysisError(UserError, ValueError):
    """A bad setting of ``spectra analyze`` (one line)."""


def record_steps(fractions: list[float], steps: int) -> list[int]:
    """The 1-based steps at ``fractions`` of a ``steps``-step run: ``max(1, round(f·steps))``
    (the paper's 0%, 5%, 50%, 99% of 16000 are iterations 1, 800, 8000, 15840)."""
    out = []
    for f in fractions:
        if not 0.0 <= f < 1.0:
            raise AnalysisError(f"--at: fractions must be in [0, 1), got {f}")
        out.append(max(1, round(f * steps)))
    if len(set(out)) != len(out):
        raise AnalysisError(
            f"--at {','.join(f'{f:g}' for f in fractions)} gives the steps {out} of a "
            f"{steps}-step run, some of them equal; use more steps or other fractions"
        )
    return out


def default_layers(model: nn.Module) -> list[str]:
    """The paper's representative matrices across depth: the token embedding, and the first
    attention and MLP matrices of the first, middle and last blocks."""
    names = dict(model.named_parameters())
    n = len(model.layers)
    out = ["tok_embeddings.weight"] if "tok_embeddings.weight" in names else []
    for i in sorted({0, n // 2, n - 1}):
        out += [f"layers.{i}.attn.wq.weight", f"layers.{i}.mlp.w1.weight"]
    return [name for name in out if name in names]


def choose_layers(model: nn.Module, wanted: list[str] | None) -> list[tuple[str, Tensor]]:
    """``(name, parameter)`` of each wanted matrix (``.weight`` may be left out), or the
    defaults; an unknown name or a vector is a one-line ``AnalysisError``."""
    params = {n: p for n, p in model.named_parameters() if p.dim() >= 2}
    out = []
    for name in wanted or default_layers(model):
        full = name if name in params else f"{name}.weight"
        if full not in params:
            close = difflib.get_close_matches(name, list(params), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise AnalysisError(f"--layers: the model has no weight matrix '{name}'{hint}")
        out.append((full, params[full]))
    return out


def condition(sigma: list[float]) -> dict[str, float]:
    """``sigma_max``, ``sigma_min``, the condition number ``σ_max/σ_min`` (inf at σ_min = 0),
    and how far the largest stands above the bulk: ``σ_max / median σ``."""
    smax, smin, median = sigma[0], sigma[-1], _median(sigma)
    return {
        "sigma_max": smax,
        "sigma_min": smin,
        "cond": smax / smin if smin > 0 else math.inf,
        "max_over_median": smax / median if median > 0 else math.inf,
    }


class _AtSteps:
    """Counts the steps from the run's start; ``due()``: the coming step is one to record."""

    def __init__(self, ctx: Any, steps: list[int]) -> None:
        if ctx.runtime.world_size > 1 or ctx.cfg.parallel == "fsdp2":
            raise AnalysisError("spectra analyze runs in one process, with parallel=ddp")
        self.ctx = ctx
        self.steps = steps
        self.step_count = ctx.start  # 0-based index of the coming step

    def due(self) -> int | None:
        """The coming step's 1-based number if it is recorded, else ``None``."""
        done = self.step_count + 1
        return done if done in self.steps else None


class SpectraRecorder(_AtSteps):
    """Full spectra of the gradient and of the update of ``layers`` at ``steps``."""

    def __init__(self, ctx: Any, layers: list[str] | None, steps: list[int]) -> None:
        super().__init__(ctx, steps)
        self.layers = choose_layers(ctx.model, layers)
        self.records: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in self.layers}
        self._pending: list[tuple[str, Tensor, Tensor, Tensor, float, float]] = []

    @torch.no_grad()
    def before_step(self) -> None:
        self._pending = []
        if self.due() is None:
            return
        for name, p in self.layers:
            if p.grad is None:
                continue
            lr, wd = lr_and_weight_decay(self.ctx.optimizer, p)
            grad = torch.linalg.svdvals(matrix_view(p.grad))
            self._pending.append((name, p, grad, matrix_view(p), lr, wd))

    @torch.no_grad()
    def after_step(self) -> dict[str, float]:
        done = self.due()
        self.step_count += 1
        for name, p, grad, before, lr, wd in self._pending:
            record: dict[str, Any] = {"step": done, "lr": lr, "weight_decay": wd}
            record["grad_sigma"] = grad.tolist()
            record["grad"] = condition(record["grad_sigma"])
            if lr > 0:
                update = -(matrix_view(p) - (1.0 - lr * wd) * before) / lr
                record["update_sigma"] = torch.linalg.svdvals(update).tolist()
                record["update"] = condition(record["update_sigma"])
            else:  # no step to divide by: the update is not defined
                record["update_sigma"], record["update"] = None, None
            self.records[name].append(record)
        self._pending = []
        return {}


class NoiseRecorder(_AtSteps):
    """Signal and noise of the gradient of ``layers`` at ``steps`` (the paper's procedure).

    ``signal_batch`` sequences make ``G`` (in micro-batches of the run's ``batch_size``);
    ``samples`` further sequences, one at a time, make the noises; ``rank`` is r.
    """

    def __init__(
        self,
        ctx: Any,
        layers: list[str] | None,
        steps: list[int],
        *,
        signal_batch: int,
        samples: int,
        rank: int,
        progress: bool = True,
    ) -> None:
        super().__init__(ctx, steps)
        from spectra_lab.data import BatchSampler, TokenDataset

        self.layers = choose_layers(ctx.model, layers)
        self.signal_batch, self.samples, self.rank = signal_batch, samples, rank
        self.progress = progress
        split = TokenDataset(ctx.dataset_dir / "train.bin", ctx.seq_len)
        self.chunk = min(ctx.cfg.batch_size, signal_batch)
        self.sampler = BatchSampler(split, self.chunk, seed=ctx.cfg.seed + NOISE_SEED_OFFSET)
        self._left = (torch.zeros(0, ctx.seq_len, dtype=torch.long),) * 2
        self.records: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in self.layers}

    def _gradients(self, x: Tensor, y: Tensor) -> list[Tensor]:
        """The gradient of the mean token loss of ``(x, y)`` for each layer (float64, CPU).

        ``torch.autograd.grad``: the parameters' ``.grad`` (the step's gradient) is untouched.
        """
        rt = self.ctx.runtime
        with torch.enable_grad(), rt.autocast():
            _, loss = self.ctx.model(x.to(rt.device), y.to(rt.device))
        grads = torch.autograd.grad(loss, [p for _, p in self.layers])
        return [matrix_view(g) for g in grads]

    def _windows(self, count: int) -> tuple[Tensor, Tensor]:
        """The sampler's next ``count`` windows (in its order; what a batch leaves is kept)."""
        while len(self._left[0]) < count:
            x, y = self.sampler.next_batch()
            self._left = (torch.cat([self._left[0], x]), torch.cat([self._left[1], y]))
        (x, rest_x), (y, rest_y) = (t.split([count, len(t) - count]) for t in self._left)
        self._left = (rest_x, rest_y)
        return x, y

    def before_step(self) -> None:
        done = self.due()
        if done is None:
            return
        from tqdm import tqdm

        x, y = self._windows(self.signal_batch)
        signal = [torch.zeros(()) for _ in self.layers]
        chunks = list(zip(x.split(self.chunk), y.split(self.chunk), strict=True))
        bar = tqdm(
            total=len(chunks) + self.samples,
            desc=f"noise at step {done}",
            disable=not self.progress,
            leave=False,
            file=sys.stderr,
        )
        with bar:
            for xc, yc in chunks:  # equal-length windows: the mean of means, weighted by size
                weight = len(xc) / self.signal_batch
                for i, g in enumerate(self._gradients(xc, yc)):
                    signal[i] = signal[i] + weight * g
                bar.update()
            tops = []
            for (name, _), G in zip(self.layers, signal, strict=True):
                U, S, V = top_singular(G, self.rank)
                tops.append((U, V))
                self.records[name].append(
                    {
                        "step": done,
                        "signal_sigma": S.tolist(),
                        "signal_norm": float(S[0]),
                        "noise_sigma": [],
                        **{key: [] for key in DISTANCE_KEYS},
                    }
                )
            x, y = self._windows(self.samples)
            for j in range(self.samples):
                grads = self._gradients(x[j : j + 1], y[j : j + 1])
                for i, (name, _) in enumerate(self.layers):
                    U, S, V = top_singular(grads[i] - signal[i], self.rank)
                    record = self.records[name][-1]
                    record["noise_sigma"].append(S[: self.rank].tolist())
                    distances = noise_signal_distances((U, V), tops[i])
                    for key, value in distances.items():
                        record[key].append(value)
                bar.update()
        for name, _ in self.layers:
            self._summarize(self.records[name][-1])

    @staticmethod
    def _summarize(record: dict[str, Any]) -> None:
        norm = record["signal_norm"]
        top = [s[0] for s in record["noise_sigma"]]
        ratios = sorted(t / norm if norm > 0 else math.inf for t in top)
        record["summary"] = {
            "noise_top_over_signal_median": _median(ratios),
            "fraction_noise_top_above_signal": sum(r > 1 for r in ratios) / len(ratios),
            "spectral_median": _median(record["spectral"]),
            "chordal_median": _median(record["chordal"]),
        }

    def after_step(self) -> dict[str, float]:
        self.step_count += 1
        return {}


def _median(values: list[float]) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else 0.5 * (v[mid - 1] + v[mid])
