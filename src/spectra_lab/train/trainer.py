"""The training loop: one file to read top to bottom.

:func:`train` checks the config and the run directory (``resume.py``), then builds the
pieces: the runtime (rank, device), the prepared dataset (with the windows and the memory the
run needs checked against it: ``sizes.py``), and in :func:`build_run` the model and its data
(``build.py``), the model's wrapping for several ranks (``parallel.py``), the optimizer, the LR
schedule and the state to resume from (``resume.py``). Then :func:`train_loop`, whose body is
a step (:func:`one_step`):

1. forward and backward over ``grad_accum`` micro-batches (averaged gradients);
2. global gradient-norm clipping of the raw gradient;
3. ``optimizer.step()``: for the SPECTRA optimizers, optional pre-clipping of the
   gradient, the base update and its spectral clipping (Algorithm "SPECTRA" of
   "Enhancing LLM Training via Spectral Clipping"), with the threshold ``c_k`` the
   optimizer computes from its clip schedule;
4. the LR scheduler's step, ``η_k = η · S_lr(k)`` (WSD or cosine, with linear warmup);

then the step's metrics, an evaluation (``evaluate.py``) and a checkpoint when they are due.
The step's loss and gradient norm stay on the device until a report is due (every
``log_interval`` steps, before an evaluation or a checkpoint, at the last step, and at every
step when ``train(on_step=...)`` asks for the records): one host synchronisation then reads
them all, as nanoGPT and torchtitan do, so that the host keeps queuing kernels while the GPU
runs the ones before them. Each record holds the throughput, the MFU and the peak memory
(``throughput.py``). With ``monitor_every > 0`` a ``spectra.SpectralMonitor`` reads the
gradients before step 3 and the weights after it (records of kind "monitor");
``train(watch=...)`` adds other observers with the same two calls (``spectra analyze``).
A checkpoint is the ``state_dict`` of each component (model, optimizer, LR schedule,
data-sampler position, RNG states; see ``runs/checkpoint.py``); ``metrics.RunLog`` writes the
run directory's other files. SIGINT and SIGTERM stop the loop at a step boundary with a
checkpoint (``signals.py``); an inf or nan loss ends it with one line naming the step. Under
``torchrun`` every rank draws its own slice of each global batch, and only rank 0 writes files
(FSDP2 checkpoints: every rank writes its shards through ``torch.distributed.checkpoint``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from spectra import SpectralMonitor
from spectra.ops import soft_clip_method
from spectra.optim import compile_step
from spectra.optim.base import NonFiniteError
from spectra_lab.errors import UserError
from spectra_lab.machine import device_about
from spectra_lab.model.flops import flops_per_token
from spectra_lab.runs.checkpoint import (
    PerRank,
    ShardedModel,
    ShardedOptimizer,
    checkpoint_path,
    prune_checkpoints,
    save_components,
    save_sharded_components,
)
from spectra_lab.train.build import (
    build_data,
    build_model,
    build_monitor,
    model_config_of,
    prepared_dataset,
)
from spectra_lab.train.config import TrainConfig
from spectra_lab.train.evaluate import evaluate
from spectra_lab.train.loggers import check_loggers
from spectra_lab.train.metrics import RunLog, perplexity
from spectra_lab.train.optimizers import build_optimizer, check_optimizer, clip_threshold
from spectra_lab.train.parallel import clip_grad_norm, full, gradient_sync, wrap_model
from spectra_lab.train.resume import check_start, start_or_resume
from spectra_lab.train.rng import RNGState
from spectra_lab.train.runtime import Runtime, build_runtime
from spectra_lab.train.schedule import LRSchedule, build_lr_lambda
from spectra_lab.train.signals import Interrupted, StopSignals
from spectra_lab.train.sizes import check_sizes
from spectra_lab.train.throughput import Timer, peak_flops, peak_memory_gb, rates

OnStep = Callable[[int, dict[str, Any]], None]


@dataclass
class RunContext:
    """The pieces of a run that an observer of its steps may read (see :func:`train`)."""

    cfg: TrainConfig
    model: nn.Module  # the model itself (not its DDP or compiled wrapper)
    optimizer: torch.optim.Optimizer
    runtime: Runtime
    dataset_dir: Path
    seq_len: int
    start: int  # the step the loop starts from (the checkpoint's, on resume)


#: ``watch(ctx)`` builds an observer with ``before_step()`` and ``after_step() -> dict``
#: (``SpectralMonitor``'s two calls), called around every optimizer step
Watch = Callable[[RunContext], Any]


@dataclass
class TrainResult:
    """What a finished (or resumed-and-finished) run reports."""

    run_dir: Path
    step: int
    tokens: int
    val_loss: float | None
    val_ppl: float | None
    model: nn.Module
    rank: int = 0


class Diverged(UserError):
    """The loss or the optimizer's update became inf or nan (one line: the step, what to try)."""


@dataclass
class Run:
    """Everything :func:`build_run` sets up and the loop uses."""

    ctx: RunContext
    forward: nn.Module  # what the loop calls: the model, compiled and/or in DDP
    scheduler: LRSchedule
    sampler: Any
    val: Any
    components: dict[str, Any]  # what a checkpoint holds
    params: list[nn.Parameter]  # those with gradients, for their global norm
    tokens: int  # tokens seen before ``ctx.start``
    monitor: SpectralMonitor | None
    observer: Any
    tokens_per_step: int
    flops: float  # per token
    peak: float | None  # the device's peak FLOP/s, for the MFU
    about: dict[str, Any]  # run.json
    optimizer_step: Callable[[], Any]  # optimizer.step, compiled whole under compile+capturable

    @property
    def cfg(self) -> TrainConfig:
        return self.ctx.cfg

    @property
    def rt(self) -> Runtime:
        return self.ctx.runtime


def train(
    cfg: TrainConfig, on_step: OnStep | None = None, watch: Watch | None = None
) -> TrainResult:
    """Train ``cfg`` from scratch, or from its run directory's latest checkpoint.

    ``on_step(step, record)`` is called on every rank after each optimizer step, with
    the step count so far and the step's metrics; raising from it stops training at once
    (no checkpoint is written). Given, it makes the loop read the step's loss and gradient
    norm from the device at every step.

    ``watch(ctx)``, called on every rank once the optimizer is built (``ctx``: a
    :class:`RunContext`), returns an observer whose ``before_step()`` runs after gradient
    clipping and before ``optimizer.step()``, and whose ``after_step()`` runs right after it;
    its time is the train record's ``t_analysis``. It must leave the weights, gradients and
    RNG states alone for the run to stay what it would be without it.

    SIGINT and SIGTERM stop the run at the next step boundary with a checkpoint there
    (:class:`~spectra_lab.train.signals.Interrupted`); an inf or nan loss or update ends it
    with :class:`Diverged`.
    """
    # The run directory records the warmup in force, so that a resumed run keeps it.
    cfg = dataclasses.replace(cfg, warmup_steps=cfg.warmup)
    lr_lambda = build_lr_lambda(cfg)  # these check their settings before anything runs
    check_optimizer(cfg)
    check_loggers(cfg)
    model_config_of(cfg, vocab_size=1)  # the shape and μP fields (the vocabulary comes later)
    check_start(cfg)  # the run directory: writable, free for a new run, or one to resume
    try:
        rt = build_runtime(cfg)
        # The run directory records the accumulation in force for this world size.
        cfg = dataclasses.replace(cfg, grad_accum=cfg.accumulation(rt.dp_size))
        dataset_dir = prepared_dataset(cfg, rt)  # the one call into data preparation
        check_sizes(cfg, rt, dataset_dir, lr_lambda)  # windows and memory, on this device
        run = build_run(cfg, rt, dataset_dir, lr_lambda, watch)
        with (
            RunLog(Path(cfg.out_dir), cfg, rt, run.ctx.start, run.about) as log,
            StopSignals() as stop,
        ):
            return train_loop(run, log, stop, on_step)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def build_run(
    cfg: TrainConfig,
    rt: Runtime,
    dataset_dir: Path,
    lr_lambda: Callable[[int], float],
    watch: Watch | None,
) -> Run:
    """The model, its optimizer, schedule and data, resumed from the latest checkpoint when
    asked, and the monitor and observer that watch its steps."""
    meta = json.loads((dataset_dir / "meta.json").read_text())
    model, model_cfg = build_model(cfg, int(meta["vocab_size"]))
    model.to(rt.device)
    # Before the optimizer: FSDP2 replaces the parameters by sharded ones.
    forward = wrap_model(model, cfg, rt)
    torch.manual_seed(cfg.seed + rt.rank)
    sampler, val = build_data(cfg, rt, dataset_dir, model_cfg.seq_len)
    optimizer = build_optimizer(model, cfg, lr_lambda)
    scheduler = LRSchedule(optimizer, lr_lambda)
    sharded = cfg.parallel != "ddp"  # model and optimizer saved shard by shard (DCP)
    components = {
        "model": ShardedModel(model) if sharded else model,
        "optimizer": ShardedOptimizer(model, optimizer) if sharded else optimizer,
        "lr_scheduler": scheduler,
        "sampler": PerRank(sampler, rt.rank, rt.gather, shared=True),
        "rng": PerRank(RNGState(rt.device), rt.rank, rt.gather),
    }
    start, tokens = start_or_resume(Path(cfg.out_dir), cfg, rt, components)
    ctx = RunContext(cfg, model, optimizer, rt, dataset_dir, model_cfg.seq_len, start)
    tokens_per_step = cfg.batch_size * cfg.grad_accum * model_cfg.seq_len * rt.dp_size
    peak = peak_flops(rt.device, rt.autocast_dtype, cfg.peak_tflops)
    about = {  # run.json
        "world_size": rt.world_size,
        "parallel": cfg.parallel,
        "device": str(rt.device),
        "autocast": str(rt.autocast_dtype).removeprefix("torch.") if rt.autocast_dtype else None,
        "torch": torch.__version__,
        "machine": device_about(rt.device),  # the CPU's model or the GPU's name, the commit
        # what a soft clip by "auto" runs for float32 matrices here (machine-dependent: "mixed"
        # on CUDA and on CPUs with bf16 units, "eigh" on other CPUs)
        "soft_clip_auto": soft_clip_method("auto", rt.device, torch.float32),
        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "tokens_per_step": tokens_per_step,
        "flops_per_token": flops_per_token(model_cfg),
        "peak_tflops": peak / 1e12 if peak is not None else None,
        "started_at_step": start,
        "dataset_dir": str(dataset_dir),
        "model_config": dataclasses.asdict(model_cfg),
    }
    return Run(
        ctx=ctx,
        forward=forward,
        scheduler=scheduler,
        sampler=sampler,
        val=val,
        components=components,
        params=[p for p in model.parameters() if p.requires_grad],
        tokens=tokens,
        monitor=build_monitor(cfg, model, optimizer, start),
        observer=watch(ctx) if watch is not None else None,
        tokens_per_step=tokens_per_step,
        flops=about["flops_per_token"],
        peak=peak,
        about=about,
        optimizer_step=compiled_step(optimizer, cfg),
    )


def compiled_step(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> Callable[[], Any]:
    """``optimizer.step``, or with ``--compile`` and a capturable optimizer (``optimizer_kwargs:
    {capturable: true}``) the step compiled whole (:func:`spectra.optim.compile_step`): it reads
    nothing on the host, and its lr tensors keep one graph for every lr."""
    if not (cfg.compile and optimizer.defaults.get("capturable")):
        return optimizer.step
    return compile_step(optimizer)


def train_loop(run: Run, log: RunLog, stop: StopSignals, on_step: OnStep | None) -> TrainResult:
    """Steps ``start .. steps``: each one, its records, an evaluation and a checkpoint when due."""
    cfg, rt, ctx = run.cfg, run.rt, run.ctx
    tokens, val_loss = run.tokens, None
    pending: list[Pending] = []  # the steps since the last report
    ctx.model.train()
    for step in range(ctx.start, cfg.steps):
        done, tokens = step + 1, tokens + run.tokens_per_step
        try:
            record, spectral, timer = one_step(run)
        except FloatingPointError as exc:  # the optimizer's nonfinite="raise"
            report(pending, log, on_step, cfg)  # the steps before it, and a nan loss first
            raise Diverged(diverged(cfg, exc, done)) from None
        pending.append(Pending({"step": done, "tokens": tokens, **record}, spectral))

        reporting = on_step is not None or done % cfg.log_interval == 0 or done == cfg.steps
        evaluate_now = done % cfg.eval_interval == 0 or done == cfg.steps
        save_now = done == cfg.steps or (
            cfg.checkpoint_interval > 0 and done % cfg.checkpoint_interval == 0
        )
        if reporting or evaluate_now or save_now:
            report(pending, log, on_step, cfg)
        # Several ranks agree on rank 0's view, where they report (a collective).
        signum = None
        if reporting or not rt.distributed:
            signum = stop.requested(rt.broadcast if rt.distributed else None)
        if signum is not None:
            report(pending, log, on_step, cfg)
        if evaluate_now:
            with timer("eval"):
                val_loss = evaluate(ctx.model, run.val, cfg, rt)
            log.eval(done, tokens, val_loss, timer.times["t_eval"])
        if save_now or signum is not None:
            path = save_checkpoint(run, done, tokens)
        if signum is not None:
            raise Interrupted(signum, done, path)

    if val_loss is None and ctx.start == cfg.steps:  # resumed a finished run
        val_loss = evaluate(ctx.model, run.val, cfg, rt)
    log.finish(tokens, val_loss, run.about["parameters"])
    val_ppl = perplexity(val_loss) if val_loss is not None else None
    return TrainResult(Path(cfg.out_dir), cfg.steps, tokens, val_loss, val_ppl, ctx.model, rt.rank)


def one_step(run: Run) -> tuple[dict[str, Any], dict[str, float], Timer]:
    """One optimizer step (the module docstring's 1-4); its record, with the loss and the
    gradient norm still on the device, the monitor's scalars, and the phases' timer."""
    cfg, rt, optimizer = run.cfg, run.rt, run.ctx.optimizer
    timer = Timer(rt.sync if cfg.sync_timing else None)
    with timer("step"):
        lr, clip_c = optimizer.param_groups[0]["lr"], clip_threshold(optimizer)
        if torch.is_tensor(lr):  # capturable: read with the loss, as it was before this step
            lr = lr.clone()
        loss = forward_backward(run.forward, run.sampler, cfg, rt, timer)
        with timer("grad_clip"):
            max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf
            grad_norm = clip_grad_norm(run.params, max_norm)
        around_step(run.monitor, run.observer, timer, "before_step")
        with timer("optimizer"):
            run.optimizer_step()
        spectral = around_step(run.monitor, run.observer, timer, "after_step")
        run.scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss, grad_norm = rt.mean(loss), full(grad_norm)  # still on the device
    record = {
        "loss": loss,  # the two tensors are read by report()
        "lr": lr,
        "clip_c": clip_c,
        "grad_norm": grad_norm,
        **timer.times,
        **rates(run.tokens_per_step, timer.times["t_step"], rt.world_size, run.flops, run.peak),
        "peak_mem_gb": peak_memory_gb(rt.device),
    }
    return record, spectral, timer


def forward_backward(
    forward: nn.Module, sampler: Any, cfg: TrainConfig, rt: Runtime, timer: Timer
) -> torch.Tensor:
    """Accumulate the gradient of ``grad_accum`` micro-batches; return their mean loss."""
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(cfg.grad_accum):
        with timer("data"):
            batch = sampler.next_batch()
            if rt.device.type == "cuda":  # pinned, the copy does not wait for the host
                batch = tuple(t.pin_memory() for t in batch)
            x, y = (t.to(rt.device, non_blocking=True) for t in batch)
        with gradient_sync(forward, last=micro == cfg.grad_accum - 1):
            with timer("forward"), rt.autocast():
                _, loss = forward(x, y)
            with timer("backward"):
                (loss / cfg.grad_accum).backward()
        loss_sum += loss.detach().float()
    return loss_sum / cfg.grad_accum


def around_step(monitor: Any, observer: Any, timer: Timer, call: str) -> dict[str, float]:
    """Run ``before_step`` or ``after_step`` of the monitor and the observer (each timed);
    return the monitor's scalars (``{}`` on unmonitored steps)."""
    out: dict[str, float] = {}
    if monitor is not None:
        with timer("monitor"):
            out = getattr(monitor, call)() or {}
    if observer is not None:
        with timer("analysis"):
            getattr(observer, call)()
    return out


@dataclass
class Pending:
    """A step's train record whose ``loss`` and ``grad_norm`` are still tensors on the device,
    and the spectral monitor's scalars of that step (already numbers)."""

    record: dict[str, Any]
    spectral: dict[str, float]


def report(pending: list[Pending], log: RunLog, on_step: OnStep | None, cfg: TrainConfig) -> None:
    """Read the pending steps' device scalars in one host synchronisation, then log each step's
    records and call ``on_step``, in step order; empty ``pending``.

    A non-finite loss ends the run with :class:`Diverged` naming its step, once the steps
    before it are logged.
    """
    if not pending:
        return
    # float64 holds every float32 value exactly, as .item() would give it; a tensor lr (a
    # capturable optimizer's) is read with them
    keys = ("loss", "grad_norm") + (("lr",) if torch.is_tensor(pending[0].record["lr"]) else ())
    scalars = torch.stack(
        [torch.stack([p.record[k].double().to(p.record["loss"].device) for k in keys])
         for p in pending]
    ).tolist()  # fmt: skip
    for p, values in zip(pending, scalars, strict=True):
        loss = values[0]
        if not math.isfinite(loss):
            log.advance(0)
            raise Diverged(diverged(cfg, f"the loss is {loss}", p.record["step"]))
        p.record.update(zip(keys, values, strict=True))
        log.train(p.record)
        log.monitor(p.record["step"], p.spectral)
        if on_step is not None:
            on_step(p.record["step"], p.record)
    log.advance(len(pending))
    pending.clear()


def save_checkpoint(run: Run, step: int, tokens: int) -> Path:
    """Every rank: checkpoint the run's components at ``step``; rank 0 writes and prunes.

    FSDP2: a directory, every rank writing its shards (see ``runs/checkpoint.py``).
    """
    cfg, rt = run.cfg, run.rt
    scalars = {  # spectra sample reads the last two
        "step": step,
        "tokens": tokens,
        "world_size": rt.world_size,
        "dp_size": rt.dp_size,
        "config": cfg.to_dict(),
        "model_config": run.about["model_config"],
        "dataset_dir": run.about["dataset_dir"],
    }
    sharded = cfg.parallel != "ddp"
    path = checkpoint_path(cfg.out_dir, step, sharded=sharded)
    if sharded:
        save_sharded_components(path, run.components, scalars, rt)
    else:
        save_components(path, run.components, scalars, write=rt.is_main)
    if rt.is_main:
        prune_checkpoints(cfg.out_dir, cfg.keep_checkpoints)
    rt.barrier()
    return path


def diverged(cfg: TrainConfig, what: str | FloatingPointError, step: int) -> str:
    """The one line of a diverged run: what happened at ``step``, and what to try.

    ``what`` is a non-finite loss, or the optimizer's error: a spectra optimizer's
    :class:`~spectra.optim.base.NonFiniteError` names its step and what the step changed, and
    the line words its ``nonfinite='skip'`` option as this command's flag. Skipping steps
    cannot save a run whose loss itself is inf or nan, so only the optimizer's error offers it.
    """
    tries = [f"a lower lr (now {cfg.lr:g}; --lr)"]
    if cfg.grad_clip is None:
        tries.append("gradient clipping (--set grad_clip=0.5)")
    if isinstance(what, NonFiniteError):
        what = what.fact
        tries.append("skipping such steps (--set optimizer_kwargs={nonfinite: skip})")
    elif isinstance(what, FloatingPointError):
        what = f"{str(what).splitlines()[0]} at step {step}"
    else:
        what = f"{what} at step {step}"
    hint = tries[0] if len(tries) == 1 else f"{', '.join(tries[:-1])} or {tries[-1]}"
    return f"the run diverged: {what}; try {hint}"
