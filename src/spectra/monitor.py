r"""``SpectralMonitor``: the spectra of gradients and steps, read off any training loop.

Every ``every`` optimizer steps the monitor records, for each chosen matrix ``X`` (a tensor's
``(d0, d1·d2·…)`` view, as the spectral links see it), from its gradient ``G`` and the step
the optimizer applied:

* ``grad_sigma_max``, ``grad_sigma_<i>`` (``i = 2…k``): the top-k singular values of ``G``;
* ``grad_spike``: the spike score ``σ_max(G) / (‖G‖_F/√min(m, n))``;
* ``update_sigma_max``, ``update_sigma_<i>``: the top-k singular values of the applied update
  ``ΔX = X_{k+1} − X_k``; ``update_spike``: its spike score;
* ``update_stable_rank``: ``‖ΔX‖_F² / ‖ΔX‖₂²``;
* ``clip_c``: c_k, the optimizer's threshold for this step;
* ``step_sigma_max``: ``‖D‖₂`` for the decay-corrected step ``D = X_{k+1} − (1 − λη) X_k``,
  which is ``−αη·post(U)``;
* ``step_bound``: ``αη·c_k`` (``αη`` for ``orthogonalize``), and ``step_norm_over_bound``,
  ``step_sigma_max / step_bound``, ≤ 1 for a SPECTRA step;
* ``clip_active_topk``: the fraction of the top-k singular values of ``D`` whose direction was
  clipped (below);
* ``weight_fro``, ``weight_linf``: ``‖X_{k+1}‖_F`` and ``max |X_{k+1}|``;

and the aggregates ``spectral/max_grad_spike``, ``spectral/max_update_spike``,
``spectral/max_step_norm_over_bound``, ``spectral/mean_clip_active_topk``, and
``spectral/sum_weight_linf``, ``spectral/sum_weight_fro``: the sums of ``weight_linf`` and
``weight_fro`` over the matrices recorded, the aggregated weight norms whose evolution
"Enhancing LLM Training via Spectral Clipping" plots (its figure of the ℓ∞ and Frobenius norms
of all weight matrices during training).

The spike score divides σ_max by the RMS singular value ``√(Σσ²/min(m, n)) = ‖·‖_F/√min(m, n)``
rather than by a median: the RMS comes exactly from the Frobenius norm, needs no full spectrum,
and the score runs from 1 (a flat spectrum, an orthogonal matrix) to ``√min(m, n)`` (rank one).

Clip activity: the post operators are monotone in each singular value, so a singular value σ
of the direction ``U`` exceeded ``c_k`` exactly when its image in ``post(U) = D/(−αη)`` exceeds
the image of ``c_k``: ``h_c(c) = c/√2`` for ``soft_clip``, ``c`` for ``hard_clip`` (counted from
``c(1 − 10⁻³)`` on, for its approximate methods). With only the top-k singular values at hand,
``clip_active_topk`` is the fraction of those k that were clipped: 1 means at least k directions
were clipped, and it says nothing about the singular values below the k-th. The keys that need
c_k (``clip_c``, ``step_*``, ``clip_active_topk``) appear for the optimizers of
:mod:`spectra.optim` only, whose plan for the step (η, λ, α, c_k) the monitor reads before the
step; ``clip_active_topk`` is left out for ``orthogonalize``, which moves every direction.

Sharded parameters (FSDP2's ``DTensor``): each matrix the monitor reads (gradient, step,
weights) is gathered whole with ``full_tensor()``, one at a time, a collective that every rank
runs at the same steps; the weight copy kept across the step is the local shard.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

from spectra.optim.base import SpectraOptimizer
from spectra.optim.distributed import whole
from spectra.optim.settings import group_clips
from spectra.validate import check_choice, check_int

__all__ = [
    "SpectralMonitor",
    "lr_and_weight_decay",
    "spike_score",
    "stable_rank",
    "top_singular_values",
]

METHODS = ("power", "svd")
#: Extra columns of the block iteration beyond the k reported: they speed its convergence.
OVERSAMPLE = 2
#: Relative tolerance below c at which a hard-clipped singular value still counts as clipped.
HARD_CLIP_TOL = 1e-3


def top_singular_values(
    A: Tensor,
    k: int = 4,
    iters: int = 8,
    *,
    method: str = "power",
    generator: torch.Generator | None = None,
) -> Tensor:
    """The ``k`` largest singular values of ``A``'s ``(d0, rest)`` view, largest first.

    ``method="power"``: block subspace iteration with ``k + 2`` columns started from Gaussian
    vectors drawn from ``generator`` (never the global generator), ``iters`` rounds of
    ``Q = qr(A V)``, ``V = qr(Aᵀ Q)``, then the singular values of ``A V`` (Rayleigh–Ritz).
    They approach the true ones from below, the i-th error shrinking like
    ``(σ_{b+1}/σ_i)^{2·iters}`` for block size ``b``. ``method="svd"``: exact, in float64.
    Returns float64 on the CPU.
    """
    check_choice("method", method, METHODS)
    A = A.detach().reshape(A.shape[0], -1)
    m, n = A.shape
    k = min(k, m, n)
    b = min(k + OVERSAMPLE, m, n)
    if method == "svd" or b == min(m, n):
        return torch.linalg.svdvals(A.double()).cpu()[:k]
    A = A.double() if A.dtype == torch.float64 else A.float()
    if m < n:  # iterate on the short side's block
        A = A.mT
        m, n = n, m
    V = torch.randn(n, b, generator=generator, dtype=torch.float64).to(A.device, A.dtype)
    V = torch.linalg.qr(V).Q
    for _ in range(iters):
        Q = torch.linalg.qr(A @ V).Q
        V = torch.linalg.qr(A.mT @ Q).Q
    return torch.linalg.svdvals(A @ V).double().cpu()[:k]


def lr_and_weight_decay(optimizer: torch.optim.Optimizer, p: Tensor) -> tuple[float, float]:
    """``(η, λ)`` of ``optimizer``'s next step for ``p``: its group's lr and weight decay, or a
    spectra optimizer's :meth:`~spectra.optim.SpectraOptimizer.param_plan` (MARS's 1-D rule).

    With decoupled weight decay the step is ``X ← (1 − ηλ) X − η·u``, so the update ``u`` is
    ``−(X_{k+1} − (1 − ηλ) X_k)/η``. Raises ``ValueError`` if ``p`` is not in ``optimizer``.
    """
    for group in optimizer.param_groups:
        if any(q is p for q in group["params"]):
            if isinstance(optimizer, SpectraOptimizer):
                pl = optimizer.param_plan(group, p, next_step(optimizer, p))
                return pl.lr, pl.weight_decay
            return float(group["lr"]), float(group.get("weight_decay", 0.0))
    raise ValueError(f"a parameter of shape {tuple(p.shape)} is not in the optimizer")


def next_step(optimizer: torch.optim.Optimizer, p: Tensor) -> int:
    """The 0-based index of ``p``'s next step: the steps its state has counted so far."""
    state = optimizer.state.get(p, {})
    return int(state["step"]) if "step" in state else 0


def spike_score(sigma_max: float, fro: float, shape: tuple[int, int]) -> float:
    """``σ_max / (‖A‖_F/√min(m, n))``: σ_max against the RMS singular value (0 for A = 0)."""
    return sigma_max * math.sqrt(min(shape)) / fro if fro > 0 else 0.0


def stable_rank(sigma_max: float, fro: float) -> float:
    """``‖A‖_F² / ‖A‖₂²`` (0 for A = 0)."""
    return (fro / sigma_max) ** 2 if sigma_max > 0 else 0.0


class SpectralMonitor:
    r"""Spectral health of a training run: gradient and step spectra every ``every`` steps.

    Args:
        model: names the parameters (``named_parameters``); optional.
        optimizer: the optimizer whose steps are watched: one of :mod:`spectra.optim` (the
            step bound and clip activity are read from its plan) or any torch optimizer.
        params: the matrices to watch: tensors, ``(name, tensor)`` pairs, or names of
            ``model``'s parameters. Default: every parameter of 2 or more dimensions that a
            spectra optimizer clips (groups with a ``clip_c`` or ``post="orthogonalize"``);
            for another optimizer, every parameter of 2 or more dimensions it holds.
        every: monitored steps are those whose 0-based count is a multiple of ``every``.
        k: how many top singular values to record.
        iters: rounds of subspace iteration (``method="power"``).
        method: ``"power"`` (block subspace iteration) or ``"svd"`` (exact, float64).
        seed: seeds the monitor's own ``torch.Generator`` for the iteration's starts, afresh
            at each monitored step (with ``seed + step``): the values of a step depend on that
            step alone, so a monitor started at step k (``step_count = k``, as a resumed
            run does) records what an uninterrupted one would.
        prefix: the keys' prefix.

    Usage::

        mon = SpectralMonitor(model, optimizer, every=50)
        loss.backward()
        mon.before_step()            # reads the gradients, copies the weights
        optimizer.step()
        scalars = mon.after_step()   # {} on unmonitored steps

    or ``mon.attach()``, which registers the two calls as the optimizer's step hooks.

    The trajectory is never changed: the monitor reads tensors under ``torch.no_grad``,
    writes none of them, and draws its random starts from its own generator, so the global
    RNG is untouched. On a monitored step it keeps one copy of each watched weight from
    ``before_step`` to ``after_step`` (the watched parameters' memory, once); on other steps
    it keeps nothing and costs a counter increment.

    Cost per watched ``(m, n)`` matrix and monitored step, with ``b = k + 2`` block columns
    and ``q = iters``: each spectrum takes ``(4q + 2)·m·n·b`` flops (two matrix products per
    round plus the start and the Rayleigh–Ritz product) and QRs of ``(max(m, n), b)``
    blocks; the monitor takes two spectra (gradient, ``ΔX``) and a third of the
    decay-corrected step when weight decay is on. At the defaults (k=4, q=8) that is about
    ``3·34·6 ≈ 600·m·n`` flops, about ``12·m·n`` per step averaged over ``every=50`` —
    against the ``6·m·n`` flops per token of the forward and backward pass, a small fraction
    of one token's compute. Each spectrum also moves its values to the host (one sync).
    ``method="svd"`` costs a float64 SVD, ``O(m·n·min(m, n))``, per spectrum.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        params: Iterable[Any] | None = None,
        every: int = 50,
        k: int = 4,
        iters: int = 8,
        method: str = "power",
        seed: int = 0,
        prefix: str = "spectral",
    ) -> None:
        self.every = check_int("every", every, low=1)
        self.k = check_int("k", k, low=1)
        self.iters = check_int("iters", iters, low=1)
        self.method = check_choice("method", method, METHODS)
        self.prefix = prefix
        self.model = model
        self.optimizer = optimizer
        self.seed = check_int("seed", seed)
        self.generator = torch.Generator()
        self.watched = self._choose(model, optimizer, params)
        self.step_count = 0
        self.last: dict[str, float] = {}
        self._pending: list[dict[str, Any]] | None = None

    # -- which matrices ------------------------------------------------------------------

    def _choose(
        self,
        model: nn.Module | None,
        optimizer: torch.optim.Optimizer | None,
        params: Iterable[Any] | None,
    ) -> list[tuple[str, Tensor]]:
        names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        if params is not None:
            by_name = dict(model.named_parameters()) if model is not None else {}
            chosen = []
            for i, item in enumerate(params):
                if isinstance(item, str):
                    if item not in by_name:
                        raise ValueError(f"params names no parameter of the model, got {item!r}")
                    chosen.append((item, by_name[item]))
                elif isinstance(item, tuple):
                    chosen.append((str(item[0]), item[1]))
                elif isinstance(item, Tensor):
                    chosen.append((names.get(id(item), f"param{i}"), item))
                else:
                    raise ValueError(
                        f"params must hold tensors, (name, tensor) pairs or names, got {item!r}"
                    )
            return chosen
        if optimizer is None:
            if model is None:
                raise ValueError("SpectralMonitor needs a model, an optimizer or params")
            return [(n, p) for n, p in model.named_parameters() if p.dim() >= 2]
        chosen = []
        for g, group in enumerate(optimizer.param_groups):
            if isinstance(optimizer, SpectraOptimizer) and not group_clips(group):
                continue
            for i, p in enumerate(group["params"]):
                if p.dim() >= 2 and p.numel() > 0:
                    chosen.append((names.get(id(p), f"group{g}.{i}"), p))
        return chosen

    # -- the two calls around the step ---------------------------------------------------

    def monitoring(self) -> bool:
        """Whether the step about to be taken is monitored."""
        return self.step_count % self.every == 0

    @torch.no_grad()
    def before_step(self) -> None:
        """Read the gradients and copy the weights (a no-op on unmonitored steps)."""
        self._pending = None
        if not self.monitoring():
            return
        self.generator.manual_seed(self.seed + self.step_count)
        pending = []
        for name, p in self.watched:
            if p.grad is None or p.grad.is_sparse:
                continue
            entry: dict[str, Any] = {"name": name, "p": p, "before": p.detach().clone()}
            entry["grad"] = self._spectrum(p.grad)
            entry.update(self._plan(p))
            pending.append(entry)
        self._pending = pending

    @torch.no_grad()
    def after_step(self) -> dict[str, float]:
        """The scalars of a monitored step (``{}`` otherwise); also kept in ``self.last``."""
        pending, self._pending = self._pending, None
        monitored = self.monitoring()
        self.step_count += 1
        if not monitored or pending is None:
            return {}
        out: dict[str, float] = {f"{self.prefix}/step": float(self.step_count - 1)}
        spikes, update_spikes, ratios, active, fros, linfs = [], [], [], [], [], []
        for e in pending:
            key = f"{self.prefix}/{e['name']}/"
            p, before = e["p"].detach(), e["before"]
            work = torch.float64 if p.dtype == torch.float64 else torch.float32
            delta = p.to(work) - before.to(work)
            shape = (delta.shape[0], delta.numel() // delta.shape[0])
            s_g, fro_g = e["grad"]
            self._sigmas(out, key + "grad_sigma", s_g)
            spikes.append(spike_score(float(s_g[0]), fro_g, shape))
            out[key + "grad_spike"] = spikes[-1]
            s_u, fro_u = self._spectrum(delta)
            self._sigmas(out, key + "update_sigma", s_u)
            update_spikes.append(spike_score(float(s_u[0]), fro_u, shape))
            out[key + "update_spike"] = update_spikes[-1]
            out[key + "update_stable_rank"] = stable_rank(float(s_u[0]), fro_u)
            if "decay" in e:
                s_d = s_u
                if e["decay"] != 1.0:
                    s_d, _ = self._spectrum(p.to(work) - e["decay"] * before.to(work))
                if e["clip_c"] is not None:
                    out[key + "clip_c"] = e["clip_c"]
                if e["bound"] is not None:
                    out[key + "step_sigma_max"] = float(s_d[0])
                    out[key + "step_bound"] = e["bound"]
                    ratios.append(float(s_d[0]) / e["bound"] if e["bound"] > 0 else 0.0)
                    out[key + "step_norm_over_bound"] = ratios[-1]
                if e["active_at"] is not None:
                    active.append(float((s_d >= e["active_at"]).double().mean()))
                    out[key + "clip_active_topk"] = active[-1]
            weights = _whole(p)
            fros.append(float(torch.linalg.vector_norm(weights, dtype=torch.float64)))
            linfs.append(float(weights.abs().max()))
            out[key + "weight_fro"], out[key + "weight_linf"] = fros[-1], linfs[-1]
        for label, values in (
            ("max_grad_spike", spikes),
            ("max_update_spike", update_spikes),
            ("max_step_norm_over_bound", ratios),
        ):
            if values:
                out[f"{self.prefix}/{label}"] = max(values)
        if active:
            out[f"{self.prefix}/mean_clip_active_topk"] = sum(active) / len(active)
        if fros:
            out[f"{self.prefix}/sum_weight_linf"] = sum(linfs)
            out[f"{self.prefix}/sum_weight_fro"] = sum(fros)
        self.last = out
        return out

    def attach(self, callback: Callable[[dict[str, float]], Any] | None = None) -> tuple[Any, Any]:
        """Run ``before_step``/``after_step`` as the optimizer's step pre/post hooks.

        ``callback(scalars)`` is called after each monitored step (a logger's ``log``, say);
        the scalars are also in ``self.last``. Returns the two hook handles
        (``handle.remove()`` detaches). Gradients made inside a ``step(closure)`` are not
        there yet when the pre-hook runs; such steps record no gradient spectra.
        """
        if self.optimizer is None:
            raise ValueError("attach() needs the monitor's optimizer")

        def post_hook(*_: Any) -> None:
            scalars = self.after_step()
            if scalars and callback is not None:
                callback(scalars)

        pre = self.optimizer.register_step_pre_hook(lambda *_: self.before_step())
        post = self.optimizer.register_step_post_hook(post_hook)
        return pre, post

    # -- helpers -------------------------------------------------------------------------

    def _spectrum(self, A: Tensor) -> tuple[Tensor, float]:
        """Top-k singular values (float64, CPU) and the Frobenius norm of ``A``."""
        A = _whole(A)
        s = top_singular_values(A, self.k, self.iters, method=self.method, generator=self.generator)
        fro = float(torch.linalg.vector_norm(A, dtype=torch.float64))
        return s, fro

    def _sigmas(self, out: dict[str, float], key: str, s: Tensor) -> None:
        out[key + "_max"] = float(s[0])
        for i in range(1, len(s)):
            out[f"{key}_{i + 1}"] = float(s[i])

    def _plan(self, p: Tensor) -> dict[str, Any]:
        """The spectra optimizer's η, λ, α and c_k for ``p`` at the step about to be taken."""
        opt = self.optimizer
        if not isinstance(opt, SpectraOptimizer):
            return {}
        g = next(
            (i for i, group in enumerate(opt.param_groups) if any(q is p for q in group["params"])),
            None,
        )
        if g is None:
            return {}
        step = next_step(opt, p)
        pl = opt.param_plan(opt.param_groups[g], p, step)
        c = opt.clip_threshold(step, group=g)
        bound = active_at = None
        if pl.post is not None and pl.post.kind == "orthogonalize":
            bound = pl.scale * pl.lr
        elif pl.post is not None:
            bound = pl.scale * pl.lr * pl.post.c
            at = pl.post.c / math.sqrt(2.0) if pl.post.kind == "soft_clip" else pl.post.c
            if pl.post.kind == "hard_clip":
                at *= 1.0 - HARD_CLIP_TOL
            active_at = pl.scale * pl.lr * at
        return {
            "decay": 1.0 - pl.lr * pl.weight_decay,
            "clip_c": c,
            "bound": bound,
            "active_at": active_at,
        }


def _whole(t: Tensor) -> Tensor:
    """``t`` as one plain tensor: a ``DTensor`` gathered (a collective), any other as is."""
    return whole(t)
