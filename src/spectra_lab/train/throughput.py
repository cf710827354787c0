"""What a training step achieves on its hardware: tokens per second, MFU and peak memory, and
the seconds each of its phases takes (:class:`Timer`).

MFU (model FLOPs utilisation; PaLM, Chowdhery et al., 2022, appendix B) is the model's
FLOP/s per device, ``flops_per_token · tokens_per_s_per_device``, divided by the device's
peak FLOP/s (``spectra_lab.model.flops_per_token`` counts the FLOPs). The peak is
``TrainConfig.peak_tflops`` when given, otherwise the table :data:`GPUS` for a CUDA device
it knows, in the precision of the run's matrix products: bf16 under bf16 autocast, TF32 in
float32 when TF32 is allowed (``spectra_lab.train.runtime`` allows it on CUDA), float32
otherwise. On a CPU or an unknown GPU the peak, and so the MFU, is ``None``.

Peak memory: on CUDA, ``torch.cuda.max_memory_allocated`` since the last reading (each
reading resets the counter); on a CPU, the process's peak resident set size
(``resource.getrusage``), which only ever grows.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GPU:
    """Dense (no sparsity) peak tensor-core TFLOP/s of one GPU, per precision."""

    name: str
    bf16: float
    tf32: float
    fp32: float  # plain float32 (no tensor cores)


# NVIDIA's datasheets "NVIDIA H100 Tensor Core GPU" and "NVIDIA H200 Tensor Core GPU" give the
# tensor-core figures with 2:4 sparsity (H100 SXM: BF16 1,979, TF32 989; PCIe: 1,513, 756;
# NVL: 1,671, 835); the dense ones below are half of them. "NVIDIA A100 Tensor Core GPU" gives
# dense figures (the same for its SXM and PCIe forms). FP32 is the datasheets' plain figure.
GPUS: dict[str, GPU] = {
    "h100": GPU("H100 SXM", bf16=989.5, tf32=494.5, fp32=67.0),
    "h100-pcie": GPU("H100 PCIe", bf16=756.5, tf32=378.0, fp32=51.0),
    "h100-nvl": GPU("H100 NVL", bf16=835.5, tf32=417.5, fp32=60.0),
    "h200": GPU("H200 SXM", bf16=989.5, tf32=494.5, fp32=67.0),
    "h200-nvl": GPU("H200 NVL", bf16=835.5, tf32=417.5, fp32=60.0),
    "a100": GPU("A100", bf16=312.0, tf32=156.0, fp32=19.5),
}
#: words in ``torch.cuda.get_device_name()`` -> key of :data:`GPUS`, the first match wins
#: ("NVIDIA H100 80GB HBM3" is the SXM form, "NVIDIA H100 PCIe", "NVIDIA H100 NVL", ...)
_NAMES = (
    (("h100", "nvl"), "h100-nvl"),
    (("h100", "pcie"), "h100-pcie"),
    (("h100",), "h100"),
    (("h200", "nvl"), "h200-nvl"),
    (("h200",), "h200"),
    (("a100",), "a100"),
)


def gpu_of(device_name: str) -> str | None:
    """The key of :data:`GPUS` for a CUDA device name, or ``None`` for a GPU not in it."""
    name = device_name.lower()
    for words, key in _NAMES:
        if all(word in name for word in words):
            return key
    return None


def matmul_precision(autocast_dtype: torch.dtype | None) -> str:
    """``"bf16"``, ``"tf32"`` or ``"fp32"``: the precision of the run's matrix products."""
    if autocast_dtype == torch.bfloat16:
        return "bf16"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def peak_flops(
    device: torch.device, autocast_dtype: torch.dtype | None, peak_tflops: float | None = None
) -> float | None:
    """The device's peak FLOP/s: ``peak_tflops`` when given, else :data:`GPUS`'s entry for a
    CUDA device in the run's precision; ``None`` for a CPU or an unknown GPU."""
    if peak_tflops is not None:
        return peak_tflops * 1e12
    if device.type != "cuda":
        return None
    key = gpu_of(torch.cuda.get_device_name(device))
    if key is None:
        return None
    return getattr(GPUS[key], matmul_precision(autocast_dtype)) * 1e12


def mfu(flops_per_token: float, tokens_per_s_per_device: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s per device over the peak (or ``None``)."""
    if peak is None:
        return None
    return flops_per_token * tokens_per_s_per_device / peak


def peak_memory_gb(device: torch.device) -> float | None:
    """Peak memory in GB (10⁹ bytes): on CUDA, allocated since the last call (the counter is
    reset); on a CPU, the process's peak resident set size so far (``None`` where the
    ``resource`` module is missing)."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / 1e9
    try:
        import resource
    except ImportError:  # Windows
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss * (1 if sys.platform == "darwin" else 1024) / 1e9  # bytes on macOS, KiB on Linux


def rates(
    tokens_per_step: int,
    seconds: float,
    world_size: int,
    flops_per_token: float,
    peak: float | None,
) -> dict[str, float | None]:
    """A step's ``tokens_per_s`` (the whole job), ``tokens_per_s_per_device`` and ``mfu``."""
    per_s = tokens_per_step / seconds
    per_device = per_s / world_size
    return {
        "tokens_per_s": per_s,
        "tokens_per_s_per_device": per_device,
        "mfu": mfu(flops_per_token, per_device, peak),
    }


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
