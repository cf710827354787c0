"""The training configuration: one plain dataclass, loadable from YAML/TOML with overrides.

Defaults describe the main job: a short CPU run of the ``cpu-small`` Llama on the
embedded Shakespeare corpus with Spectra-AdamW, using the paper's recipe scaled down
(weight decay 0.1, global gradient clipping 0.5, clipping threshold ``clip_c = 10``
with the "standard" clipping schedule, WSD learning-rate schedule with the last 20%
of steps decaying to zero). See docs/training.md for every field.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Parameter groups the trainer knows about (see ``optimizers.param_groups``).
PARAM_GROUPS = ("hidden", "attn", "embed", "head", "norm")
SCHEDULES = ("wsd", "cosine", "constant")
CLIP_SCHEDULES = ("standard", "constant")
PRE_CLIP_SCHEDULES = ("constant", "cosine")
AUTOCAST_MODES = ("auto", "bf16", "none")


@dataclass
class TrainConfig:
    """Every knob of a training run, with the main job's values as defaults.

    Sizes: ``batch_size`` is the micro-batch per process; one optimizer step sees
    ``batch_size * grad_accum * world_size`` sequences of ``seq_len`` tokens.
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
    data_dir: str | None = (
        None  # cache root for prepared datasets; None: $SPECTRA_CACHE or ~/.cache/spectra
    )

    # model
    preset: str = "cpu-small"
    seq_len: int | None = None  # None: the preset's sequence length

    # steps and batch
    steps: int = 300
    batch_size: int = 16
    grad_accum: int = 1

    # learning rate and its schedule
    optimizer: str = "spectra-adamw"
    lr: float = 2e-3
    schedule: str = "wsd"
    warmup_steps: int = 30
    decay_fraction: float = 0.2  # wsd: the last 20% of steps decay to zero
    final_lr_ratio: float = 0.0  # cosine: final lr / peak lr

    # base optimizer hyperparameters (each optimizer reads the ones it has)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.999
    beta3: float = 0.999  # AdEMAMix slow momentum
    ademamix_alpha: float = 8.0
    momentum: float = 0.95  # Signum, SGDM, D-Muon
    eps: float = 1e-8
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)

    # global gradient-norm clipping of the raw gradient (the paper's "Gradient Clipping")
    grad_clip: float | None = 0.5

    # SPECTRA: post-spectral clipping of the update, and optional pre-clipping of gradients
    clip_c: float | None = 10.0
    clip_scale: str | float = "auto"
    clip_schedule: str = "standard"
    clip_groups: list[str] = field(default_factory=lambda: ["hidden", "attn"])
    pre_clip_c: float | None = None
    pre_clip_schedule: str = "constant"
    pre_clip_c_final: float | None = None  # cosine pre-clip schedule end value

    # evaluation, logging, checkpoints
    eval_interval: int = 50
    eval_batches: int = 20
    eval_batch_size: int | None = None  # None: batch_size
    log_interval: int = 10
    checkpoint_interval: int = 100
    keep_checkpoints: int = 2
    plot: bool = True
    progress: bool = True

    # hardware
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    autocast: str = "auto"  # auto (bf16 on CUDA, off on CPU) | bf16 | none
    compile: bool = False
    sync_timing: bool = True  # synchronize CUDA around timed phases

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field with a bad value."""

        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"config field '{name}' = {getattr(self, name)!r}: {why}")

        for name in ("steps", "batch_size", "grad_accum", "eval_interval", "log_interval"):
            if getattr(self, name) <= 0:
                raise bad(name, "must be positive")
        for name in ("checkpoint_interval", "eval_batches", "keep_checkpoints", "warmup_steps"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")
        if self.warmup_steps > self.steps:
            raise bad("warmup_steps", f"exceeds steps = {self.steps}")
        if self.seq_len is not None and self.seq_len <= 0:
            raise bad("seq_len", "must be positive")
        if self.eval_batch_size is not None and self.eval_batch_size <= 0:
            raise bad("eval_batch_size", "must be positive")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise bad("lr", "must be a positive finite number")
        if self.weight_decay < 0:
            raise bad("weight_decay", "must be >= 0")
        if not 0.0 <= self.decay_fraction <= 1.0:
            raise bad("decay_fraction", "must lie in [0, 1]")
        if not 0.0 <= self.final_lr_ratio <= 1.0:
            raise bad("final_lr_ratio", "must lie in [0, 1]")
        for name in ("beta1", "beta2", "beta3", "momentum"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise bad(name, "must lie in [0, 1)")
        for name in ("grad_clip", "clip_c", "pre_clip_c", "pre_clip_c_final"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise bad(name, "must be positive (or null to disable)")
        if isinstance(self.clip_scale, str) and self.clip_scale != "auto":
            raise bad("clip_scale", "must be 'auto' or a number")
        if not isinstance(self.clip_scale, str) and not self.clip_scale > 0:
            raise bad("clip_scale", "must be positive")
        choices = {
            "schedule": SCHEDULES,
            "clip_schedule": CLIP_SCHEDULES,
            "pre_clip_schedule": PRE_CLIP_SCHEDULES,
            "autocast": AUTOCAST_MODES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise bad(name, f"choose from {', '.join(allowed)}")
        unknown = [g for g in self.clip_groups if g not in PARAM_GROUPS]
        if unknown:
            raise bad("clip_groups", f"unknown group {unknown[0]!r}; groups: {PARAM_GROUPS}")
        if self.resume and self.overwrite:
            raise bad("overwrite", "cannot be combined with resume")
        if self.pre_clip_schedule == "cosine" and self.pre_clip_c is None:
            raise bad("pre_clip_schedule", "cosine needs pre_clip_c")
        if self.pre_clip_c_final is not None and (
            self.pre_clip_c is None or self.pre_clip_c_final > self.pre_clip_c
        ):
            raise bad("pre_clip_c_final", "must not exceed pre_clip_c")
        from spectra_lab.train.optimizers import OPTIMIZERS

        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", f"choose from {', '.join(OPTIMIZERS)}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise bad("device", "choose auto, cpu, cuda or cuda:N")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------
# Loading and overrides. Errors are ConfigError (a ValueError) with one line naming the
# field; the CLI turns them into spectra_lab.cli.CLIError.


class ConfigError(ValueError):
    """A config file or override that names an unknown field or has an ill-typed value."""


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"none", "null", "~", ""}


def _unknown(name: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(name, _FIELDS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ConfigError(f"unknown config field '{name}' in {source}{hint}")


def _coerce(name: str, value: Any, source: str) -> Any:
    """Convert ``value`` (from YAML/TOML or a command-line string) to the field's type."""
    hint = _HINTS[name]
    optional = False
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        optional = type(None) in args
        args = tuple(a for a in args if a is not type(None))
        hint = args[0] if len(args) == 1 else hint

    def fail(expected: str) -> ConfigError:
        return ConfigError(f"config field '{name}' in {source}: expected {expected}, got {value!r}")

    if optional and (value is None or (isinstance(value, str) and value.lower() in _NONE)):
        return None
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise fail("true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise fail("an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise fail("a number")
    if hint is str:
        if isinstance(value, str):
            return value
        raise fail("a string")
    if hint == (str | float):  # clip_scale: "auto" or a number
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value
        raise fail("'auto' or a number")
    origin = typing.get_origin(hint)
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        raise fail("a list of strings")
    if origin is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise fail("a JSON object") from None
        if isinstance(value, dict):
            return dict(value)
        raise fail("a mapping")
    raise fail(str(hint))  # pragma: no cover - every field type is handled above


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file into a flat dict."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text()
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        import yaml

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
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of field: value")
    return data


def parse_set(items: list[str]) -> dict[str, str]:
    """Parse ``--set key=value`` items (values stay strings; typed later)."""
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

    Later layers win. Every key must be a field and every value must convert to the
    field's type; otherwise a one-line ``ConfigError`` names the field and its source.
    """
    values = dict(base) if base is not None else {}
    for source, layer in layers:
        for name, value in layer.items():
            if name not in _FIELDS:
                raise _unknown(name, source)
            values[name] = _coerce(name, value, source)
    unknown = [k for k in values if k not in _FIELDS]
    if unknown:
        raise _unknown(unknown[0], "the saved config")
    try:
        return TrainConfig(**values)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def save_config(cfg: TrainConfig, path: Path) -> None:
    """Write the resolved config as YAML (atomically)."""
    import yaml

    from spectra_lab.train.checkpoint import atomic_write_bytes

    text = yaml.safe_dump(cfg.to_dict(), sort_keys=False)
    atomic_write_bytes(path, text.encode())


def load_saved_config(path: Path) -> dict[str, Any]:
    """Read a config written by ``save_config`` back into a dict of field values."""
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    # How the saved run was started says nothing about how it is continued.
    skip = {"resume", "overwrite"}
    return {k: _coerce(k, v, str(path)) for k, v in data.items() if k in _FIELDS and k not in skip}
