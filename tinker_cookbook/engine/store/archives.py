"""Download archives: a ``.tar`` of a checkpoint's files, built once per checkpoint version and cached under
``runs/<run_id>/.archives/<kind>/<name>/``."""

from __future__ import annotations

import tarfile
from datetime import datetime
from pathlib import Path

from tinker_cookbook.base.atomic_files import atomic_file, remove_path
from tinker_cookbook.engine.store import paths
from tinker_cookbook.engine.store.checkpoints import CheckpointIndex
from tinker_cookbook.engine.store.records import CHECKPOINT_FILE


def archive(index: CheckpointIndex, tinker_path: str) -> Path:
    """A .tar of the checkpoint's files (without the store's checkpoint.json), built once and cached."""
    run_id, kind, name, ckpt_dir, record = index.resolve(tinker_path)
    cache_dir = index.layout.archive_dir(index.layout.runs_dir / run_id, kind, name, tinker_path)
    # Keyed by the checkpoint's write time, so an overwritten checkpoint never serves a stale archive.
    stamp = datetime.fromisoformat(record["time"]).strftime("%Y%m%dT%H%M%S%f")
    tar_path = cache_dir / f"{run_id}_{kind}_{name}_{stamp}.tar"
    if paths.is_regular_file(tar_path):
        return tar_path
    cache_dir.mkdir(parents=True, exist_ok=True)
    with atomic_file(tar_path) as tmp, tarfile.open(tmp, "w") as tar:
        for file in sorted(ckpt_dir.rglob("*")):
            if paths.is_regular_file(file) and file.name != CHECKPOINT_FILE:
                tar.add(file, arcname=file.relative_to(ckpt_dir).as_posix(), recursive=False)
    for stale in cache_dir.glob("*.tar"):
        if stale != tar_path:
            remove_path(stale)
    return tar_path
