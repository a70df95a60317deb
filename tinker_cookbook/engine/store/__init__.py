"""The checkpoint store room: runs and checkpoints on the local filesystem behind ``tinker://`` paths.

``checkpoint_store`` (the store), with its parts: ``names`` (run ids, kinds and paths), ``runs`` (the run
registry), ``checkpoints`` (checkpoint records), ``archives`` (download archives); ``files`` (the engine's files
inside a checkpoint), ``paths`` (symlink safety) and ``crash_safety`` (atomic swaps, recovery after kills).
"""
