"""The local LoRA training engine (torch + peft + transformers) behind the Tinker-compatible API."""
