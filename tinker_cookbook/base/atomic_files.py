"""Write-then-rename: a file or directory appears complete at its path or not at all, even across a crash.

The content is written under a temporary name in the same filesystem, fsynced (every file, then the directories),
renamed onto the target in one step, and the target's directory fsynced so that the rename itself is durable.
Readers therefore see the old target or the complete new one, never a partial one; a writer that fails or is
killed leaves at most a temporary entry behind, never a half-written target.

- ``atomic_file(target)``: yields a temporary path for the caller to create a file at; replaces ``target``.
- ``atomic_dir(target)``: yields an empty temporary directory to fill; renamed to ``target``. A directory cannot
  replace another non-empty one: if ``target`` already exists, ``is_complete(target)`` decides whether another
  writer's copy is kept (True) or the rename's error is raised.

Nothing here follows a symlink when it syncs or removes (``remove_path``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


def temp_name(target: Path) -> str:
    """A fresh temporary name for ``target``'s content: ``.<name>.tmp-<random>`` (hidden; see ``stale_temps``)."""
    return f".{target.name}.tmp-{uuid.uuid4().hex[:12]}"


def stale_temps(target: Path) -> list[Path]:
    """Temporary entries of ``target`` left beside it by writers that were killed (or are still writing)."""
    return sorted(target.parent.glob(f".{target.name}.tmp-*"))


def fsync_dir(directory: Path) -> None:
    """Make renames and new entries in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):  # filesystems without directory fsync
            raise
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync the regular file ``path``, or every file and directory below the directory ``path``."""
    mode = os.lstat(path).st_mode
    if stat.S_ISDIR(mode):
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                fsync_tree(Path(entry.path))
        fsync_dir(path)
    elif stat.S_ISREG(mode):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_path(path: Path) -> None:
    """Delete ``path`` (a file, a directory tree, or a link) without following symlinks; missing is fine."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        # rmtree never descends into a symlinked directory; where it walks by file descriptor (Linux,
        # ``shutil.rmtree.avoids_symlink_attacks``) not even if the link appears while it runs.
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _publish(tmp: Path, target: Path, is_complete: Callable[[Path], bool] | None) -> None:
    fsync_tree(tmp)
    try:
        if os.path.isdir(tmp):
            os.rename(tmp, target)  # fails if ``target`` is a non-empty directory: never merges two copies
        else:
            os.replace(tmp, target)
    except OSError:
        if is_complete is None or not is_complete(target):
            raise
        return  # another writer's complete copy is in place: keep it, drop ours
    fsync_dir(target.parent)


@contextlib.contextmanager
def atomic_file(target: Path, tmp_dir: Path | None = None, tmp_name: str | None = None) -> Iterator[Path]:
    """A temporary path (in ``tmp_dir``, default ``target``'s directory; same filesystem) for the block to write a
    file at; on success it replaces ``target`` durably. The temporary file is gone afterwards either way."""
    tmp = (tmp_dir or target.parent) / (tmp_name or temp_name(target))
    try:
        yield tmp
        _publish(tmp, target, None)
    finally:
        remove_path(tmp)


@contextlib.contextmanager
def atomic_dir(target: Path, is_complete: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """An empty temporary directory beside ``target`` for the block to fill; on success it is renamed to
    ``target`` durably (an existing ``target`` is kept where ``is_complete(target)``, else the rename's error
    propagates). The temporary directory is gone afterwards either way."""
    tmp = target.parent / temp_name(target)
    tmp.mkdir()
    try:
        yield tmp
        _publish(tmp, target, is_complete)
    finally:
        remove_path(tmp)
