"""The training loop: one file to read top to bottom.

:func:`train` checks the config, then builds the pieces: the runtime (rank, device), the
prepared dataset (the one call into ``spectra_lab.data`` that may prepare a corpus), and in
:func:`build_run` the model, the data sampler, the optimizer, the LR schedule and the
checkpointed state to resume from. Then :func:`train_loop`, whose body is a step
(:func:`one_step`):

1. forward and backward over ``grad_accum`` micro-batches (averaged gradients);
2. global gradient-norm clipping of the raw gradient;
3. ``optimizer.step()``: for the SPECTRA optimizers, optional pre-clipping of the
   gradient, the base update and its spectral clipping (Algorithm "SPECTRA" of
   "Enhancing LLM Training via Spectral Clipping"), with the threshold ``c_k`` the
   optimizer computes from its clip schedule;
4. the LR scheduler's step, ``η_k = η · S_lr(k)`` (WSD or cosine, with linear warmup);

then the step's metrics, an evaluation and a checkpoint when they are due. The step's loss and
gradient norm stay on the device until a report is due (every ``log_interval`` steps, before
an evaluation or a checkpoint, at the last step, and at every step when ``train(on_step=...)``
asks for the records): one host synchronisation then reads them all and the records of those
steps are written, as nanoGPT and torchtitan do, so that the host keeps queuing kernels while
the GPU runs the ones before them. Each record holds the throughput, the MFU and the peak memory
(``throughput.py``; the model's FLOPs per token come from ``spectra_lab.model.flops``).
With ``monitor_every > 0`` a ``spectra.SpectralMonitor`` reads the gradients before step 3 and
the weights after it (its scalars become records of kind "monitor"); ``train(watch=...)`` adds
other observers with the same two calls (``spectra analyze`` records spectra that way).
A checkpoint is the ``state_dict`` of each component (model, optimizer, LR schedule,
data-sampler position, RNG states); see ``runs/checkpoint.py``. The run directory's other
files are written by ``metrics.RunLog``. SIGINT and SIGTERM stop the loop at a step boundary
with a checkpoint (``signals.py``); an inf or nan loss ends it with one line naming the step.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) the model is wrapped in DDP (gloo on
CPU, NCCL on CUDA; see ``runtime.py``), or with ``parallel="fsdp2"`` sharded in place by
FSDP2 (``fully_shard`` on each block, then on the whole model); every rank draws its own
slice of each global batch, and only rank 0 writes files (FSDP2 checkpoints: every rank
writes its shards through ``torch.distributed.checkpoint``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from spectra import SpectralMonitor
from spectra.ops import soft_clip_method
from spectra_lab.data import training_dataset
from spectra_lab.errors import UserError
from spectra_lab.model.flops import flops_per_token
from spectra_lab.runs.checkpoint import (
    CheckpointError,
    PerRank,
    ShardedModel,
    ShardedOptimizer,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_components,
    prune_checkpoints,
    save_components,
    save_sharded_components,
)
from spectra_lab.runs.layout import clear_run
from spectra_lab.train.config import ConfigError, TrainConfig, fixed_on_resume
from spectra_lab.train.loggers import check_loggers
from spectra_lab.train.metrics import RunLog, perplexity
from spectra_lab.train.optimizers import (
    build_optimizer,
    check_optimizer,
    clip_threshold,
    group_of,
)
from spectra_lab.train.rng import RNGState
from spectra_lab.train.runtime import Runtime, build_runtime
from spectra_lab.train.schedule import LRSchedule, build_lr_lambda
from spectra_lab.train.signals import Interrupted, StopSignals
from spectra_lab.train.throughput import peak_flops, peak_memory_gb, rates

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
    try:
        rt = build_runtime(cfg)
        # The run directory records the accumulation in force for this world size.
        cfg = dataclasses.replace(cfg, grad_accum=cfg.accumulation(rt.dp_size))
        dataset_dir = prepared_dataset(cfg, rt)  # the one call into data preparation
        run = build_run(cfg, rt, dataset_dir, lr_lambda, watch)
        with (
            RunLog(Path(cfg.out_dir), cfg, rt, run.ctx.start, run.about) as log,
            StopSignals() as stop,
        ):
            return train_loop(run, log, stop, on_step)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


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
            raise Diverged(diverged(cfg, f"{str(exc).splitlines()[0]} at step {done}")) from None
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
        loss = forward_backward(run.forward, run.sampler, cfg, rt, timer)
        with timer("grad_clip"):
            max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf
            grad_norm = clip_grad_norm(run.params, max_norm)
        around_step(run.monitor, run.observer, timer, "before_step")
        with timer("optimizer"):
            optimizer.step()
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


def diverged(cfg: TrainConfig, what: str) -> str:
    """The one line of a diverged run: what happened, and what to try."""
    hint = f"try a lower lr (now {cfg.lr:g}; --lr)"
    if cfg.grad_clip is None:
        hint += ", gradient clipping (--set grad_clip=0.5)"
    if cfg.optimizer != "torch-adamw":
        hint += ", or skipping such steps (--set optimizer_kwargs={nonfinite: skip})"
    return f"the run diverged: {what}; {hint}"


# ---------------------------------------------------------------------------------------
# building the pieces


def prepared_dataset(cfg: TrainConfig, rt: Runtime) -> Path:
    """The run's prepared dataset directory (see ``spectra_lab.data.training_dataset``):
    rank 0 finds it, or prepares a named corpus once, and tells the other ranks."""
    path = None
    if rt.is_main:
        try:
            path = str(
                training_dataset(
                    cfg.dataset, cfg.tokenizer, cfg.vocab_size, cfg.data_dir, cfg.progress
                )
            )
        except ValueError as exc:  # unknown dataset or tokenizer
            raise ConfigError(f"config field 'dataset' = {cfg.dataset!r}: {exc}") from None
    return Path(rt.broadcast(path))


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
        # what a soft clip by "auto" runs for float32 matrices here (machine-dependent: "mixed"
        # on CPUs with bf16 units, "eigh" on other CPUs, "polar" on CUDA)
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
        monitor=build_monitor(ctx),
        observer=watch(ctx) if watch is not None else None,
        tokens_per_step=tokens_per_step,
        flops=about["flops_per_token"],
        peak=peak,
        about=about,
    )


def model_config_of(cfg: TrainConfig, vocab_size: int) -> Any:
    """The ``ModelConfig`` of ``cfg``: its preset with the shape and μP fields it changes; a
    shape that does not work is a one-line ``ConfigError`` naming the field."""
    from spectra_lab.model import model_config

    overrides = cfg.model_overrides()
    try:
        return model_config(cfg.preset, vocab_size, vocab_multiple=cfg.vocab_multiple, **overrides)
    except ValueError as exc:
        msg = str(exc)
        named = [k for k in overrides if k in msg and getattr(cfg, k, None) is not None]
        field_ = "mup_base_width" if "mup_base_width" in msg else (named[0] if named else "preset")
        raise ConfigError(f"config field '{field_}' = {getattr(cfg, field_)!r}: {msg}") from None


def build_model(cfg: TrainConfig, vocab_size: int) -> tuple[nn.Module, Any]:
    """The Llama of preset ``cfg.preset`` and its config (same initial weights on every rank)."""
    from spectra_lab.model import Llama

    model_cfg = model_config_of(cfg, vocab_size)
    torch.manual_seed(cfg.seed)
    return Llama(model_cfg), model_cfg


def build_data(cfg: TrainConfig, rt: Runtime, dataset_dir: Path, seq_len: int) -> tuple[Any, Any]:
    """The training batch sampler and the validation split (``BatchSampler``, ``TokenDataset``).

    One global batch of ``batch_size * dp_size`` windows per micro-step; data-parallel rank r
    takes the r-th slice, so data-parallel ranks see disjoint data (the ranks of one
    tensor-parallel group the same).
    """
    from spectra_lab.data import BatchSampler, TokenDataset

    train_split = TokenDataset(dataset_dir / "train.bin", seq_len)
    val = TokenDataset(dataset_dir / "val.bin", seq_len)
    sampler = BatchSampler(
        train_split, cfg.batch_size, seed=cfg.seed, rank=rt.dp_rank, world_size=rt.dp_size
    )
    return sampler, val


#: the tensor-parallel plan of a block (``"tp"``, ``"2d"``): q, k, v and the MLP's w1, w3 split
#: by rows (``ColwiseParallel``: each rank computes its heads and its part of the hidden
#: layer), o and w2 by columns (``RowwiseParallel``: their outputs are summed), as in
#: Megatron-LM; embeddings, norms and the head stay whole on every rank
TP_PLAN = {"attn.wq": "colwise", "attn.wk": "colwise", "attn.wv": "colwise",
           "attn.wo": "rowwise", "mlp.w1": "colwise", "mlp.w3": "colwise",
           "mlp.w2": "rowwise"}  # fmt: skip


def wrap_model(model: nn.Module, cfg: TrainConfig, rt: Runtime) -> nn.Module:
    """The module the loop calls: ``model``, compiled if asked, in DDP when distributed.

    With ``parallel="fsdp2"``: ``model`` itself, sharded in place over a 1-D mesh of all
    ranks by ``fully_shard`` on each block, then on the root (torchtitan's layout: a block's
    weights are gathered for its forward and backward only); ``compile`` compiles each block.
    With ``"tp"``: each block's matrices split over all ranks by :data:`TP_PLAN`. With
    ``"2d"``: both, on a ``(dp, tp)`` mesh of ``(world / tp_size, tp_size)``: TP within each
    row, FSDP2 across.
    """
    if cfg.parallel in ("tp", "2d"):
        return _tensor_parallel(model, cfg, rt)
    if cfg.parallel == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(rt.device.type, (rt.world_size,))
        for block in model.layers:
            if cfg.compile:
                block.compile()
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    forward = torch.compile(model) if cfg.compile else model
    if rt.distributed:
        device_ids = [rt.device.index] if rt.device.type == "cuda" else None
        forward = nn.parallel.DistributedDataParallel(forward, device_ids=device_ids)
    return forward


def _tensor_parallel(model: nn.Module, cfg: TrainConfig, rt: Runtime) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    tp = rt.world_size // rt.dp_size
    mc = model.cfg
    for what, size in (("n_heads", mc.n_heads), ("the MLP's hidden size", mc.hidden_dim)):
        if size % tp:
            raise ConfigError(
                f"config field 'parallel' = {cfg.parallel!r}: {tp} tensor-parallel processes do "
                f"not divide {what} ({size})"
            )
    mesh = init_device_mesh(rt.device.type, (rt.dp_size, tp), mesh_dim_names=("dp", "tp"))
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for block in model.layers:
        parallelize_module(block, mesh["tp"], {k: styles[v]() for k, v in TP_PLAN.items()})
        if cfg.compile:
            block.compile()
        if cfg.parallel == "2d":
            fully_shard(block, mesh=mesh["dp"])
    if cfg.parallel == "2d":
        fully_shard(model, mesh=mesh["dp"])
    return model


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for parameters that may be plain tensors and
    ``DTensor``s on several meshes (tensor parallelism leaves the embeddings and norms whole;
    a 2-D run shards those over its data-parallel mesh only): the norm of each kind is
    reduced by its own mesh, the total is their root sum of squares, and every gradient is
    scaled by ``min(1, max_norm / (total + 1e-6))``."""
    from spectra.optim.distributed import is_sharded

    kinds: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            kinds.setdefault(p.grad.device_mesh if is_sharded(p.grad) else None, []).append(p)
    if len(kinds) <= 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norms = []
    for ps in kinds.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in ps])
        norms.append(norm.full_tensor() if is_sharded(norm) else norm)
    total = torch.linalg.vector_norm(torch.stack(norms))
    for ps in kinds.values():
        torch.nn.utils.clip_grads_with_norm_(ps, max_norm, total)
    return total


def start_or_resume(
    run_dir: Path, cfg: TrainConfig, rt: Runtime, components: dict[str, Any]
) -> tuple[int, int]:
    """``(step, tokens)`` to start from: the latest checkpoint's with ``resume``, else 0.

    A fresh run refuses a directory holding checkpoints unless ``overwrite``; it starts by
    deleting (rank 0) every file of the run it replaces, before anything new is written. A
    resumed run refuses a config that changes what its checkpoint holds (``lr``, the
    optimizer's settings, the model, the data), which would otherwise be silently ignored.
    """
    existing = list_checkpoints(run_dir)
    start = tokens = 0
    if cfg.resume:
        path = latest_checkpoint(run_dir)
        if path is None:
            raise CheckpointError(f"--resume: no checkpoint in {run_dir / 'ckpt'}")
        sequences = cfg.batch_size * cfg.grad_accum * rt.dp_size
        state = load_components(path, components, rt.world_size, sequences)
        check_resumed_config(cfg, state["config"], path)
        start, tokens = state["step"], state["tokens"]
    elif existing and not cfg.overwrite:
        raise CheckpointError(
            f"{run_dir} already holds a run (checkpoint at step {existing[-1][0]}); "
            "use --resume to continue it or --overwrite to start over"
        )
    elif rt.is_main:
        clear_run(run_dir)
    rt.barrier()  # nobody reads a checkpoint that rank 0 is deleting
    return start, tokens


def check_resumed_config(cfg: TrainConfig, saved: dict[str, Any], path: Path) -> None:
    """One-line ``ConfigError`` for the first field the checkpoint fixes that ``cfg`` changes."""
    new = cfg.to_dict()
    for name in fixed_on_resume():
        if name in saved and name in new and saved[name] != new[name]:
            raise ConfigError(
                f"config field '{name}' = {new[name]!r} differs from {saved[name]!r} in the "
                f"checkpoint {path}, which a resumed run keeps; resume without changing it, "
                "or start a new run (another --out, or --overwrite)"
            )


def build_monitor(ctx: RunContext) -> SpectralMonitor | None:
    """The run's ``SpectralMonitor`` (``None`` when ``monitor_every`` is 0).

    It watches every matrix of ``monitor_groups`` (default: all weight matrices, so that its
    ``sum_weight_*`` are the paper's aggregated weight norms) and counts steps from ``start``,
    so a resumed run records at the same steps, and the same values, as an uninterrupted one.
    Every rank runs it (under FSDP2 it gathers each matrix, a collective); rank 0 logs it.
    """
    cfg = ctx.cfg
    if not cfg.monitor_every:
        return None
    watched = [
        (name, p)
        for name, p in ctx.model.named_parameters()
        if p.requires_grad and p.dim() >= 2 and group_of(name, p) in cfg.monitor_groups
    ]
    monitor = SpectralMonitor(
        ctx.model, ctx.optimizer, params=watched, every=cfg.monitor_every, seed=cfg.seed
    )
    monitor.step_count = ctx.start
    return monitor


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


# ---------------------------------------------------------------------------------------
# one step, one evaluation


class Timer:
    """Seconds per phase: ``with timer("forward"):`` adds the block's time to ``t_forward``.

    ``sync`` (the CUDA synchronization, when ``sync_timing``) ends every block, so that a
    phase's time is its kernels' and not just their launch.
    """

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if self.sync is not None:
            self.sync()
        key = f"t_{phase}"
        self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - start


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


def gradient_sync(forward: nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """Gradients are reduced across ranks on the last micro-batch only.

    DDP: ``no_sync()`` around the others. FSDP2: ``set_requires_gradient_sync(last)``; the
    unsharded gradients accumulate locally until the last micro-batch reduce-scatters them.
    """
    if isinstance(forward, FSDPModule):
        forward.set_requires_gradient_sync(last)
    elif isinstance(forward, nn.parallel.DistributedDataParallel) and not last:
        return forward.no_sync()
    return contextlib.nullcontext()


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
    scalars = torch.stack(
        [torch.stack((p.record["loss"].double(), p.record["grad_norm"].double())) for p in pending]
    ).tolist()  # float64 holds every float32 value exactly, as .item() would give it
    for p, (loss, grad_norm) in zip(pending, scalars, strict=True):
        if not math.isfinite(loss):
            log.advance(0)
            raise Diverged(diverged(cfg, f"the loss is {loss} at step {p.record['step']}"))
        p.record.update(loss=loss, grad_norm=grad_norm)
        log.train(p.record)
        log.monitor(p.record["step"], p.spectral)
        if on_step is not None:
            on_step(p.record["step"], p.record)
    log.advance(len(pending))
    pending.clear()


def full(t: torch.Tensor) -> torch.Tensor:
    """``t`` whole: a ``DTensor`` (FSDP2's gradient norm) gathered, any other tensor as is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


@torch.no_grad()
def evaluate(model: nn.Module, val: Any, cfg: TrainConfig, rt: Runtime) -> float:
    """Mean token loss over the fixed validation batches, split across ranks.

    Batches are weighted by their number of sequences (the last may be smaller). A sharded
    (FSDP2) model gathers its weights inside each forward, a collective: a rank with one
    batch fewer than the others runs one more forward, whose loss is not counted.
    """
    from spectra_lab.data import iter_eval_batches

    batch = cfg.eval_batch_size or cfg.batch_size
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=rt.device)
    batches = iter_eval_batches(val, batch, max_batches=cfg.eval_batches or None)
    count = mine = 0
    for i, (x, y) in enumerate(batches):
        count += 1
        if i % rt.dp_size != rt.dp_rank:
            continue
        x, y = x.to(rt.device), y.to(rt.device)
        with rt.autocast():
            _, loss = model(x, y)
        total[0] += loss.double() * x.shape[0]
        total[1] += x.shape[0]
        mine += 1
    if isinstance(model, FSDPModule) and mine < -(-count // rt.dp_size):
        with rt.autocast():
            model(x.to(rt.device))
    total = rt.mean(total)  # the ratio of the sums is the ratio of the means
    model.train()
    if total[1] == 0:
        raise ConfigError("the validation split yields no batch; lower eval_batch_size")
    return (total[0] / total[1]).item()
