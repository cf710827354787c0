"""The training loop: one file to read top to bottom.

A step is: ``grad_accum`` micro-batches of forward and backward (averaged gradients),
global gradient-norm clipping of the raw gradient, then ``optimizer.step()``, which for
the SPECTRA optimizers optionally pre-clips the gradient, forms the base update and
spectrally clips it (Algorithm "SPECTRA" of "Enhancing LLM Training via Spectral
Clipping"), then ``LambdaLR`` moves the learning rate ``η_k = η · S_lr(k)`` (WSD or
cosine, with linear warmup). The clipping threshold ``c_k`` follows the clip schedule
that ``optimizers.py`` puts in the param groups; the optimizer evaluates it each step
from the group's current and peak learning rate.

Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) the model is wrapped in DDP (gloo on
CPU, NCCL on CUDA); every rank draws its own data stream, and only rank 0 writes files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from spectra_lab.train.checkpoint import (
    CheckpointError,
    atomic_write_bytes,
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from spectra_lab.train.config import ConfigError, TrainConfig, save_config
from spectra_lab.train.metrics import MetricsWriter
from spectra_lab.train.optimizers import build_optimizer, current_clip_c

CHECKPOINT_FORMAT = 1


# ---------------------------------------------------------------------------------------
# schedules


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """``S_lr(k)``: the multiplier of the peak learning rate at step ``k``."""
    from spectra.optim.schedules import cosine_schedule, wsd_schedule

    try:
        if cfg.schedule == "wsd":
            return wsd_schedule(cfg.warmup_steps, cfg.steps, decay_fraction=cfg.decay_fraction)
        if cfg.schedule == "cosine":
            return cosine_schedule(cfg.warmup_steps, cfg.steps, final_ratio=cfg.final_lr_ratio)
        return wsd_schedule(cfg.warmup_steps, cfg.steps, decay_fraction=0.0)  # "constant"
    except ValueError as exc:
        raise ConfigError(f"config field 'schedule' = {cfg.schedule!r}: {exc}") from None


# ---------------------------------------------------------------------------------------
# environment


@dataclass
class Runtime:
    """Where this process runs: rank, world size, device and numerics."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    autocast_dtype: torch.dtype | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)


def setup_runtime(cfg: TrainConfig) -> Runtime:
    """Read the torchrun environment, start the process group and pick the device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    if cfg.device == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        kind = cfg.device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"config field 'device' = {cfg.device!r}: CUDA is not available")
    if kind == "cuda":
        index = local_rank if world_size > 1 or ":" not in cfg.device else int(cfg.device[5:])
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if kind == "cuda" else "gloo")
    if cfg.autocast == "auto":
        dtype = torch.bfloat16 if kind == "cuda" and torch.cuda.is_bf16_supported() else None
    else:
        dtype = torch.bfloat16 if cfg.autocast == "bf16" else None
    return Runtime(rank, world_size, local_rank, device, dtype)


def _gather(obj: Any, rt: Runtime) -> list[Any]:
    if not rt.distributed:
        return [obj]
    out: list[Any] = [None] * rt.world_size
    dist.all_gather_object(out, obj)
    return out


def _broadcast(obj: Any, rt: Runtime) -> Any:
    if not rt.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _rng_state(rt: Runtime) -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 (global state used by any legacy caller)
        "torch": torch.get_rng_state(),
    }
    if rt.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(rt.device)
    return state


def _set_rng_state(state: dict[str, Any], rt: Runtime) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if "cuda" in state and rt.device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], rt.device)


def _config_dict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else dict(vars(obj))


# ---------------------------------------------------------------------------------------
# data and model


def resolve_dataset(cfg: TrainConfig, rt: Runtime) -> Path:
    """A prepared dataset directory: ``cfg.dataset`` itself, or found/prepared by rank 0.

    A name refers to the data package's default location for it,
    ``<data_dir>/datasets/<name>-<tokenizer tag>`` (what ``spectra prepare-data`` writes):
    a prepared dataset there is used as it is (whatever token budget it was made with),
    otherwise rank 0 prepares it with the default options.
    """
    given = Path(cfg.dataset)
    if (given / "meta.json").is_file():
        return given
    path = None
    if rt.is_main:
        from spectra_lab.data import default_dataset_dir, prepare

        try:
            out = default_dataset_dir(cfg.dataset, cfg.tokenizer, cfg.vocab_size, cfg.data_dir)
            if (out / "meta.json").is_file():
                path = str(out)
            else:
                path = str(
                    prepare(cfg.dataset, out, tokenizer=cfg.tokenizer, vocab_size=cfg.vocab_size)
                )
        except ValueError as exc:  # unknown dataset or tokenizer
            raise ConfigError(f"config field 'dataset' = {cfg.dataset!r}: {exc}") from None
    return Path(_broadcast(path, rt))


def build_model(cfg: TrainConfig, vocab_size: int) -> tuple[nn.Module, Any]:
    """The Llama of preset ``cfg.preset`` (same initial weights on every rank)."""
    from spectra_lab.model import Llama, model_config

    try:
        model_cfg = model_config(cfg.preset, vocab_size, seq_len=cfg.seq_len)
    except ValueError as exc:
        raise ConfigError(f"config field 'preset' = {cfg.preset!r}: {exc}") from None
    torch.manual_seed(cfg.seed)
    return Llama(model_cfg), model_cfg


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


# ---------------------------------------------------------------------------------------
# the trainer


class Trainer:
    """Train ``cfg`` from scratch, or from the run directory's latest checkpoint.

    ``on_step(step, record)`` is called on every rank after each optimizer step, with
    the step count so far and the step's metrics; raising from it stops training the
    way an interruption would (no checkpoint is written).
    """

    def __init__(
        self, cfg: TrainConfig, on_step: Callable[[int, dict[str, Any]], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.on_step = on_step
        self.run_dir = Path(cfg.out_dir)

    # -- pieces ---------------------------------------------------------------------

    def _open_data(self, dataset_dir: Path) -> tuple[Any, Any, Any]:
        from spectra_lab.data import BatchSampler, TokenDataset

        cfg, rt = self.cfg, self.rt
        train = TokenDataset(dataset_dir / "train.bin", self.seq_len)
        val = TokenDataset(dataset_dir / "val.bin", self.seq_len)
        # One global batch of batch_size * world_size windows per micro-step; rank r takes
        # the r-th slice, so ranks see disjoint data.
        sampler = BatchSampler(
            train, cfg.batch_size, seed=cfg.seed, rank=rt.rank, world_size=rt.world_size
        )
        return train, val, sampler

    def _eval_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        from spectra_lab.data import iter_eval_batches

        cfg = self.cfg
        batch = cfg.eval_batch_size or cfg.batch_size
        return iter_eval_batches(self.val, batch, max_batches=cfg.eval_batches or None)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean token loss over the fixed validation batches (split across ranks).

        Batches are weighted by their number of sequences (the last may be smaller).
        """
        rt = self.rt
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=rt.device)
        for i, (x, y) in enumerate(self._eval_batches()):
            if i % rt.world_size != rt.rank:
                continue
            x, y = x.to(rt.device), y.to(rt.device)
            with rt.autocast():
                _, loss = self.model(x, y)
            total[0] += loss.double() * x.shape[0]
            total[1] += x.shape[0]
        if rt.distributed:
            dist.all_reduce(total)
        self.model.train()
        if total[1] == 0:
            raise ConfigError("the validation split yields no batch; lower eval_batch_size")
        return (total[0] / total[1]).item()

    def _checkpoint(self, step: int, tokens: int) -> None:
        rt = self.rt
        samplers = _gather(self.sampler.state_dict(), rt)
        rngs = _gather(_rng_state(rt), rt)
        if rt.is_main:
            state = {
                "format": CHECKPOINT_FORMAT,
                "step": step,
                "tokens": tokens,
                "world_size": rt.world_size,
                "config": self.cfg.to_dict(),
                "model_config": _config_dict(self.model_cfg),
                "dataset_dir": str(self.dataset_dir),
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "samplers": samplers,
                "rng": rngs,
            }
            save_checkpoint(checkpoint_path(self.run_dir, step), state)
            prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)
        if rt.distributed:
            dist.barrier()

    def _resume(self) -> tuple[int, int]:
        path = latest_checkpoint(self.run_dir)
        if path is None:
            raise CheckpointError(f"--resume: no checkpoint in {self.run_dir / 'ckpt'}")
        state = load_checkpoint(path, map_location="cpu")
        if state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"checkpoint {path}: unknown format {state.get('format')!r}")
        if state["world_size"] != self.rt.world_size:
            raise CheckpointError(
                f"checkpoint {path} was written by {state['world_size']} processes; "
                f"resume with the same number (got {self.rt.world_size})"
            )
        step = state["step"]
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        # The LR schedule follows this run's config (``--steps`` may extend a WSD run from
        # its stable phase), so the saved schedule settings are not loaded and the lr of
        # the next step is recomputed; with an unchanged config this is the saved value.
        sched = dict(state["scheduler"])
        sched["lr_lambdas"] = [None] * len(self.optimizer.param_groups)
        self.scheduler.load_state_dict(sched)
        factor = self.lr_fn(step)
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
            group["lr"] = base * factor
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]
        self.sampler.load_state_dict(state["samplers"][self.rt.rank])
        _set_rng_state(state["rng"][self.rt.rank], self.rt)
        return step, state["tokens"]

    def _log_line(self, text: str) -> None:
        if not self.rt.is_main:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    # -- the loop -------------------------------------------------------------------

    def run(self) -> TrainResult:
        cfg = self.cfg
        self.rt = rt = setup_runtime(cfg)
        self.dataset_dir = resolve_dataset(cfg, rt)
        meta = json.loads((self.dataset_dir / "meta.json").read_text())
        self.model, self.model_cfg = build_model(cfg, int(meta["vocab_size"]))
        self.seq_len = int(self.model_cfg.seq_len)
        self.model.to(rt.device)
        torch.manual_seed(cfg.seed + rt.rank)
        self.train_data, self.val, self.sampler = self._open_data(self.dataset_dir)

        self.optimizer = build_optimizer(self.model, cfg)
        self.lr_fn = lr_lambda(cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.lr_fn)

        start, tokens = (0, 0)
        existing = list_checkpoints(self.run_dir)
        if cfg.resume:
            start, tokens = self._resume()
        elif existing and not cfg.overwrite:
            raise CheckpointError(
                f"{self.run_dir} already holds a run (checkpoint at step {existing[-1][0]}); "
                "use --resume to continue it or --overwrite to start over"
            )
        elif existing and rt.is_main:
            for _, path in existing:
                path.unlink(missing_ok=True)
        if rt.distributed:
            dist.barrier()  # nobody reads a checkpoint that rank 0 is deleting

        forward = self.model
        if cfg.compile:
            forward = torch.compile(forward)
        if rt.distributed:
            forward = nn.parallel.DistributedDataParallel(
                forward, device_ids=[rt.device.index] if rt.device.type == "cuda" else None
            )
        params = [p for p in self.model.parameters() if p.requires_grad]
        n_params = sum(p.numel() for p in params)
        tokens_per_step = cfg.batch_size * cfg.grad_accum * self.seq_len * rt.world_size

        metrics = None
        if rt.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.run_dir / "config.yaml")
            info = {
                "world_size": rt.world_size,
                "device": str(rt.device),
                "autocast": str(rt.autocast_dtype),
                "torch": torch.__version__,
                "parameters": n_params,
                "tokens_per_step": tokens_per_step,
                "dataset_dir": str(self.dataset_dir),
                "model_config": _config_dict(self.model_cfg),
                "started_at_step": start,
            }
            atomic_write_bytes(self.run_dir / "run.json", json.dumps(info, indent=2).encode())
            metrics = MetricsWriter(self.run_dir, resume_step=start if start else None)

        self.bar = None
        if rt.is_main and cfg.progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=cfg.steps, initial=start, desc="train", dynamic_ncols=True, file=sys.stderr
            )
        self._log_line(
            f"{cfg.optimizer} | preset {cfg.preset} | {n_params / 1e6:.2f}M params | "
            f"{tokens_per_step} tokens/step | {rt.device} x{rt.world_size} | "
            f"steps {start}->{cfg.steps}"
        )

        val_loss = None
        self.model.train()
        try:
            for step in range(start, cfg.steps):
                record = self._train_step(step, forward, params)
                tokens += tokens_per_step
                record = {"step": step + 1, "tokens": tokens, **record}
                record["tokens_per_s"] = tokens_per_step / record["t_step"]
                done = step + 1
                if metrics is not None:
                    metrics.log("train", record)
                if self.bar is not None:
                    self.bar.update(1)
                    self.bar.set_postfix(
                        loss=f"{record['loss']:.4f}",
                        lr=f"{record['lr']:.2e}",
                        tok_s=f"{record['tokens_per_s']:.0f}",
                    )
                elif done % cfg.log_interval == 0:
                    self._log_line(
                        f"step {done:>6} | loss {record['loss']:.4f} | lr {record['lr']:.2e} | "
                        f"{record['tokens_per_s']:.0f} tok/s"
                    )
                if self.on_step is not None:
                    self.on_step(done, record)
                if done % cfg.eval_interval == 0 or done == cfg.steps:
                    t0 = time.perf_counter()
                    val_loss = self.evaluate()
                    ev = {
                        "step": done,
                        "tokens": tokens,
                        "val_loss": val_loss,
                        "val_ppl": math.exp(min(val_loss, 50.0)),
                        "t_eval": time.perf_counter() - t0,
                    }
                    self._log_line(
                        f"step {done:>6} | val loss {val_loss:.4f} | val ppl {ev['val_ppl']:.2f}"
                    )
                    if metrics is not None:
                        metrics.log("eval", ev)
                        if cfg.plot:
                            metrics.plot()
                if (cfg.checkpoint_interval and done % cfg.checkpoint_interval == 0) or (
                    done == cfg.steps
                ):
                    self._checkpoint(done, tokens)
        finally:
            if self.bar is not None:
                self.bar.close()

        if val_loss is None and cfg.steps == start:  # resumed a finished run
            val_loss = self.evaluate()
        val_ppl = math.exp(min(val_loss, 50.0)) if val_loss is not None else None
        if metrics is not None:
            if cfg.plot:
                metrics.plot()
            summary = {
                "step": cfg.steps,
                "tokens": tokens,
                "val_loss": val_loss,
                "val_ppl": val_ppl,
                "optimizer": cfg.optimizer,
                "preset": cfg.preset,
                "parameters": n_params,
            }
            atomic_write_bytes(
                self.run_dir / "summary.json", json.dumps(summary, indent=2).encode()
            )
        return TrainResult(
            self.run_dir, cfg.steps, tokens, val_loss, val_ppl, self.model, rank=rt.rank
        )

    def _train_step(self, step: int, forward: nn.Module, params: list[torch.Tensor]) -> dict:
        """One optimizer step; returns its metrics with a per-phase timing breakdown."""
        cfg, rt = self.cfg, self.rt
        perf = time.perf_counter
        t_start = perf()
        clip_c = current_clip_c(self.optimizer, step)
        lr = self.optimizer.param_groups[0]["lr"]
        t_data = t_fwd = t_bwd = 0.0
        loss_sum = torch.zeros((), device=rt.device)
        for micro in range(cfg.grad_accum):
            t0 = perf()
            x, y = self.sampler.next_batch()
            x, y = x.to(rt.device, non_blocking=True), y.to(rt.device, non_blocking=True)
            last = micro == cfg.grad_accum - 1
            # DDP all-reduces gradients on the last micro-batch only.
            no_sync = rt.distributed and not last
            with forward.no_sync() if no_sync else contextlib.nullcontext():
                t1 = perf()
                with rt.autocast():
                    _, loss = forward(x, y)
                if cfg.sync_timing:
                    rt.sync()
                t2 = perf()
                (loss / cfg.grad_accum).backward()
                if cfg.sync_timing:
                    rt.sync()
                t3 = perf()
            loss_sum += loss.detach().float()
            t_data += t1 - t0
            t_fwd += t2 - t1
            t_bwd += t3 - t2

        t0 = perf()
        max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if cfg.sync_timing:
            rt.sync()
        t1 = perf()
        self.optimizer.step()
        if cfg.sync_timing:
            rt.sync()
        t2 = perf()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

        loss_mean = loss_sum / cfg.grad_accum
        if rt.distributed:
            dist.all_reduce(loss_mean, op=dist.ReduceOp.SUM)
            loss_mean /= rt.world_size
        loss_value = loss_mean.item()
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss is {loss_value} at step {step + 1}")
        return {
            "loss": loss_value,
            "lr": lr,
            "clip_c": clip_c,
            "grad_norm": grad_norm.item(),
            "t_data": t_data,
            "t_forward": t_fwd,
            "t_backward": t_bwd,
            "t_grad_clip": t1 - t0,
            "t_optimizer": t2 - t1,
            "t_step": perf() - t_start,
        }


def train(
    cfg: TrainConfig, on_step: Callable[[int, dict[str, Any]], None] | None = None
) -> TrainResult:
    """Run :class:`Trainer` and tear down the process group it may have started."""
    try:
        return Trainer(cfg, on_step=on_step).run()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
