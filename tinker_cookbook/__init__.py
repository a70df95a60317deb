"""tinker_cookbook: a local Tinker-compatible API, LoRA engine and cookbook."""
