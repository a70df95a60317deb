"""The bottom layer: helpers that every layer may use and that use nothing else of the project.

Layers, from the bottom (checked by ``tests/test_layering.py``):

- ``base`` (this package, plus ``tinker_cookbook.exceptions`` and ``tinker_cookbook.perf_env``): offline assets,
  tokenizers by name, the exception hierarchy, process settings. Imports only the standard library, third-party
  packages and itself.
- ``tinker_cookbook.tinker``: the Tinker-compatible API contract (types, errors, clients, futures).
- ``tinker_cookbook.engine``: the local LoRA engine; depends on the contract's types and errors and on ``base``.
- the cookbook (everything else: renderers, supervised, rl, eval, utils, cli, recipes): the public API and ``base``
  only, never the engine.
"""
