r"""``SpectraOptimizer``: the torch.optim class around the SPECTRA chain.

The math of a step lives in :mod:`spectra.optim.chain` (pre-clip → base direction → post
operator → weight decay → lr) and the per-group settings in :mod:`spectra.optim.settings`.
This class only validates its arguments, keeps the state, builds each parameter's
:class:`~spectra.optim.chain.ParamPlan` and calls :func:`~spectra.optim.chain.spectra_step`.

A subclass supplies the base direction:

* ``__init__(params, <its hyperparameters>, **options)`` passes its hyperparameters as a dict
  and ``options`` as they are to ``SpectraOptimizer.__init__``, which takes the engine options
  (``nonfinite``, ``batch_elements``, ``chunk_elements``, ``split_work``, ``capturable``) by
  name and treats every other keyword as a SPECTRA setting;
* ``_init_state(group, p, state)`` creates the state buffers of ``p`` (``state["step"]`` is
  added and counted here; it is 1 during the first step);
* ``_direction(group, params, grads, states, out)`` updates the states and writes the base
  direction ``U`` of each parameter into ``out`` with ``torch._foreach_*`` ops (``grads`` are
  the possibly pre-clipped gradients; never modify them). Under FSDP2 ``grads``, ``out`` and
  the state tensors are local shards, while ``params`` are the ``DTensor`` parameters: a
  direction that is not elementwise (MARS's norm) combines the shards through
  :func:`spectra.optim.distributed.frobenius_norms`;
* optionally ``_check_group(group)`` validates the base hyperparameters, and
  ``_param_rules(group, p)`` returns a per-parameter ``(lr_scale, weight_decay)`` (MARS uses
  it for its 1-D AdamW); :meth:`SpectraOptimizer.param_plan` applies it.

:class:`~spectra.optim.Spectra` is the same class with the wrapped optimizer as its direction.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from spectra.optim.chain import all_finite, finite_flag, matrix_shape, spectra_step
from spectra.optim.distributed import (
    check_layout,
    is_sharded,
    local,
    shard_group,
    split_group,
)
from spectra.optim.plan import ParamPlan
from spectra.optim.replicated import check_replicated
from spectra.optim.settings import (
    LAYOUT_KEYS,
    SPECTRA_DEFAULTS,
    adaptive_pre,
    check_layout_settings,
    check_spectra_settings,
    clip_threshold,
    describe_schedules,
    keep_schedules,
    plan,
    pre_clip_ema_init,
    pre_clips,
    schedules_of,
)
from spectra.validate import (
    add_checked_group,
    check_choice,
    check_int,
    check_params_argument,
    warn_misspelt_keys,
)

NONFINITE_POLICIES = ("raise", "skip")
#: Keyword options of every constructor that set how a step runs rather than its math.
ENGINE_OPTIONS = ("nonfinite", "batch_elements", "chunk_elements", "split_work", "capturable")
#: Keys torch.optim.Optimizer.__setstate__ adds to ``defaults`` for its own optimizers.
TORCH_BOOKKEEPING = ("differentiable",)

#: ``[(group, params with a gradient)]`` for one step.
Work = list[tuple[dict[str, Any], list[Tensor]]]


class NonFiniteError(FloatingPointError):
    """What ``step()`` raises under ``nonfinite="raise"`` for inf or nan in a gradient or in an
    update direction.

    Its message is one line: the optimizer, the 1-based ``step``, what held inf or nan, what the
    step changed, and the ``nonfinite='skip'`` option. ``fact`` is that line without the option,
    for a caller that words its own advice.
    """

    def __init__(self, fact: str, step: int) -> None:
        super().__init__(f"{fact}; pass nonfinite='skip' to skip such steps instead of raising")
        self.fact = fact
        self.step = step

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.fact, self.step)


def step_counter(value: float = 0.0, device: torch.device | None = None) -> Tensor:
    """A step count as torch's optimizers keep it: a float32 0-d tensor, on the CPU (or, for a
    capturable step, on the parameter's ``device``)."""
    return torch.tensor(float(value), dtype=torch.float32, device=device)


def read_counts(counters: list[Tensor]) -> list[float]:
    """The values of 0-d step counts: one read where they share a device (the CPU, without
    ``capturable``), else one a count."""
    if len({t.device for t in counters}) == 1:
        return torch.stack(counters).tolist()
    return [t.item() for t in counters]


class SpectraOptimizer(Optimizer):
    """Base class: a base direction (supplied by the subclass) inside the SPECTRA chain.

    Args:
        params: parameters or param groups.
        defaults: the base optimizer's hyperparameters; the SPECTRA settings are merged in
            (see :data:`spectra.optim.settings.SPECTRA_DEFAULTS`).
        nonfinite: ``"raise"`` (the default without ``capturable``) raises
            ``FloatingPointError`` when a gradient or a base direction holds inf/nan, before
            any parameter changes; ``"skip"`` leaves the
            parameters untouched for that step, warns and counts it in
            ``num_skipped_steps``. Under ``"skip"`` a non-finite gradient also leaves the state
            untouched, at the cost of a host read of its own before the state changes; under
            ``"raise"`` in one process the gradients' check is read with the step's one host
            read, after the base optimizer updated its state. A non-finite direction is
            always found after the state was updated. Under ``capturable`` (where it defaults
            to ``"skip"``, and ``"raise"`` is refused) the check stays on the device: the
            parameters do not move on such a step, the state has taken it, no warning is
            given, and ``num_skipped_steps`` is a 0-d tensor on the parameters' device.
        batch_elements: at most this many elements (or one matrix, if larger) go through a
            spectral operator at once, bounding the step's transient memory; ``None``
            (default) is 1/32 of all the step's clipped matrices.
        chunk_elements: run the step over consecutive chunks of parameters of at most this many
            elements (one parameter, if larger), so that the step's direction buffers hold one
            chunk instead of every parameter: the transient memory of torch's per-parameter
            AdamW rather than of its foreach one. ``None`` (default) forms every direction
            before any weight moves, so that a non-finite direction leaves all weights
            untouched; with chunks, it stops the step before its own chunk moves, after the
            earlier chunks were applied.
        split_work: under ``torch.distributed`` with replicated parameters (DDP), divide the
            spectral operators among the ranks: each matrix is clipped by one rank and the
            results are broadcast (:mod:`spectra.optim.distributed`). On by default when a
            process group with more than one rank is initialised; the first step checks that
            the parameters agree across ranks. ``DTensor`` parameters (FSDP2) are always
            assembled and clipped by one owner rank each, whatever this setting.
        capturable: a step that reads nothing back to the host, as ``capturable=True`` in
            torch's optimizers: ``torch.compile(opt.step, fullgraph=True)`` takes it whole and
            CUDA graphs can capture it. The step counts live on the parameters' device, a
            tensor ``lr`` (on that device) is read live on every step, the spectral operators
            run without host reads (methods ``"polar"``, ``"mixed"``, ``"paper"``, ``"muon"``,
            ``"polar_express"``; ``"auto"`` picks one: see :func:`spectra.ops.soft_clip`), and
            inf/nan is handled on the device (``nonfinite``). Clip schedules, the adaptive
            pre-clip and ``hard_clip`` are refused (they need the host), and so are
            ``DTensor`` parameters; in a process group each rank clips every matrix itself.
        **spectra: SPECTRA settings (see :mod:`spectra.optim.settings`); any other keyword is
            refused with a ``ValueError`` that names it.
    """

    def __init__(
        self,
        params: Any,
        defaults: dict[str, Any],
        /,
        *,
        nonfinite: str | None = None,
        batch_elements: int | None = None,
        chunk_elements: int | None = None,
        split_work: bool = True,
        capturable: bool = False,
        **spectra: Any,
    ) -> None:
        unknown = set(spectra) - set(SPECTRA_DEFAULTS)
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: unknown options {sorted(unknown)} (SPECTRA settings: "
                f"{', '.join(SPECTRA_DEFAULTS)}; engine options: {', '.join(ENGINE_OPTIONS)})"
            )
        capturable = check_choice("capturable", capturable, (True, False))
        if capturable and not self._capturable_directions:
            raise ValueError(f"{type(self).__name__} has no capturable step (capturable=True)")
        if capturable and nonfinite == "raise":
            raise ValueError(
                "nonfinite='raise' needs a host read, which capturable=True leaves out: under "
                "capturable a step with inf or nan is skipped on the device (nonfinite='skip', "
                "its default)"
            )
        if nonfinite is None:
            nonfinite = "skip" if capturable else "raise"
        defaults = {
            **defaults,
            **SPECTRA_DEFAULTS,
            **spectra,
            "capturable": capturable,
            "nonfinite": check_choice("nonfinite", nonfinite, NONFINITE_POLICIES),
            "batch_elements": check_int("batch_elements", batch_elements, low=1, none_ok=True),
            "chunk_elements": check_int("chunk_elements", chunk_elements, low=1, none_ok=True),
            "split_work": check_choice("split_work", split_work, (True, False)),
        }
        # Hyperparameters are checked before the parameters are looked at.
        check_spectra_settings(defaults)
        self._check_group(defaults)
        check_params_argument(params, type(self).__name__)
        self.num_skipped_steps = 0
        self._replication_checked = False
        super().__init__(params, defaults)
        if capturable:  # a 0-d count on the parameters' device, which a traced step adds to
            first = self.param_groups[0]["params"][0]
            self.num_skipped_steps = torch.zeros((), dtype=torch.int64, device=first.device)

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
        """Update the states and write the base direction ``U`` of each parameter into ``out``."""
        raise NotImplementedError(f"{type(self).__name__} must implement _direction")

    def _param_rules(self, group: dict[str, Any], p: Tensor) -> tuple[float, float]:
        """``(lr_scale, weight_decay)`` for one parameter; default ``(1, group weight_decay)``."""
        return 1.0, float(group.get("weight_decay", 0.0))

    # -- a parameter's plan -------------------------------------------------------------

    def param_plan(self, group: dict[str, Any], p: Tensor, step: int) -> ParamPlan:
        """The chain's links for parameter ``p`` of ``group`` at its 0-based ``step``.

        η is the group's ``lr`` and λ its ``weight_decay``, both as this optimizer's
        per-parameter rules set them (MARS's 1-D AdamW: ``lr_1d_factor·lr`` and
        ``weight_decay_1d``); α and the pre and post operators with their thresholds ``c_k``
        follow the group's SPECTRA settings (:func:`spectra.optim.settings.plan`). A step
        uses exactly this plan, so it also tells an observer what the next step will do.
        """
        lr_scale, weight_decay = self._param_rules(group, p)
        state = self.state.get(p)
        return plan(group, p, step, lr_scale=lr_scale, weight_decay=weight_decay, state=state)

    # -- the step -----------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Perform one SPECTRA step; ``closure`` (re-evaluating the loss) is called once."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = self._work()
        params = [p for _, ps in work for p in ps]
        if not params:
            return loss
        if self.defaults["capturable"]:
            self._capturable_step(work, params)
            return loss
        grads = [local(p.grad) for p in params]
        group = split_group(params, self.defaults["split_work"])
        sharded = shard_group(params)
        # One host read per step: under nonfinite="raise" in one process without pre-clipping
        # (whose operators need finite gradients), the gradients' finite check is read with
        # the chain's (the state takes the step before it raises).
        pre = any(pre_clips(g) for g, _ in work)
        single = group is None and sharded is None
        fold = self.defaults["nonfinite"] == "raise" and single and not pre
        # Where every non-finite gradient entry makes its direction entry non-finite, the
        # directions' check of an unchunked step covers the gradients': their own check then
        # runs only to word the error.
        covered = fold and self._directions_keep_nonfinite and self._chunk_elements(params) is None
        grads_finite = finite_flag(grads) if fold and not covered else None
        if grads_finite is None and not covered and not all_finite(grads, sharded):
            self._nonfinite(params, "a gradient", "no parameter or optimizer state was changed")
            return loss
        if group is not None and not self._replication_checked:
            check_replicated(params, group)
            self._replication_checked = True
        plans = self._plans(work)
        chunks_seen = []  # the first index of each chunk the direction link was asked for

        def directions(idx: list[int], g: list[Tensor]) -> list[Tensor]:
            chunks_seen.append(idx[0])
            return self._directions(work, idx, g)

        stepped = spectra_step(
            [local(p) for p in params],
            grads,
            plans,
            directions,
            chunk_elements=self._chunk_elements(params),
            batch_elements=self.defaults["batch_elements"],
            group=group,
            finite=grads_finite,
        )
        if not stepped:
            gradient = (grads_finite is not None and not bool(grads_finite)) or (
                covered and not all_finite(grads)
            )
            self._stopped(params, gradient, applied=len(chunks_seen) > 1)
        return loss

    def _capturable_step(self, work: Work, params: list[Tensor]) -> None:
        """The step with ``capturable``: the chain with its finite check on the device."""
        for i, p in enumerate(params):
            if is_sharded(p):
                raise ValueError(
                    f"{type(self).__name__}(capturable=True) takes no DTensor parameters: "
                    f"parameter {i} (shape {tuple(p.shape)}) is one; its whole matrix is "
                    "assembled across ranks"
                )
        grads = [p.grad for p in params]
        moved = spectra_step(
            params,
            grads,
            self._plans(work),
            lambda idx, g: self._directions(work, idx, g),
            chunk_elements=self._chunk_elements(params),
            batch_elements=self.defaults["batch_elements"],
            capturable=True,
        )
        skipped = self.num_skipped_steps
        if not torch.is_tensor(skipped) or skipped.device != moved.device:
            # (a count restored as an int): a traced step only adds in place, since torch
            # 2.11's torch.compile cannot set an attribute of the optimizer
            skipped = torch.full((), int(skipped), dtype=torch.int64, device=moved.device)
            self.num_skipped_steps = skipped
        skipped.add_((~moved).to(torch.int64))

    def _stopped(self, params: list[Tensor], gradient: bool, applied: bool) -> None:
        """Word a step that the chain stopped: ``gradient``, whether a gradient (rather than a
        direction) held inf or nan; ``applied``, whether earlier chunks were applied."""
        state = "the optimizer state was updated"
        if gradient:  # read with the chain's check, after the state took the step
            what, state = "a gradient", f"{state} with it"
        else:
            what = "an update direction (from finite gradients)"
        if applied:
            moved = f"the parameters of the earlier chunks were changed and {state}"
        else:
            moved = f"no parameter was changed, but {state}"
        self._nonfinite(params, what, moved, counted=True)

    #: Whether the direction link accepts sparse gradients (the wrapper's base may).
    _sparse_directions = False
    #: Whether ``_direction`` takes the step count as a 0-d device tensor (``capturable``).
    _capturable_directions = False
    #: Whether a non-finite gradient entry always gives a non-finite direction entry (moments
    #: that take ``g`` and ``g²`` with positive weights and a ratio of them: AdamW, AdEMAMix,
    #: MARS, SGD-M; not a sign), so that the directions' finite check also checks the
    #: gradients (tested in tests/test_nonfinite.py).
    _directions_keep_nonfinite = False

    def _work(self) -> Work:
        work = []
        for g, group in enumerate(self.param_groups):
            params = [p for p in group["params"] if p.grad is not None]
            for i, p in enumerate(params):
                if p.grad.is_sparse:
                    self._check_sparse(group, g, i, p)
                if is_sharded(p):
                    check_layout(p, f"parameter {i} of group {g}")
                    if adaptive_pre(group, p):
                        raise ValueError(
                            f"{type(self).__name__}: adaptive pre-clipping (pre_clip_kappa) "
                            f"takes whole matrices; parameter {i} of group {g} (shape "
                            f"{tuple(p.shape)}) is a DTensor shard"
                        )
            if params:
                work.append((group, params))
        return work

    def _check_sparse(self, group: dict[str, Any], g: int, i: int, p: Tensor) -> None:
        where = f"parameter {i} of group {g} (shape {tuple(p.shape)}) has a sparse gradient"
        # RuntimeError, as torch's optimizers raise for a sparse gradient they cannot take
        if not self._sparse_directions:
            raise RuntimeError(
                f"{type(self).__name__} does not support sparse gradients: {where}; use "
                "spectra.Spectra around an optimizer that does (e.g. torch.optim.SGD)"
            )
        if pre_clips(group) and matrix_shape(p, True) is not None:
            raise RuntimeError(f"pre-clipping needs dense gradients: {where}")

    def _plans(self, work: Work) -> list[ParamPlan]:
        """Count the step in every state (creating it first) and plan each parameter."""
        counters = []
        for group, params in work:
            for p in params:
                state = self.state[p]
                device = p.device if group["capturable"] else None
                if len(state) == 0:
                    state["step"] = step_counter(device=device)
                    self._init_state(group, p, state)
                if not torch.is_tensor(state["step"]):  # a state saved with a plain int
                    state["step"] = step_counter(state["step"], device)
                if adaptive_pre(group, p):
                    # a float, which load_state_dict keeps as saved (it casts tensors)
                    state.setdefault("pre_clip_ema", pre_clip_ema_init(group, p))
                counters.append(state["step"])
        # float32 0-d tensors, as torch's optimizers keep them: one multi-tensor add for all
        torch._foreach_add_(counters, 1)
        # capturable: the counts stay on the device; no schedule reads them (refused)
        steps = iter(() if self.defaults["capturable"] else read_counts(counters))
        return [
            self.param_plan(group, p, 0 if group["capturable"] else int(next(steps)) - 1)
            for group, params in work
            for p in params
        ]

    def _chunk_elements(self, params: list[Tensor]) -> int | None:
        """The chain's chunk budget: ``chunk_elements`` (``None``: all at once, so that a
        non-finite direction is found before any weight moves)."""
        return self.defaults["chunk_elements"]

    def _directions(self, work: Work, idx: list[int], grads: list[Tensor]) -> list[Tensor]:
        """The chain's direction link: ``_direction`` for each group's share of ``idx``."""
        # groups by position: a traced step (torch.compile) compares ints, not dicts
        where = [(g, p) for g, (_, params) in enumerate(work) for p in params]
        out: list[Tensor] = []
        start = 0
        while start < len(idx):
            g = where[idx[start]][0]
            group = work[g][0]
            end = start
            while end < len(idx) and where[idx[end]][0] == g:
                end += 1
            params = [where[i][1] for i in idx[start:end]]
            # The math acts on local shards (the state stays DTensor for checkpoints) and sees
            # the step count as an int (a 0-d device tensor under capturable).
            counters = [self.state[p]["step"] for p in params]
            counts = counters if group["capturable"] else map(int, read_counts(counters))
            states = [
                {**{k: local(v) for k, v in self.state[p].items()}, "step": n}
                for p, n in zip(params, counts, strict=True)
            ]
            # Contiguous, so that the spectral links can view each as its (m, n) matrix.
            bufs = [
                torch.empty_like(local(p), memory_format=torch.contiguous_format) for p in params
            ]
            self._direction(group, params, grads[start:end], states, bufs)
            out += bufs
            start = end
        return out

    def _nonfinite(
        self, params: list[Tensor], what: str, consequence: str, counted: bool = False
    ) -> None:
        """Raise :class:`NonFiniteError` or, under ``nonfinite="skip"``, warn and count.

        ``counted``: whether the step counters already took this step (``_plans``).
        """
        steps = [int(s["step"]) for s in map(self.state.get, params) if s and "step" in s]
        step = max(steps, default=0) + (0 if counted else 1)
        fact = f"{type(self).__name__}.step() at step {step}: {what} contains inf or nan"
        if self.defaults["nonfinite"] == "raise":
            raise NonFiniteError(f"{fact}; {consequence}", step)
        self.num_skipped_steps += 1
        warnings.warn(f"{fact}; step skipped: {consequence}", RuntimeWarning, stacklevel=3)

    # -- observation --------------------------------------------------------------------

    def clip_threshold(self, step: int | None = None, group: int | None = None) -> float | None:
        """c_k: the post-clipping threshold of a group at 0-based ``step``.

        ``group`` is an index into ``param_groups`` (``None``: the first group that clips);
        ``step=None`` is the step about to be taken. ``None`` when the group does not clip
        (or, for ``group=None``, when none does); ``inf`` when the schedule turns the clip off
        at that step.
        """
        groups = self.param_groups if group is None else [self.param_groups[group]]
        return clip_threshold(groups, self.state, step)

    # -- torch.optim.Optimizer plumbing --------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``; a group that fails a check is not added."""
        owner = type(self).__name__

        def check(group: dict[str, Any]) -> None:
            if group["capturable"] != self.defaults["capturable"]:
                raise ValueError(
                    f"capturable={group['capturable']!r} in a param group: it is set for the "
                    f"whole optimizer (capturable={self.defaults['capturable']!r})"
                )
            check_spectra_settings(group)
            self._check_group(group)
            lr, params = group["lr"], group["params"]
            if group["capturable"] and torch.is_tensor(lr) and params:
                devices = {p.device for p in params}
                if lr.device not in devices:
                    raise ValueError(
                        f"a tensor lr must be on the parameters' device for capturable=True "
                        f"({', '.join(map(str, devices))}), got one on {lr.device}"
                    )

        group = add_checked_group(
            self.param_groups, param_group, owner, super().add_param_group, check
        )
        warn_misspelt_keys(group, self.defaults, owner)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("num_skipped_steps", 0)
        self.__dict__.setdefault("_replication_checked", False)
        # Groups saved without some settings (e.g. by torch.optim.AdamW) take the defaults;
        # the bookkeeping keys torch's __setstate__ adds to the defaults stay out of them.
        for group in self.param_groups:
            for key, value in self.defaults.items():
                if key not in TORCH_BOOKKEEPING:
                    group.setdefault(key, value)

    def state_dict(self) -> dict[str, Any]:
        """torch's ``state_dict``; each clip schedule is saved as its ``repr`` (see
        :func:`~spectra.optim.settings.describe_schedules`)."""
        sd = super().state_dict()
        describe_schedules(sd["param_groups"])
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``load_state_dict``, keeping the clip schedules the optimizer was built with.

        A state this optimizer cannot step on is refused with a ``ValueError`` before anything
        is loaded: one saved by another optimizer (a buffer this one keeps is missing; torch's
        AdamW keeps AdamW's) or for other parameters (a buffer's shape differs).
        """
        self._check_loaded_state(state_dict)
        built = schedules_of(self.param_groups)
        tensor_lrs = [torch.is_tensor(group["lr"]) for group in self.param_groups]
        super().load_state_dict(state_dict)
        keep_schedules(self.param_groups, built)
        for group, tensor_lr in zip(self.param_groups, tensor_lrs, strict=True):
            # capturable is set for the whole optimizer, as it was built
            group["capturable"] = self.defaults["capturable"]
            if tensor_lr and group["params"]:
                # the saved lr, as a tensor where the step reads it (on the device for a
                # capturable step), whatever the saved run kept
                lr, device = group["lr"], group["params"][0].device
                group["lr"] = (
                    lr.to(device)
                    if torch.is_tensor(lr)
                    else torch.tensor(float(lr), dtype=torch.float32, device=device)
                )

    def _check_loaded_state(self, state_dict: Any) -> None:
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
            got = f"keys {sorted(map(str, state_dict))}" if isinstance(state_dict, dict) else ""
            raise ValueError(
                f"{name} takes an optimizer's state_dict, a dict with 'state' and "
                f"'param_groups', got {got or type(state_dict).__name__}"
            )
        saved = state_dict["state"]
        # torch's load_state_dict refuses groups of other sizes; only matching ones are read
        pairs = list(zip(state_dict["param_groups"], self.param_groups, strict=False))
        for g, (saved_group, group) in enumerate(pairs):
            # the loaded groups keep their saved layout: it must fit these parameters
            layout = {k: saved_group[k] for k in LAYOUT_KEYS if k in saved_group}
            try:
                check_layout_settings({**group, **layout})
            except ValueError as err:
                raise ValueError(f"{name}: param group {g}: {err}") from None
            for i, (key, p) in enumerate(zip(saved_group["params"], group["params"], strict=False)):
                state = saved.get(key)
                if not state:
                    continue
                where = f"the saved state of parameter {i} of group {g} (shape {tuple(p.shape)})"
                probe: dict[str, Any] = {}  # the buffers this optimizer would create, on meta
                self._init_state(group, torch.empty(p.shape, dtype=p.dtype, device="meta"), probe)
                missing = sorted({"step", *probe} - set(state))
                if missing:
                    raise ValueError(
                        f"{name}: {where} has no {', '.join(map(repr, missing))} (it holds "
                        f"{', '.join(map(repr, sorted(state)))}): it was saved by another optimizer"
                    )
                for k, v in state.items():
                    plain = torch.is_tensor(v) and not is_sharded(v) and not is_sharded(p)
                    if plain and v.dim() > 0 and v.shape != p.shape:
                        raise ValueError(
                            f"{name}: {where} has {k!r} of shape {tuple(v.shape)}: it was saved "
                            "for other parameters"
                        )
