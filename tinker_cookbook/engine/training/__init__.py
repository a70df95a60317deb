"""The training room: LoRA adapters on a frozen, shared base model.

``session`` (a training client's adapter, optimizer and gradients), ``base_model`` (the shared base),
``validation`` (request checks), the passes that compute logprobs and losses (``forward``, ``passes``, ``losses``,
``custom_loss``), ``optimizer`` (AdamW), the CPU layer replacements (``frozen_linear``, ``fused_layers``) and
multi-adapter batching (``multi_lora``, ``multi_client``).
"""
