"""The paper's two synthetic experiments, as configurations and result tables.

"Enhancing LLM Training via Spectral Clipping", Sec. 6.1 and Appendix "Synthetic experiments":

1. ``run_fw_experiment``: post-spectral clipping with the Theorem's parameters minimizes
   ``F(X) = f(X) + (b/2)‖X‖_F²`` over ``‖X‖₂ ≤ D₂`` (matrix logistic regression, d = 10,
   80 train / 200 test samples, label noise σ = 5), for b ∈ {0, 0.1, 1} and D₂ ∈ {0.2, 1, 5},
   full batch and with minibatches of 20.
2. ``run_spike_experiment``: SGD, SGD with global clipping and SGD with spectral clipping
   (fixed c = 15), and SGD-M with and without pre-clipping, under rank-r spikes
   N = ℓUVᵀ with ℓ ∈ {10, 100, 1000}; η₀ tuned per method and ℓ.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from spectra_lab.synth.frank_wolfe import (
    RunHistory,
    RunSchedule,
    run_post_clipping,
    solve_constrained,
)
from spectra_lab.synth.problem import DTYPE, make_logistic_data
from spectra_lab.synth.spikes import SpikeConfig, SpikeRuns, run_spike_method

Progress = Callable[[str], None]


def _noop(_: str) -> None:
    pass


# --------------------------------------------------------------------------- experiment 1


@dataclass(frozen=True)
class FWConfig:
    """Experiment 1: the data (``d × d`` matrices, ``n_train``/``n_test`` samples, label noise
    ``noise_std``), the grid of radii D₂ and regularizations b, the full-batch run
    (``iters``), the stochastic runs at ``stochastic_radius`` (``stochastic_runs`` runs of
    ``stochastic_iters`` steps on minibatches of ``batch_size``), the reference solver's
    tolerance and the seed."""

    d: int = 10
    n_train: int = 80
    n_test: int = 200
    noise_std: float = 5.0
    radii: tuple[float, ...] = (0.2, 1.0, 5.0)
    regs: tuple[float, ...] = (0.0, 0.1, 1.0)  # b
    iters: int = 2000
    batch_size: int = 20
    stochastic_radius: float = 1.0
    stochastic_iters: int = 2000
    stochastic_runs: int = 5
    solver_tol: float = 1e-10  # Frank–Wolfe gap at which the reference solver stops
    seed: int = 0

    def __post_init__(self) -> None:
        if any(not (r > 0) for r in self.radii):
            raise ValueError(f"every radius D2 must be > 0, got {self.radii}")
        if any(not (b >= 0) for b in self.regs):
            raise ValueError(f"every regularization b must be >= 0, got {self.regs}")
        if self.iters < 1 or self.stochastic_iters < 1:
            raise ValueError(f"iters must be >= 1, got {self.iters}, {self.stochastic_iters}")

    def schedule(self, mode: str) -> RunSchedule:
        """The runs of ``mode``: ``"full"`` (one full-batch run of ``iters`` steps) or
        ``"stochastic"`` (``stochastic_runs`` runs of ``stochastic_iters`` steps on
        minibatches of ``batch_size``, drawn with the seed ``seed + 1``)."""
        if mode == "full":
            return RunSchedule(self.iters, seed=self.seed)
        if mode != "stochastic":
            raise ValueError(f"unknown mode {mode!r}; expected 'full' or 'stochastic'")
        return RunSchedule(
            self.stochastic_iters, self.batch_size, self.stochastic_runs, seed=self.seed + 1
        )


@dataclass
class FWResults:
    config: FWConfig
    # (mode, radius, b) -> history; mode is "full" or "stochastic"
    histories: dict[tuple[str, float, float], RunHistory] = field(default_factory=dict)
    optimum: dict[tuple[float, float], dict] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)

    def residual(self, mode: str, radius: float, b: float) -> torch.Tensor:
        """``F(X_k) − F*`` per run and iterate."""
        return self.histories[mode, radius, b].objective - self.optimum[radius, b]["value"]


def run_fw_experiment(cfg: FWConfig, progress: Progress = _noop) -> FWResults:
    """Solve every (D₂, b) to high precision, then run the method full batch and stochastic."""
    data = make_logistic_data(cfg.d, cfg.n_train, cfg.n_test, cfg.noise_std, cfg.seed)
    train, test = data.train, data.test
    res = FWResults(cfg)
    L = train.smoothness()
    for radius in cfg.radii:
        for b in cfg.regs:
            sol = solve_constrained(train, radius, b, tol=cfg.solver_tol)
            res.optimum[radius, b] = {
                "value": sol.value,
                "fw_gap": sol.gap,
                "solver_iters": sol.iters,
                "spectral_norm": float(torch.linalg.matrix_norm(sol.X, ord=2)),
                "frobenius_norm": float(torch.linalg.matrix_norm(sol.X)),
                "test_loss": float(test.loss(sol.X)),
            }
            progress(f"F* D2={radius:g} b={b:g}")
    runs = [("full", r, b) for r in cfg.radii for b in cfg.regs]
    runs += [("stochastic", cfg.stochastic_radius, b) for b in cfg.regs]
    for mode, radius, b in runs:
        if (radius, b) not in res.optimum:
            sol = solve_constrained(train, radius, b, tol=cfg.solver_tol)
            res.optimum[radius, b] = {"value": sol.value, "fw_gap": sol.gap}
        hist = run_post_clipping(train, test, radius, b, cfg.schedule(mode))
        res.histories[mode, radius, b] = hist
        progress(f"{mode} D2={radius:g} b={b:g}")

    rows = []
    for (mode, radius, b), hist in res.histories.items():
        resid = res.residual(mode, radius, b).mean(0)
        K = resid.numel() - 1
        D_F = 2 * radius * math.sqrt(min(train.shape))  # diameter of the ball in ‖·‖_F
        rows.append(
            {
                "mode": mode,
                "radius": radius,
                "b": b,
                "iters": K,
                "runs": hist.objective.shape[0],
                "residual_first": float(resid[1]),
                "residual_final": float(resid[-1]),
                "residual_min": float(resid.min()),
                # Theorem with σ = 0: F(X_K) − F* ≤ 2C_f/(K+1), C_f ≤ L_F·D_F².
                "theorem_bound_final": 2 * L * D_F**2 / (K + 1),
                "max_spectral_norm": float(hist.spectral_norm.max()),
                "final_spectral_norm": float(hist.spectral_norm[:, -1].mean()),
                "final_frobenius_norm": float(hist.frobenius_norm[:, -1].mean()),
                "final_test_loss": float(hist.test_loss[:, -1].mean()),
                "min_test_loss": float(hist.test_loss.mean(0).min()),
            }
        )
    res.summary = {
        "config": asdict(cfg),
        "smoothness_L": L,
        "optimum": [{"radius": r, "b": b, **v} for (r, b), v in res.optimum.items()],
        "runs": rows,
    }
    return res


def fw_curve_rows(res: FWResults, stride: int | None = None) -> list[list]:
    """CSV rows (mode, radius, b, k, residual, objective, test_loss, spectral, frobenius):
    every iterate up to k = 100, then every ``stride``-th (mean over stochastic runs)."""
    out = []
    for (mode, radius, b), hist in res.histories.items():
        K = hist.objective.shape[1] - 1
        step = stride or max(1, K // 500)
        resid = res.residual(mode, radius, b).mean(0)
        means = [h.mean(0) for h in (hist.objective, hist.test_loss)]
        norms = [h.mean(0) for h in (hist.spectral_norm, hist.frobenius_norm)]
        for k in range(K + 1):
            if k <= 100 or k % step == 0 or k == K:
                out.append(
                    [mode, radius, b, k, float(resid[k]), *(float(v[k]) for v in means + norms)]
                )
    return out


FW_CURVE_HEADER = [
    "mode",
    "radius",
    "b",
    "k",
    "residual",
    "objective",
    "test_loss",
    "spectral_norm",
    "frobenius_norm",
]


# --------------------------------------------------------------------------- experiment 2


@dataclass
class SpikeResults:
    config: SpikeConfig
    runs: dict[tuple[float, str], SpikeRuns] = field(default_factory=dict)  # (ℓ, method)
    summary: dict = field(default_factory=dict)


def run_spike_experiment(cfg: SpikeConfig, progress: Progress = _noop) -> SpikeResults:
    """Every method over the η₀ grid at every ℓ; the same noise draws for every method at one ℓ."""
    data = make_logistic_data(cfg.d, cfg.n, 0, cfg.noise_std, cfg.seed)
    train = data.train
    res = SpikeResults(cfg)
    for i, scale in enumerate(cfg.scales):
        for method in cfg.methods:
            res.runs[scale, method] = run_spike_method(
                train, method, scale, cfg, seed=cfg.seed + 1000 * (i + 1)
            )
            progress(f"l={scale:g} {method}")
    grad0 = train.loss_and_grad(torch.zeros(train.shape, dtype=DTYPE))[1]
    chosen = []
    for (scale, method), runs in res.runs.items():
        best = runs.best()
        final = runs.final_losses()
        chosen.append(
            {
                "scale": scale,
                "method": method,
                "best_eta0": None if best is None else float(runs.eta0[best]),
                "best_final_loss": math.inf if best is None else float(final[best]),
                "best_at_grid_edge": best is not None and best in (0, len(cfg.eta_grid) - 1),
                "converging_eta0": runs.eta0[torch.isfinite(final)].tolist(),
            }
        )
    res.summary = {
        "config": asdict(cfg),
        "gradient_bound_M": train.gradient_bound(),
        "grad_spectral_norm_at_0": float(torch.linalg.matrix_norm(grad0, ord=2)),
        "smoothness_L": train.smoothness(),
        "initial_loss": math.log(2.0),
        "final_loss_definition": "mean f(X_k) over the last 5% of iterates; inf if a loss is "
        "non-finite or the final value exceeds f(X_0)",
        "chosen": chosen,
    }
    return res


def spike_grid_rows(res: SpikeResults) -> list[list]:
    rows = []
    for (scale, method), runs in res.runs.items():
        final = runs.final_losses()
        for e, f in zip(runs.eta0.tolist(), final.tolist(), strict=True):
            rows.append([scale, method, e, f, int(not math.isfinite(f))])
    return rows


SPIKE_GRID_HEADER = ["scale", "method", "eta0", "final_loss", "diverged"]


def spike_curve_rows(res: SpikeResults) -> list[list]:
    """Training loss per iterate of each method's best η₀ at each ℓ."""
    rows = []
    for (scale, method), runs in res.runs.items():
        best = runs.best()
        if best is None:
            continue
        eta = float(runs.eta0[best])
        for k, f in enumerate(runs.losses[best].tolist()):
            rows.append([scale, method, eta, k, f])
    return rows


SPIKE_CURVE_HEADER = ["scale", "method", "eta0", "k", "loss"]
