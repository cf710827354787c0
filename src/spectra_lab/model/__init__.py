"""The Llama-style language model trained by the harness, and its FLOPs per token."""

from spectra_lab.model.flops import flops_per_token, matmul_parameters
from spectra_lab.model.llama import (
    PRESETS,
    Llama,
    ModelConfig,
    apply_rope,
    model_config,
    rope_frequencies,
    swiglu_hidden,
)

__all__ = [
    "PRESETS",
    "Llama",
    "ModelConfig",
    "apply_rope",
    "flops_per_token",
    "matmul_parameters",
    "model_config",
    "rope_frequencies",
    "swiglu_hidden",
]
