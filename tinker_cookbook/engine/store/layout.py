"""Where things are under the store's root, every path checked for symlinks, and cleaning up after killed saves."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tinker_cookbook.engine.store import crash_safety, paths
from tinker_cookbook.engine.store.names import CheckpointKind, normalize_kind, validate_name
from tinker_cookbook.engine.store.records import CHECKPOINT_FILE
from tinker_cookbook.tinker import errors

RUN_FILE = "run.json"


class StoreLayout:
    """The directories of a store root; one lock orders the moves its parts make in this process."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = threading.RLock()

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    def checked(self, path: Path, subject: str) -> Path:
        """``path``, once no component of it below the root is a symlink (``paths.check_no_symlinks``)."""
        return paths.check_no_symlinks(self.root, path, subject)

    def staging(self, run_dir: Path, subject: str) -> Path:
        """The run's staging directory, created if missing."""
        staging = self.checked(run_dir / ".staging", subject)
        staging.mkdir(exist_ok=True)
        return staging

    def checkpoint_dir(self, run_dir: Path, kind: CheckpointKind, name: str, subject: str) -> Path:
        return self.checked(run_dir / kind / name, subject)

    def archive_dir(self, run_dir: Path, kind: CheckpointKind, name: str, subject: str) -> Path:
        return self.checked(run_dir / ".archives" / kind / name, subject)

    # -- leftovers of killed processes --------------------------------------------------------------------

    def recover_all(self) -> None:
        """Clean every run's staging directory; best effort, since a read-only store must still open."""
        try:
            self.checked(self.runs_dir, "opening the store")
            run_dirs = [Path(e.path) for e in os.scandir(self.runs_dir) if e.is_dir(follow_symlinks=False)]
        except (OSError, paths.UnsafeStoreEntryError):
            return  # missing, unreadable or symlinked: every later use reports it
        for run_dir in run_dirs:
            try:
                self.recover_run(run_dir)
            except (OSError, paths.UnsafeStoreEntryError):
                continue

    def recover_run(self, run_dir: Path) -> None:
        """Remove stale staging entries; put back a checkpoint whose overwrite was killed between its renames."""
        staging = self.checked(run_dir / ".staging", "cleaning up killed saves")
        if not paths.is_real_dir(staging):
            return

        def backup_target(entry: crash_safety.StagingEntry) -> Path | None:
            """Where a backup goes back to; None keeps it (it may be the only copy): a person should look."""
            kind, name = (*entry.target, "", "")[:2]
            try:
                path = run_dir / normalize_kind(kind) / validate_name("name", name)
                return self.checked(path, "restoring a killed overwrite")
            except (errors.BadRequestError, paths.UnsafeStoreEntryError):
                return None

        with self.lock:
            crash_safety.clean_staging(staging, backup_target, CHECKPOINT_FILE)
