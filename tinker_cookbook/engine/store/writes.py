"""Writing a checkpoint atomically: the engine fills a staging directory, everything is fsynced,
``checkpoint.json`` is written last, and one rename (or an atomic exchange, for an overwrite) puts the whole
directory in place, so a killed save never leaves a half checkpoint that lists or loads."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tinker_cookbook.base.atomic_files import fsync_dir, fsync_tree, remove_path
from tinker_cookbook.engine.store import crash_safety, paths, records
from tinker_cookbook.engine.store.checkpoints import CheckpointIndex
from tinker_cookbook.engine.store.names import CheckpointKind, normalize_kind, validate_name
from tinker_cookbook.engine.store.records import CHECKPOINT_FILE
from tinker_cookbook.tinker import errors, types


class CheckpointWriter:
    """Creates and replaces checkpoints of the runs ``index`` knows."""

    def __init__(self, index: CheckpointIndex) -> None:
        self.index = index
        self.layout = index.layout

    def write_checkpoint(
        self,
        run_id: str,
        kind: CheckpointKind,
        name: str,
        writer: Callable[[Path], None],
        metadata: dict[str, Any],
        ttl_seconds: int | None = None,
        overwrite: bool = False,
    ) -> types.Checkpoint:
        """Create ``tinker://<run_id>/<kind>/<name>`` atomically.

        ``writer`` fills the staging directory it is given with the engine's files (safetensors, JSON). If it
        raises, the staging directory is removed and nothing becomes visible. An existing checkpoint of the same
        name is a ConflictError unless ``overwrite=True``, in which case it is replaced as a whole: a kill at any
        moment leaves the old or the new checkpoint loadable.
        """
        kind = normalize_kind(kind)
        validate_name("name", name)
        try:
            json.dumps(metadata)
        except (TypeError, ValueError) as e:
            raise TypeError(f"checkpoint metadata must be JSON-serializable, got {metadata!r}: {e}") from None
        expires_at = records.expires_at(ttl_seconds)
        tinker_path = types.format_tinker_path(run_id, kind, name)
        run_dir = self.index.runs.run_dir(run_id, tinker_path)
        # Check every path this save touches before the engine spends time writing.
        target = self.layout.checkpoint_dir(run_dir, kind, name, tinker_path)
        archives = self.layout.archive_dir(run_dir, kind, name, tinker_path)
        staging = self.layout.staging(run_dir, tinker_path)
        if self.index.load(run_dir, kind, name, tinker_path) is not None and not overwrite:
            raise _conflict(tinker_path)
        self.layout.recover_run(run_dir)
        tmp = staging / crash_safety.staging_name("new", kind, name)
        tmp.mkdir()
        try:
            writer(tmp)
            paths.check_tree(self.layout.root, tmp, tinker_path)
            fsync_tree(tmp)
            record = records.new_record(kind, records.dir_size(tmp), expires_at, metadata)
            # checkpoint.json last: its presence is what marks the directory complete.
            crash_safety.write_json_atomic(tmp / CHECKPOINT_FILE, record, staging)
            self._move_into_place(tmp, target, tinker_path, overwrite, staging)
        finally:
            remove_path(tmp)  # a failed save, or the old checkpoint after an exchange
        remove_path(archives)
        self.index.runs.touch_run(run_id)
        return records.checkpoint_from_record(run_id, kind, name, record)

    def _move_into_place(self, tmp: Path, target: Path, tinker_path: str, overwrite: bool, staging: Path) -> None:
        with self.layout.lock:
            target.parent.mkdir(exist_ok=True)
            exists = os.path.lexists(self.layout.checked(target, tinker_path))
            if exists:
                if not paths.is_real_dir(target):
                    raise paths.unsafe_entry(self.layout.root, target, tinker_path)
                record = records.read_checkpoint_record(target)
                if record is not None and not records.expired(record) and not overwrite:
                    raise _conflict(tinker_path)
            try:
                if exists:
                    crash_safety.replace_dir(tmp, target, staging, CHECKPOINT_FILE)
                else:
                    os.rename(tmp, target)
            except OSError as e:  # another process created the same checkpoint in the meantime
                if paths.is_regular_file(target / CHECKPOINT_FILE):
                    raise errors.ConflictError(f"checkpoint {tinker_path} was written concurrently: {e}") from None
                raise
            fsync_dir(target.parent)
            fsync_dir(staging)


def _conflict(tinker_path: str) -> errors.ConflictError:
    return errors.ConflictError(
        f"checkpoint {tinker_path} already exists; choose another name or pass overwrite=True to replace it"
    )
