"""The local checkpoint store behind ``tinker://`` paths.

Layout under the root (``$TINKER_COOKBOOK_HOME``, default ``~/.tinker_cookbook``; see ``engine.settings``)::

    runs/<run_id>/run.json                         base model, LoRA config, user metadata, times
    runs/<run_id>/weights/<name>/                  training state (save_state)
    runs/<run_id>/sampler_weights/<name>/          sampler weights (save_weights_for_sampler)
    runs/<run_id>/.staging/                        saves being written, replaced checkpoints, deletions
    runs/<run_id>/.archives/<kind>/<name>/         cached .tar archives for download

A checkpoint directory holds the engine's files plus ``checkpoint.json``. Writes are atomic: the engine fills a
staging directory, everything is fsynced, ``checkpoint.json`` is written last, and one rename moves the whole
directory into place, so a killed save never leaves a half checkpoint that lists or loads. A directory without
``checkpoint.json`` is never listed or loaded. An overwrite swaps old and new in one atomic exchange where the
filesystem has one; elsewhere the old checkpoint is renamed to a backup first, and a store opened after a kill
between the two renames puts the backup back. Staging entries carry their process id, so opening the store removes
the leftovers of killed processes and never a save still running elsewhere.

Nothing below the root may be a symlink (see ``store.paths``): the store refuses them rather than read or delete
through them. The store only moves files around; it never unpickles anything.

``CheckpointStore`` is the store's one entry point; its parts are the run registry (``runs``), the checkpoint
index (``checkpoints``: look-up, listing, changes), atomic writes (``writes``) and download archives
(``archives``), over one ``layout`` of the root.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tinker_cookbook.engine import settings
from tinker_cookbook.engine.store import archives
from tinker_cookbook.engine.store.checkpoints import CheckpointIndex
from tinker_cookbook.engine.store.layout import StoreLayout
from tinker_cookbook.engine.store.names import KINDS, CheckpointKind
from tinker_cookbook.engine.store.runs import RunRegistry
from tinker_cookbook.engine.store.writes import CheckpointWriter
from tinker_cookbook.tinker import types

__all__ = ["KINDS", "CheckpointKind", "CheckpointStore"]


class CheckpointStore:
    """Runs and checkpoints on the local filesystem, addressed by ``tinker://`` paths.

    Opening a store cleans up after processes that were killed while saving (see the module docstring).
    """

    def __init__(self, root: Path | None = None):
        self.layout = StoreLayout(Path(root).expanduser() if root is not None else settings.store_home())
        self.runs = RunRegistry(self.layout, lambda run_dir: self.checkpoints.run_checkpoints(run_dir))
        self.checkpoints = CheckpointIndex(self.layout, self.runs)
        self._writer = CheckpointWriter(self.checkpoints)
        self.layout.recover_all()

    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def runs_dir(self) -> Path:
        return self.layout.runs_dir

    # -- runs ---------------------------------------------------------------------------------------------

    def create_run(self, base_model: str, lora_config: types.LoraConfig, user_metadata: dict[str, str] | None = None,
                   run_id: str | None = None) -> str:
        """Register a new training run and return its id (``run-YYYYmmdd-HHMMSS-xxxxxx`` unless given)."""
        return self.runs.create_run(base_model, lora_config, user_metadata, run_id)

    def discard_new_run(self, run_id: str) -> None:
        """Remove a just-created run without checkpoints (its client could not be built)."""
        self.runs.discard_new_run(run_id)

    def touch_run(self, run_id: str) -> None:
        self.runs.touch_run(run_id)

    def run_record(self, run_id: str) -> dict[str, Any]:
        return self.runs.run_record(run_id)

    def get_run(self, run_id: str) -> types.TrainingRun:
        return self.runs.get_run(run_id)

    def list_runs(self, limit: int = 20, offset: int = 0) -> types.TrainingRunsResponse:
        """Training runs, newest first; ``limit=0`` lists all."""
        return self.runs.list_runs(limit, offset)

    # -- checkpoints --------------------------------------------------------------------------------------

    def write_checkpoint(self, run_id: str, kind: CheckpointKind, name: str, writer: Callable[[Path], None],
                         metadata: dict[str, Any], ttl_seconds: int | None = None, overwrite: bool = False
                         ) -> types.Checkpoint:
        """Create ``tinker://<run_id>/<kind>/<name>`` atomically (see ``CheckpointWriter.write_checkpoint``)."""
        return self._writer.write_checkpoint(run_id, kind, name, writer, metadata, ttl_seconds, overwrite)

    def checkpoint_dir(self, tinker_path: str, expected_kind: str | None = None) -> Path:
        """The directory of a complete checkpoint, optionally checking it is of ``expected_kind``."""
        return self.checkpoints.checkpoint_dir(tinker_path, expected_kind)

    def checkpoint_metadata(self, tinker_path: str) -> dict[str, Any]:
        """The engine's metadata dict stored with the checkpoint."""
        return self.checkpoints.checkpoint_metadata(tinker_path)

    def get_checkpoint(self, tinker_path: str) -> types.Checkpoint:
        return self.checkpoints.get_checkpoint(tinker_path)

    def list_checkpoints(self, run_id: str) -> types.CheckpointsListResponse:
        """The run's checkpoints of both kinds, newest first."""
        return self.checkpoints.list_checkpoints(run_id)

    def list_user_checkpoints(self, limit: int = 100, offset: int = 0) -> types.CheckpointsListResponse:
        """Checkpoints of every run, newest first; ``limit=0`` lists all."""
        return self.checkpoints.list_user_checkpoints(limit, offset)

    def weights_info(self, tinker_path: str) -> types.WeightsInfoResponse:
        """Base model and LoRA config the checkpoint was trained with."""
        return self.checkpoints.weights_info(tinker_path)

    def delete_checkpoint(self, tinker_path: str) -> None:
        self.checkpoints.delete_checkpoint(tinker_path)

    def set_public(self, tinker_path: str, public: bool) -> None:
        self.checkpoints.set_public(tinker_path, public)

    def set_ttl(self, tinker_path: str, ttl_seconds: int | None) -> None:
        """Expire the checkpoint ``ttl_seconds`` from now; None keeps it until deleted."""
        self.checkpoints.set_ttl(tinker_path, ttl_seconds)

    def archive(self, tinker_path: str) -> Path:
        """A .tar of the checkpoint's files (without the store's checkpoint.json), built once and cached."""
        return archives.archive(self.checkpoints, tinker_path)
