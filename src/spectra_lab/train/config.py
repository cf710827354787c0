"""The training configuration: one plain dataclass, loadable from YAML/TOML with overrides.

Defaults describe the main job: a short CPU run of the ``cpu-small`` Llama on the embedded
Shakespeare corpus with Spectra-AdamW, using the paper's recipe scaled down (weight decay 0.1,
global gradient clipping 0.5, ``clip_c = 10`` with the "standard" clipping schedule, WSD
learning-rate schedule with the last 20% of steps decaying to zero). See docs/training.md.

This module is a leaf of the harness: it knows the fields, their types and their ranges,
and nothing of the optimizers, the model or the data. Settings that belong to one
optimizer (betas, momentum, eps, ...) are not fields: the optimizer registry
(``optimizers.py``) holds each optimizer's defaults and ``optimizer_kwargs`` overrides them.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from spectra.validate import check_choice, check_int, check_number
from spectra_lab.errors import UserError

#: Parameter groups the trainer knows about (see ``optimizers.param_groups``).
PARAM_GROUPS = ("hidden", "attn", "embed", "head", "norm")
SCHEDULES = ("wsd", "cosine", "constant")
CLIP_SCHEDULES = ("standard", "constant")
CLIP_LAYOUTS = ("matrices", "tensors")
PRE_CLIP_SCHEDULES = ("constant", "cosine")
AUTOCAST_MODES = ("auto", "bf16", "none")
PARAMETRIZATIONS = ("standard", "mup")
#: how several processes share the model: replicated (DDP) or sharded (FSDP2)
PARALLEL_MODES = ("ddp", "fsdp2", "tp", "2d")
#: groups whose matrices the spectral monitor may watch ("norm" holds vectors only)
MONITOR_GROUPS = ("hidden", "attn", "embed", "head")
#: where the scalars go besides the run directory's files (the ``log`` extra)
LOGGERS = ("tensorboard", "wandb")
#: ``warmup_steps = None`` warms up for this fraction of ``steps``.
WARMUP_FRACTION = 0.1


class ConfigError(UserError, ValueError):
    """A config field that is unknown, ill-typed or out of range (one line naming it)."""


@dataclass
class TrainConfig:
    """Every knob of a training run, with the main job's values as defaults.

    Sizes: ``batch_size`` is the micro-batch per process; one optimizer step sees
    ``batch_size * grad_accum * world_size`` sequences of ``seq_len`` tokens. With
    ``global_batch_size`` set, ``grad_accum`` is derived from it for the world size the run
    gets (:meth:`accumulation`), so that one file gives the same global batch on 1, 4 or 8
    processes.
    """

    # run directory
    out_dir: str = "runs/default"
    resume: bool = False  # continue from the latest checkpoint in out_dir
    overwrite: bool = False  # start afresh in an out_dir that holds checkpoints (deletes them)
    seed: int = 1337

    # data
    dataset: str = "shakespeare"  # a name for spectra_lab.data.prepare, or a prepared directory
    tokenizer: str = "bpe"
    vocab_size: int = 4096  # tokenizer vocabulary (used when the dataset is prepared here)
    vocab_multiple: int = 1  # the model's vocabulary rounded up to a multiple (GPT-2: 64)
    data_dir: str | None = None  # prepared-datasets root; None: $SPECTRA_CACHE or ~/.cache/spectra

    # model
    preset: str = "cpu-small"
    seq_len: int | None = None  # None: the preset's sequence length
    # the preset's shape, changed (None: the preset's own)
    d_model: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    # "mup": the maximal-update parametrization (model multipliers and per-layer learning
    # rates; docs/scale.md#mup), relative to a base model of width mup_base_width, in the
    # form of the authors' mup_llama model, which the 1.5B training scripts linked by the
    # paper run. The defaults 256, 10 and 1.4 are those of the authors' code, which those
    # scripts keep (the paper's text does not give them)
    parametrization: str = "standard"
    mup_base_width: int = 256
    mup_scale_emb: float = 10.0
    mup_scale_depth: float = 1.4
    mup_lr_scaling: bool = True  # hidden/attention lr ÷ (d_model/mup_base_width)

    # steps and batch
    steps: int = 300
    batch_size: int = 16
    grad_accum: int = 1
    global_batch_size: int | None = None  # sequences per optimizer step; sets grad_accum

    # learning rate and its schedule
    optimizer: str = "spectra-adamw"
    lr: float = 2e-3
    schedule: str = "wsd"
    warmup_steps: int | None = None  # None: round(WARMUP_FRACTION * steps)
    decay_fraction: float = 0.2  # wsd: the last 20% of steps decay to zero
    final_lr_ratio: float = 0.0  # cosine: final lr / peak lr

    # every optimizer: decoupled weight decay, and the optimizer's own keywords over the
    # registry's defaults for it (betas, eps, momentum, ...)
    weight_decay: float = 0.1
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)

    # global gradient-norm clipping of the raw gradient (the paper's "Gradient Clipping")
    grad_clip: float | None = 0.5

    # SPECTRA: post-spectral clipping of the update, and optional pre-clipping of gradients
    clip_c: float | None = 10.0
    clip_kappa: float | None = None  # relative threshold κ·‖U‖_F per matrix (not clip_c)
    clip_scale: str | float = "auto"
    clip_schedule: str = "standard"
    clip_groups: list[str] = field(default_factory=lambda: ["hidden", "attn"])
    # "matrices": each expert and fused block its own matrix; "tensors": each tensor one matrix
    clip_layout: str = "matrices"
    pre_clip_c: float | None = None
    pre_clip_schedule: str = "constant"
    pre_clip_c_final: float | None = None  # cosine pre-clip schedule end value
    pre_clip_kappa: float | None = None  # adaptive pre-clip: c_k = κ·EMA(σ̂_max) per matrix
    pre_clip_beta: float = 0.99  # its EMA factor

    # evaluation, logging, checkpoints
    eval_interval: int = 50
    eval_batches: int = 20
    eval_batch_size: int | None = None  # None: batch_size
    log_interval: int = 10
    checkpoint_interval: int = 100
    keep_checkpoints: int = 2
    plot: bool = True
    progress: bool = True

    # spectral monitor (spectra.SpectralMonitor): its scalars every monitor_every steps (0: off)
    # into metrics.jsonl (kind "monitor") and the loggers; it watches the matrices of
    # monitor_groups (default: every weight matrix)
    monitor_every: int = 0
    monitor_groups: list[str] = field(default_factory=lambda: list(MONITOR_GROUPS))
    # TensorBoard and/or Weights & Biases: the train, eval and monitor scalars (rank 0)
    loggers: list[str] = field(default_factory=list)

    # hardware
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    autocast: str = "auto"  # auto (bf16 on CUDA, off on CPU) | bf16 | none
    compile: bool = False
    sync_timing: bool = True  # synchronize CUDA around timed phases
    # the device's peak TFLOP/s for the logged MFU; None: looked up for known GPUs (throughput.py)
    peak_tflops: float | None = None
    # several processes (torchrun): "ddp" replicates the model, "fsdp2" shards it, "tp" splits
    # each block's matrices over the processes (tensor parallelism), "2d" does both on a
    # (processes / tp_size, tp_size) mesh
    parallel: str = "ddp"
    tp_size: int | None = None  # "2d": the tensor-parallel size (it divides the processes)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def warmup(self) -> int:
        """Linear-warmup steps: ``warmup_steps``, or ``round(0.1 * steps)`` when it is None."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return round(WARMUP_FRACTION * self.steps)

    def accumulation(self, world_size: int) -> int:
        """Micro-batches per step: ``global_batch_size / (batch_size · world_size)`` when the
        global batch is given (one-line ``ConfigError`` if that does not divide, or if
        ``grad_accum`` says otherwise), else ``grad_accum``."""
        if self.global_batch_size is None:
            return self.grad_accum
        per_micro = self.batch_size * world_size
        accum, rest = divmod(self.global_batch_size, per_micro)
        if rest or accum == 0:
            raise ConfigError(
                f"config field 'global_batch_size' = {self.global_batch_size}: not a multiple of "
                f"batch_size {self.batch_size} x world size {world_size} = {per_micro}"
            )
        if self.grad_accum not in (1, accum):
            raise ConfigError(
                f"config field 'grad_accum' = {self.grad_accum}: global_batch_size "
                f"{self.global_batch_size} with batch_size {self.batch_size} x world size "
                f"{world_size} needs {accum}; give one of the two"
            )
        return accum

    def model_overrides(self) -> dict[str, Any]:
        """The :class:`~spectra_lab.model.ModelConfig` fields this config changes in its preset."""
        mup = self.parametrization == "mup"
        return {
            "seq_len": self.seq_len,
            "d_model": self.d_model,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "mup_base_width": self.mup_base_width if mup else None,
            "mup_scale_emb": self.mup_scale_emb,
            "mup_scale_depth": self.mup_scale_depth,
        }

    def validate(self) -> None:
        """Raise a one-line ``ConfigError`` naming the first field with a bad value."""
        for name, check in _CHECKS.items():
            try:
                check(name, getattr(self, name))
            except ValueError as exc:
                choices = getattr(check, "keywords", {}).get("choices")
                hint = did_you_mean(getattr(self, name), choices)
                raise self._error(name, f"{exc}{hint}") from None
        rules = (
            ("warmup_steps", self.warmup > self.steps, f"exceeds steps = {self.steps}"),
            ("overwrite", self.resume and self.overwrite, "cannot be combined with resume"),
            (
                "pre_clip_schedule",
                self.pre_clip_schedule == "cosine" and self.pre_clip_c is None,
                "cosine needs pre_clip_c",
            ),
            (
                "tp_size",
                self.parallel == "2d" and self.tp_size is None,
                "parallel = '2d' needs the tensor-parallel size",
            ),
            (
                "monitor_groups",
                self.monitor_every > 0 and not self.monitor_groups,
                "is empty: the monitor would watch nothing",
            ),
            (
                "pre_clip_kappa",
                self.pre_clip_kappa is not None and self.pre_clip_c is not None,
                f"cannot be combined with pre_clip_c = {self.pre_clip_c!r} (give one)",
            ),
            (
                "pre_clip_c_final",
                self.pre_clip_c_final is not None
                and (self.pre_clip_c is None or self.pre_clip_c_final > self.pre_clip_c),
                "must not exceed pre_clip_c",
            ),
            (
                "parallel",
                self.parallel in ("tp", "2d") and _has_experts(self.preset),
                f"the {self.preset!r} preset has expert layers, which tensor parallelism does "
                "not split; use 'ddp' or 'fsdp2'",
            ),
        )
        for name, broken, why in rules:
            if broken:
                raise self._error(name, why)

    def _error(self, name: str, why: str) -> ConfigError:
        return ConfigError(f"config field '{name}' = {getattr(self, name)!r}: {why}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: the fields a resumed run may change: how long it runs and its LR schedule, how it clips the
#: gradient norm, evaluates, reports and checkpoints, and where it runs. Every other field is
#: held by the checkpoint (the optimizer and its settings, the model, the data and its order,
#: the seed), which would silently override a new value.
RESUME_MAY_CHANGE = frozenset(
    {
        "out_dir", "resume", "overwrite", "data_dir",
        "steps", "grad_accum", "global_batch_size",
        "schedule", "warmup_steps", "decay_fraction", "final_lr_ratio", "grad_clip",
        "eval_interval", "eval_batches", "eval_batch_size", "log_interval",
        "checkpoint_interval", "keep_checkpoints", "plot", "progress",
        "monitor_every", "monitor_groups", "loggers",
        "device", "autocast", "compile", "sync_timing", "peak_tflops", "parallel", "tp_size",
    }
)  # fmt: skip


def fixed_on_resume() -> list[str]:
    """The fields a resumed run must keep (those not in :data:`RESUME_MAY_CHANGE`)."""
    return [name for name in _FIELDS if name not in RESUME_MAY_CHANGE]


def _auto_or_positive(name: str, value: Any) -> Any:
    if value != "auto":
        check_number(f"{name} ('auto' or a number)", value, low=0.0, low_open=True)


def _choices_each(name: str, value: list[str], choices: tuple[str, ...]) -> None:
    for item in value:
        try:
            check_choice(name, item, choices)
        except ValueError as exc:
            raise ValueError(f"{exc}{did_you_mean(item, choices)}") from None


def _device(name: str, value: str) -> None:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(value)):
        raise ValueError(f"{name} must be auto, cpu, cuda or cuda:N, got {value!r}")


_positive_int = partial(check_int, low=1)
_count = partial(check_int, low=0)
_fraction = partial(check_number, low=0.0, high=1.0)
_positive_or_off = partial(check_number, low=0.0, low_open=True, none_ok=True)

#: field -> check(name, value), raising ValueError (spectra.validate's wording)
_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "seed": check_int,
    "vocab_size": _positive_int,
    "vocab_multiple": _positive_int,
    "seq_len": partial(check_int, low=1, none_ok=True),
    "d_model": partial(check_int, low=1, none_ok=True),
    "n_layers": partial(check_int, low=1, none_ok=True),
    "n_heads": partial(check_int, low=1, none_ok=True),
    "parametrization": partial(check_choice, choices=PARAMETRIZATIONS),
    "mup_base_width": _positive_int,
    "mup_scale_emb": partial(check_number, low=0.0, low_open=True),
    "mup_scale_depth": partial(check_number, low=0.0, low_open=True),
    "steps": _positive_int,
    "batch_size": _positive_int,
    "grad_accum": _positive_int,
    "global_batch_size": partial(check_int, low=1, none_ok=True),
    "lr": partial(check_number, low=0.0, low_open=True),
    "schedule": partial(check_choice, choices=SCHEDULES),
    "warmup_steps": partial(check_int, low=0, none_ok=True),
    "decay_fraction": _fraction,
    "final_lr_ratio": _fraction,
    "weight_decay": partial(check_number, low=0.0),
    "grad_clip": _positive_or_off,
    "clip_c": _positive_or_off,
    "clip_kappa": _positive_or_off,
    "clip_scale": _auto_or_positive,
    "clip_schedule": partial(check_choice, choices=CLIP_SCHEDULES),
    "clip_groups": partial(_choices_each, choices=PARAM_GROUPS),
    "clip_layout": partial(check_choice, choices=CLIP_LAYOUTS),
    "pre_clip_c": _positive_or_off,
    "pre_clip_schedule": partial(check_choice, choices=PRE_CLIP_SCHEDULES),
    "pre_clip_c_final": _positive_or_off,
    "pre_clip_kappa": _positive_or_off,
    "pre_clip_beta": partial(check_number, low=0.0, high=1.0, high_open=True),
    "eval_interval": _positive_int,
    "eval_batches": _count,
    "eval_batch_size": partial(check_int, low=1, none_ok=True),
    "log_interval": _positive_int,
    "checkpoint_interval": _count,
    "keep_checkpoints": _count,
    "monitor_every": _count,
    "monitor_groups": partial(_choices_each, choices=MONITOR_GROUPS),
    "loggers": partial(_choices_each, choices=LOGGERS),
    "device": _device,
    "autocast": partial(check_choice, choices=AUTOCAST_MODES),
    "parallel": partial(check_choice, choices=PARALLEL_MODES),
    "tp_size": partial(check_int, low=1, none_ok=True),
    "peak_tflops": _positive_or_off,
}


# ---------------------------------------------------------------------------------------
# Loading and overrides: every key must be a field and every value must have the field's
# type; otherwise a one-line ConfigError names the field and where the value came from.

_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _kinds(hint: Any) -> tuple[Any, ...]:
    """The types a field accepts, ``str`` last (``str | float``: a number if it reads as one)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = typing.get_args(hint) if union else (hint,)
    return tuple(sorted(kinds, key=lambda kind: kind is str))


_KINDS = {name: _kinds(hint) for name, hint in typing.get_type_hints(TrainConfig).items()}
_MISMATCH = object()
_EXPECTED = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    type(None): "null",
    list[str]: "a list of strings",
    dict[str, Any]: "a mapping",
}


def _as(kind: Any, value: Any) -> Any:
    """``value`` as ``kind``, or ``_MISMATCH``."""
    if kind in (bool, str, type(None)):
        return value if isinstance(value, kind) else _MISMATCH
    if kind is int:  # a bool is not a number
        return value if isinstance(value, int) and not isinstance(value, bool) else _MISMATCH
    if kind is float:  # PyYAML reads 1e-3 (no dot) as a string
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            try:
                return float(value)
            except ValueError:
                pass
        return _MISMATCH
    if kind == list[str]:  # "a,b" is the list [a, b]
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return list(value) if ok else _MISMATCH
    return dict(value) if isinstance(value, dict) else _MISMATCH  # optimizer_kwargs


def _typed(name: str, value: Any, source: str) -> Any:
    """``value`` as field ``name``'s type.

    A string for a field that is not a string (a ``--set`` or flag value, or a file value
    YAML left as text) is read as a YAML scalar first: ``1e-3``, ``null``, ``[a, b]``,
    ``{k: v}``; a string field keeps its text unless it reads as null.
    """
    kinds = _KINDS[name]
    given = value
    if isinstance(value, str):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        if str not in kinds or parsed is None:
            value = parsed
    for kind in kinds:
        converted = _as(kind, value)
        if converted is not _MISMATCH:
            return converted
    expected = " or ".join(_EXPECTED[kind] for kind in kinds)
    got = "an empty value ('')" if isinstance(given, str) and not given.strip() else repr(given)
    raise ConfigError(f"config field '{name}' in {source}: expected {expected}, got {got}")


def did_you_mean(value: Any, choices: Any) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to a mistyped ``value``, else ``""``.

    Underscores and hyphens count as the same (``spectra_adamw`` finds ``spectra-adamw``).
    """
    if not isinstance(value, str) or not choices:
        return ""
    plain = {str(c).replace("_", "-").lower(): str(c) for c in choices}
    close = difflib.get_close_matches(value.replace("_", "-").lower(), list(plain), n=1)
    return f" (did you mean '{plain[close[0]]}'?)" if close else ""


def _has_experts(preset: str) -> bool:
    from spectra_lab.model.llama import PRESETS

    return bool(PRESETS.get(preset, {}).get("n_experts", 0))


def _unknown(name: str, source: str) -> ConfigError:
    return ConfigError(f"unknown config field '{name}' in {source}{did_you_mean(name, _FIELDS)}")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file into a flat dict; an empty
    file (no field set) is refused."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".toml"))
        some = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
        listing = f" (it holds {len(found)} config files: {some})" if found else ""
        raise ConfigError(f"config {path} is a folder{listing}; give one file of it")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text()
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            line = getattr(getattr(exc, "problem_mark", None), "line", None)
            where = f" line {line + 1}" if line is not None else ""
            raise ConfigError(f"cannot parse {path}{where}: invalid YAML") from None
    elif suffix == ".toml":
        try:
            import tomllib
        except ImportError:  # Python 3.10: the same parser, packaged as tomli
            import tomli as tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"cannot parse {path}: {exc}") from None
    else:
        raise ConfigError(f"config file {path}: use a .yaml, .yml or .toml extension")
    if data is None or data == {}:
        raise ConfigError(
            f"config file {path} is empty: it sets no field; write the fields it should set "
            "(field: value)"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of field: value")
    return data


def parse_set(items: list[str]) -> dict[str, str]:
    """Parse ``--set key=value`` items (values stay strings; typed by ``build_config``)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def build_config(
    *layers: tuple[str, dict[str, Any]], base: dict[str, Any] | None = None
) -> TrainConfig:
    """Merge ``(source, values)`` layers over ``base`` (default: the dataclass defaults).

    Later layers win. Every key must be a field and every value must have the field's
    type; otherwise a one-line ``ConfigError`` names the field and its source. A path that
    starts with ``~`` (``out_dir``, ``data_dir``, ``dataset``) is in the home folder.
    """
    values = dict(base) if base is not None else {}
    for source, layer in layers:
        for name, value in layer.items():
            if name not in _FIELDS:
                raise _unknown(name, source)
            values[name] = _typed(name, value, source)
    for name in ("out_dir", "data_dir", "dataset"):  # no shell expands ~ in a file or --set
        if isinstance(values.get(name), str) and values[name].startswith("~"):
            values[name] = str(Path(values[name]).expanduser())
    return TrainConfig(**values)


#: ``--shrink``: a run of any config, shrunk to a few minutes on a CPU. The optimizer, its
#: settings, the LR and clip schedules' shapes and the parametrization stay; the model, the
#: data, the batch and the length become those of a quick CPU run.
SHRINK: dict[str, Any] = {
    "preset": "tiny",
    "d_model": None,
    "n_layers": None,
    "n_heads": None,
    "seq_len": None,
    "dataset": "shakespeare",
    "tokenizer": "bpe",
    "vocab_size": 4096,
    "vocab_multiple": 1,
    "steps": 40,
    "global_batch_size": None,
    "batch_size": 8,
    "grad_accum": 1,
    "warmup_steps": None,
    "eval_interval": 20,
    "eval_batches": 4,
    "eval_batch_size": None,
    "log_interval": 10,
    "checkpoint_interval": 20,
    "device": "cpu",
    "autocast": "none",
    "compile": False,
    "parallel": "ddp",
    "loggers": [],
}
#: the μP base width of a shrunk μP run (the tiny preset's d_model is 64: m = 2)
SHRINK_MUP_BASE_WIDTH = 32


def shrink(values: dict[str, Any]) -> dict[str, Any]:
    """The ``--shrink`` layer for a config of ``values`` (the fields set so far).

    Besides :data:`SHRINK`: the run goes to ``<out_dir>-shrunk``, a μP run keeps μP with a
    base width of :data:`SHRINK_MUP_BASE_WIDTH`, and the optimizer's warmups counted in steps
    (``optimizer_kwargs`` keys ending in ``_warmup``) shrink with the number of steps.
    """
    layer = dict(SHRINK)
    defaults = TrainConfig()
    out_dir = values.get("out_dir", defaults.out_dir)
    layer["out_dir"] = f"{str(out_dir).rstrip('/')}-shrunk"
    if values.get("parametrization") == "mup":
        layer["mup_base_width"] = SHRINK_MUP_BASE_WIDTH
    kwargs = dict(values.get("optimizer_kwargs") or {})
    ratio = SHRINK["steps"] / int(values.get("steps", defaults.steps))
    for key, value in kwargs.items():
        if key.endswith("_warmup") and isinstance(value, int) and not isinstance(value, bool):
            kwargs[key] = max(1, round(value * ratio))
    if kwargs:
        layer["optimizer_kwargs"] = kwargs
    return layer


def load_saved_config(path: Path) -> dict[str, Any]:
    """Read a run directory's ``config.yaml`` back into a dict of field values.

    Fields this version no longer has are skipped, and so are ``resume`` and ``overwrite``:
    how the saved run was started says nothing about how it is continued.
    """
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} is damaged (not a YAML mapping of config fields); delete it to resume "
            "with the fields of the command line, or start the run again (--overwrite)"
        )
    skip = {"resume", "overwrite"}
    return {k: _typed(k, v, str(path)) for k, v in data.items() if k in _FIELDS and k not in skip}
