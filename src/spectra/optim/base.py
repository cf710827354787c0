r"""The SPECTRA step, written once and shared by every optimizer in ``spectra.optim``.

One step of "Enhancing LLM Training via Spectral Clipping" (Algorithm SPECTRA) is the chain

    g̃ = H_{c_pre}(g)                       (optional pre-clipping of the raw gradient)
    U = base_direction(g̃, state)           (AdamW, Signum, AdEMAMix, MARS, SGDM, ...)
    X ← (1 − λη) X − α η · post(U)          (post = H_{c_k}, clip^sp_{c_k} or orth)

with ``H_c`` the soft spectral clip, ``c_k`` from the clip schedule, ``λ`` the decoupled weight
decay, ``η`` the learning rate and ``α`` the clip scale (``max(1, √(m/n))`` for an (m, n)
weight). ``clip_c=None`` disables the post operator, and the update is the base optimizer's.

Two ways to use the chain:

* :class:`SpectraOptimizer` — base class of the native optimizers. A subclass supplies only the
  base direction: ``_init_state(group, p, state)`` creates the state buffers (the skeleton adds
  ``state["step"]``) and ``_direction(group, params, grads, states, out)`` writes ``U`` into
  ``out`` with ``torch._foreach_*`` ops (``grads`` are the possibly pre-clipped gradients; never
  modify them). Optionally ``_param_rules(group, p)`` returns a per-parameter
  ``(lr_scale, weight_decay)`` (MARS uses it for its 1-D AdamW). The skeleton handles the
  rest: state steps, non-finite gradients, pre-clipping, chunking, batching same-shaped
  matrices into one operator call, weight decay and the learning rate.
* The module-level helpers (:func:`spectral_settings`, :func:`post_threshold`,
  :func:`spectral_post`, ...) used by :class:`spectra.optim.Spectra` to wrap any optimizer.

Tensors with more than two dimensions are viewed as ``(d0, d1·d2·…)`` matrices (the convention
for convolution kernels); 1-D tensors are ``(1, d)`` matrices when ``clip_params="all"``
(whose only singular value is the Euclidean norm, so the matrix rule is the paper's vector
rule); 0-D tensors are never clipped.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable
from numbers import Real
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from spectra.ops import hard_clip, orthogonalize, soft_clip
from spectra.optim.schedules import ClipSchedule

POST_OPERATORS = ("clip", "hard_clip", "orth")
CLIP_PARAMS = ("matrices", "all")
NONFINITE_POLICIES = ("raise", "skip")

#: SPECTRA settings every param group carries, with their defaults.
SPECTRA_DEFAULTS: dict[str, Any] = {
    "clip_c": 10.0,
    "clip_scale": "auto",
    "clip_method": "auto",
    "clip_schedule": "standard",
    "clip_params": "matrices",
    "post": "clip",
    "pre_clip_c": None,
    "pre_clip_schedule": "constant",
    "warmup_steps": 0,
    "peak_lr": None,
}

#: One operator call gets at most ``max(one matrix, chunk / OPERATOR_BATCH_FRACTION)`` elements:
#: the operators' float64 temporaries for a batch of square matrices are several times the
#: batch, and this keeps them below those of the largest single matrix.
OPERATOR_BATCH_FRACTION = 4

#: ``chunk_size=None`` processes a group in chunks of ``max(largest parameter, group size / 8)``
#: elements, keeping a step's transient memory below the single full-size temporary of
#: ``torch.optim.AdamW(foreach=True)``.
DEFAULT_CHUNK_SIZE = None
AUTO_CHUNKS = 8


# --------------------------------------------------------------------------- validation


def _is_real(x: Any) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def _positive_or_none(value: Any, name: str) -> None:
    if value is None:
        return
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be None or a finite number > 0, got {value!r}")


def check_number(name: str, value: Any, low: float, high: float | None = None) -> None:
    """Require ``low <= value`` (and ``value < high`` when given), naming the bad value."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    if value < low or (high is not None and value >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


def check_nonnegative(value: Any, name: str) -> float:
    """Return ``value`` as a float after checking it is a finite number >= 0."""
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if not _is_real(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def check_beta(value: Any, name: str, *, closed: bool = False) -> float:
    """Check ``value ∈ [0, 1)`` (or ``[0, 1]`` when ``closed``)."""
    ok = _is_real(value) and (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0)
    if not ok:
        bound = "[0, 1]" if closed else "[0, 1)"
        raise ValueError(f"{name} must be a number in {bound}, got {value!r}")
    return float(value)


def _probe_method(post: str, method: Any) -> None:
    # Asking the operator itself keeps this check in step with the methods spectra.ops offers.
    probe = torch.eye(2)
    try:
        if post == "orth":
            orthogonalize(probe, method=method)
        elif post == "hard_clip":
            hard_clip(probe, 1.0, method=method)
        else:
            soft_clip(probe, 1.0, method=method)
    except (ValueError, TypeError) as err:
        raise ValueError(f"clip_method={method!r} is not valid for post={post!r}: {err}") from None


def spectral_settings(group: dict[str, Any]) -> None:
    """Validate a param group's SPECTRA settings in place; normalise the schedules to dicts.

    Raises ``ValueError`` naming the offending value.
    """
    _positive_or_none(group["clip_c"], "clip_c")
    _positive_or_none(group["pre_clip_c"], "pre_clip_c")
    _positive_or_none(group["peak_lr"], "peak_lr")
    scale = group["clip_scale"]
    if scale != "auto" and (not _is_real(scale) or not math.isfinite(scale) or scale <= 0):
        raise ValueError(f"clip_scale must be 'auto' or a finite number > 0, got {scale!r}")
    if group["post"] not in POST_OPERATORS:
        raise ValueError(f"post must be one of {POST_OPERATORS}, got {group['post']!r}")
    if group["clip_params"] not in CLIP_PARAMS:
        raise ValueError(f"clip_params must be one of {CLIP_PARAMS}, got {group['clip_params']!r}")
    ws = group["warmup_steps"]
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 0:
        raise ValueError(f"warmup_steps must be an int >= 0, got {ws!r}")
    _probe_method(group["post"], group["clip_method"])
    if group["pre_clip_c"] is not None:
        _probe_method("clip", group["clip_method"])
    for key in ("clip_schedule", "pre_clip_schedule"):
        group[key] = ClipSchedule.coerce(group[key]).as_dict()


def check_chunk_size(chunk_size: Any) -> int | None:
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be None or an int >= 1, got {chunk_size!r}")
    return chunk_size


def check_nonfinite(policy: Any) -> str:
    if policy not in NONFINITE_POLICIES:
        raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {policy!r}")
    return policy


# --------------------------------------------------------------------------- per-parameter rules


def matrix_shape(p: Tensor, clip_params: str) -> tuple[int, int] | None:
    """The (m, n) matrix a parameter is clipped as, or ``None`` when it is not clipped."""
    if p.numel() == 0:
        return None
    if p.dim() >= 2:
        return p.shape[0], p.numel() // p.shape[0]
    if p.dim() == 1 and clip_params == "all":
        return 1, p.shape[0]
    return None


def clip_scale(group: dict[str, Any], shape: tuple[int, int]) -> float:
    """α: ``max(1, √(m/n))`` for ``clip_scale="auto"``, else the given number."""
    scale = group["clip_scale"]
    if scale == "auto":
        m, n = shape
        return max(1.0, math.sqrt(m / n))
    return float(scale)


def post_active(group: dict[str, Any]) -> bool:
    """Whether the group applies a post operator at all (clip with a threshold, or orth)."""
    return group["post"] == "orth" or group["clip_c"] is not None


def peak_lr(group: dict[str, Any]) -> float:
    """η of the "standard" schedule: ``peak_lr`` if set, else OneCycleLR's ``max_lr``, else the
    ``initial_lr`` an LR scheduler records, else the current ``lr``."""
    for key in ("peak_lr", "max_lr", "initial_lr"):
        value = group.get(key)
        if value is not None:
            return float(value)
    return float(group["lr"])


def _threshold(group: dict[str, Any], c_key: str, sched_key: str, step: int) -> float | None:
    c = group[c_key]
    if c is None:
        return None
    sched = ClipSchedule.coerce(group[sched_key])
    factor = sched.factor(step, float(group["lr"]), peak_lr(group), group["warmup_steps"])
    return c * factor


def post_threshold(group: dict[str, Any], step: int) -> float | None:
    """``c_k`` for the post operator at 0-based ``step`` (``None``: no clipping)."""
    if group["post"] == "orth":
        return None
    return _threshold(group, "clip_c", "clip_schedule", step)


def pre_threshold(group: dict[str, Any], step: int) -> float | None:
    """The pre-clipping threshold at 0-based ``step`` (``None``: pre-clipping off)."""
    return _threshold(group, "pre_clip_c", "pre_clip_schedule", step)


def spectral_post(U: Tensor, group: dict[str, Any], c: float | None) -> Tensor:
    """Apply the group's post operator to a batch of matrices ``U`` (shape ``(B, m, n)``)."""
    post, method = group["post"], group["clip_method"]
    if post == "orth":
        return orthogonalize(U, method=method)
    if c is None or math.isinf(c):
        return U
    if post == "hard_clip":
        return hard_clip(U, c, method=method)
    return soft_clip(U, c, method=method)


def pre_clip(G: Tensor, group: dict[str, Any], c: float) -> Tensor:
    """Soft-clip a batch of raw gradients ``G`` (shape ``(B, m, n)``) at threshold ``c``."""
    if math.isinf(c):
        return G
    return soft_clip(G, c, method=group["clip_method"])


def grads_finite(grads: Iterable[Tensor]) -> bool:
    """True when every gradient is finite; one host synchronisation per device."""
    by_device: dict[torch.device, list[Tensor]] = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g)
    for gs in by_device.values():
        # min and max are finite exactly when every entry is (nan propagates), and unlike a
        # norm they cannot overflow for finite input.
        extremes = [v.reshape(1).float() for g in gs if g.numel() for v in torch.aminmax(g)]
        if extremes and not bool(torch.cat(extremes).isfinite().all()):
            return False
    return True


def apply_update(
    params: list[Tensor], updates: list[Tensor], coefs: list[float], decays: list[float]
) -> None:
    """``p ← decay·p + coef·u`` for every parameter, with as few foreach calls as possible."""
    if any(d != 1.0 for d in decays):
        torch._foreach_mul_(params, decays)
    by_coef: dict[float, tuple[list[Tensor], list[Tensor]]] = {}
    for p, u, c in zip(params, updates, coefs, strict=True):
        ps, us = by_coef.setdefault(c, ([], []))
        ps.append(p)
        us.append(u)
    for c, (ps, us) in by_coef.items():
        if c != 0.0:
            torch._foreach_add_(ps, us, alpha=c)


def _runs(items: list, key: Callable[[Any], Any]) -> list[tuple[int, int]]:
    """Maximal [start, end) runs of consecutive items with equal ``key``."""
    runs, start = [], 0
    for i in range(1, len(items) + 1):
        if i == len(items) or key(items[i]) != key(items[start]):
            runs.append((start, i))
            start = i
    return runs


def _batches(runs: list[tuple[int, int]], per_item: list[int], cap: int):
    """Split runs so that each batch holds at most ``cap`` elements (and at least one item)."""
    for a, b in runs:
        start, size = a, 0
        for i in range(a, b):
            if i > start and size + per_item[i] > cap:
                yield start, i
                start, size = i, 0
            size += per_item[i]
        yield start, b


def handle_nonfinite(opt: Optimizer, grads: list[Tensor], policy: str) -> bool:
    """Return True when the step may proceed; raise or count a skipped step otherwise."""
    if grads_finite(grads):
        return True
    if policy == "raise":
        raise FloatingPointError(
            f"{type(opt).__name__}.step(): a gradient contains inf or nan; no parameter or state "
            "was changed (pass nonfinite='skip' to skip such steps)"
        )
    opt.num_skipped_steps = getattr(opt, "num_skipped_steps", 0) + 1
    warnings.warn(
        f"{type(opt).__name__}.step(): non-finite gradient, step skipped",
        RuntimeWarning,
        stacklevel=3,
    )
    return False


# --------------------------------------------------------------------------- the skeleton


class _Entry:
    """One parameter's plan for this step."""

    __slots__ = ("c_post", "c_pre", "coef", "decay", "grad", "p", "post", "shape", "state")

    def __init__(self, p, state, shape, post, c_post, c_pre, coef, decay):
        self.p, self.state, self.shape = p, state, shape
        self.post, self.c_post, self.c_pre = post, c_post, c_pre
        self.coef, self.decay = coef, decay
        self.grad = p.grad

    def sort_key(self):
        p = self.p
        return (
            str(p.device),
            str(p.dtype),
            self.post,
            self.shape or (0, 0),
            -1.0 if self.c_post is None else self.c_post,
            -1.0 if self.c_pre is None else self.c_pre,
        )


class SpectraOptimizer(Optimizer):
    """Base class: a base direction (supplied by the subclass) inside the SPECTRA step.

    Args:
        params: parameters or param groups.
        defaults: the base optimizer's hyperparameters; the SPECTRA settings are merged in
            from ``spectra`` (see :data:`SPECTRA_DEFAULTS`).
        spectra: SPECTRA settings given to the constructor.
        nonfinite: ``"raise"`` (default) raises ``FloatingPointError`` when any gradient holds
            inf/nan, before anything changes; ``"skip"`` leaves parameters and state untouched
            for that step and counts it in ``num_skipped_steps``.
        chunk_size: at most this many elements (or one parameter, if larger) are processed at
            a time, bounding the step's transient memory; ``None`` (default) uses
            ``max(largest parameter, group size / 8)``.
    """

    def __init__(
        self,
        params: Any,
        defaults: dict[str, Any],
        spectra: dict[str, Any],
        *,
        nonfinite: str = "raise",
        chunk_size: int | None = DEFAULT_CHUNK_SIZE,
    ) -> None:
        settings = {**SPECTRA_DEFAULTS, **spectra}
        unknown = set(settings) - set(SPECTRA_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown SPECTRA settings {sorted(unknown)}")
        spectral_settings(settings)
        defaults = {
            **defaults,
            **settings,
            "nonfinite": check_nonfinite(nonfinite),
            "chunk_size": check_chunk_size(chunk_size),
        }
        self.num_skipped_steps = 0
        super().__init__(params, defaults)

    # -- what a subclass provides -------------------------------------------------------

    def _check_group(self, group: dict[str, Any]) -> None:
        """Validate the base hyperparameters of a group (raise ``ValueError``)."""

    def _init_state(self, group: dict[str, Any], p: Tensor, state: dict[str, Any]) -> None:
        """Create the state buffers of ``p`` (called once, before its first step)."""

    def _direction(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        states: list[dict[str, Any]],
        out: list[Tensor],
    ) -> None:
        """Update the states and write the base direction ``U`` of each parameter into ``out``.

        ``state["step"]`` has already been incremented (it is 1 at the first step).
        """
        raise NotImplementedError

    def _param_rules(self, group: dict[str, Any], p: Tensor) -> tuple[float, float]:
        """``(lr_scale, weight_decay)`` for one parameter; default ``(1, group weight_decay)``."""
        return 1.0, float(group.get("weight_decay", 0.0))

    # -- torch.optim.Optimizer plumbing --------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        spectral_settings(group)
        self._check_group(group)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("num_skipped_steps", 0)
        # Groups saved without some settings (e.g. by torch.optim.AdamW) take the defaults.
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one SPECTRA step; ``closure`` (re-evaluating the loss) is called once."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = []
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            if params:
                work.append((group, params))
        grads = [p.grad for _, ps in work for p in ps]
        if not grads or not handle_nonfinite(self, grads, self.defaults["nonfinite"]):
            return loss
        for group, params in work:
            self._step_group(group, params)
        return loss

    def _plan(self, group: dict[str, Any], params: list[Tensor]) -> list[_Entry]:
        lr = float(group["lr"])
        active = post_active(group)
        entries = []
        thresholds: dict[int, tuple[float | None, float | None]] = {}
        for p in params:
            state = self.state[p]
            if len(state) == 0:
                state["step"] = 0
                self._init_state(group, p, state)
            # A plain int (a state loaded from torch optimizers may hold a tensor).
            state["step"] = int(state["step"]) + 1
            k = state["step"] - 1
            shape = matrix_shape(p, group["clip_params"])
            post = active and shape is not None
            if k not in thresholds:
                thresholds[k] = (post_threshold(group, k), pre_threshold(group, k))
            c_post = thresholds[k][0] if post else None
            c_pre = thresholds[k][1] if shape is not None else None
            lr_scale, wd = self._param_rules(group, p)
            alpha = clip_scale(group, shape) if post else 1.0
            entries.append(
                _Entry(
                    p,
                    state,
                    shape,
                    post,
                    c_post,
                    c_pre,
                    -alpha * lr * lr_scale,
                    1.0 - lr * lr_scale * wd,
                )
            )
        return entries

    def _step_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        entries = sorted(self._plan(group, params), key=_Entry.sort_key)
        budget = group["chunk_size"]
        if budget is None:
            sizes = [e.p.numel() for e in entries]
            budget = max(max(sizes), -(-sum(sizes) // AUTO_CHUNKS))
        start, size = 0, 0
        for i, e in enumerate(entries):
            n = e.p.numel()
            same_kind = i == start or (
                e.p.device == entries[start].p.device and e.p.dtype == entries[start].p.dtype
            )
            if i > start and (size + n > budget or not same_kind):
                self._step_chunk(group, entries[start:i], budget)
                start, size = i, 0
            size += n
        if start < len(entries):
            self._step_chunk(group, entries[start:], budget)

    def _step_chunk(self, group: dict[str, Any], chunk: list[_Entry], budget: int) -> None:
        p0 = chunk[0].p
        sizes = [e.p.numel() for e in chunk]
        cap = budget // OPERATOR_BATCH_FRACTION
        offsets = [0]
        for e in chunk:
            offsets.append(offsets[-1] + e.p.numel())
        flat = torch.empty(offsets[-1], dtype=p0.dtype, device=p0.device)
        out = [flat[offsets[i] : offsets[i + 1]].view(e.p.shape) for i, e in enumerate(chunk)]
        grads = [e.grad for e in chunk]

        # Pre-clipping: one soft_clip call per run of same-shaped gradients.
        for a, b in _batches(_runs(chunk, key=lambda e: (e.shape, e.c_pre)), sizes, cap):
            c, shape = chunk[a].c_pre, chunk[a].shape
            if c is None or shape is None:
                continue
            G = torch.stack([e.grad.reshape(shape) for e in chunk[a:b]])
            Gc = pre_clip(G, group, c)
            del G
            for j, e in enumerate(chunk[a:b]):
                grads[a + j] = Gc[j].view(e.p.shape)

        self._direction(group, [e.p for e in chunk], grads, [e.state for e in chunk], out)
        del grads

        # Post operator: the directions of a run of same-shaped matrices are contiguous in
        # ``flat``, so a batch is a view and the operator is called once per batch (a run, split
        # only when it exceeds the operator cap). Each batch is applied at once, so that only
        # one operator output is alive at a time.
        plain = []
        for a, b in _batches(_runs(chunk, key=lambda e: (e.post, e.shape, e.c_post)), sizes, cap):
            if not chunk[a].post:
                plain.extend(range(a, b))
                continue
            m, n = chunk[a].shape
            U = flat[offsets[a] : offsets[b]].view(b - a, m, n)
            Y = spectral_post(U, group, chunk[a].c_post)
            run = chunk[a:b]
            apply_update(
                [e.p for e in run],
                [Y[j].view(e.p.shape) for j, e in enumerate(run)],
                [e.coef for e in run],
                [e.decay for e in run],
            )
            del Y
        if plain:
            apply_update(
                [chunk[i].p for i in plain],
                [out[i] for i in plain],
                [chunk[i].coef for i in plain],
                [chunk[i].decay for i in plain],
            )
