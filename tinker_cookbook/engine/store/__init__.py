"""The checkpoint store room: runs and checkpoints on the local filesystem behind ``tinker://`` paths.

``checkpoint_store`` (the store, its one entry point) over its parts: ``layout`` (paths under the root, recovery
after kills), ``runs`` (the run registry), ``checkpoints`` (look-up, listing, changes), ``writes`` (atomic saves),
``archives`` (download archives), ``names`` and ``records`` (names, paths and ``checkpoint.json``); with
``paths`` (symlink safety) and ``crash_safety`` (atomic swaps, staging entries). ``files`` reads and writes the
engine's files inside a checkpoint.
"""
