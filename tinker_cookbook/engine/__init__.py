"""The local LoRA training engine (torch + peft + transformers) behind the Tinker-compatible API.

Rooms: ``training`` (sessions, passes, losses, the optimizer, CPU layer replacements, multi-adapter batching),
``sampling`` (the continuous-batching sampler and its compact decoder), ``store`` (the checkpoint store behind
``tinker://`` paths) and ``kernels`` (the compiled paths, each with a torch fallback). Across them: ``backend``
(``LocalBackend``, what the API calls) with its ``request_queue`` and sampler ``handles``; ``models`` (the model
registry, with ``gguf_convert``), ``model_paths`` (fast fused paths or the general transformers path), ``vision``, ``device``, ``threads``, ``base_cache``, ``exit_hooks``; and
``settings``, which reads every knob of the engine (one table).
"""
