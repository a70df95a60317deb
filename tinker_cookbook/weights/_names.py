"""The option names the weights tools take, without importing torch (the CLI's parser lists them)."""

DTYPE_NAMES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16", "f16")
"""Merged-weights dtypes; ``auto`` keeps each tensor's dtype in the base model's files."""
QUANT_NAMES = ("f16", "bf16", "f32", "q8_0")
"""GGUF tensor types offered by ``export_gguf``."""
