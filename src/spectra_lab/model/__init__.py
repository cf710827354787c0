"""The Llama-style language model trained by the harness."""

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
    "model_config",
    "rope_frequencies",
    "swiglu_hidden",
]
