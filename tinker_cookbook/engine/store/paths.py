"""Path safety for the checkpoint store: nothing below its root may be a symlink.

The store never follows a symlink below its root. A symlink planted there (by hand, by a tool, by copying a store
with links) would let reads come from, and deletes reach, files outside the store, so every path is checked
component by component with ``lstat`` before use and refused with :class:`UnsafeStoreEntryError`. Deletion goes
through ``base.atomic_files.remove_path``, whose directory walk never follows a link even if one appears after the check.

The root itself may be a symlink: where the store lives is the user's choice.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from tinker_cookbook.tinker import errors


class UnsafeStoreEntryError(errors.ConflictError, errors.RequestFailedError):
    """An entry inside the checkpoint store is a symlink (or another non-regular file); the store refuses it.

    A conflict with the store's state (status 409, a 4xx: the request is refused, nothing failed), and still a
    ``RequestFailedError`` for callers that catch that."""


def unsafe_entry(root: Path, entry: Path, subject: str) -> UnsafeStoreEntryError:
    relative = entry.relative_to(root).as_posix()
    return UnsafeStoreEntryError(
        f"{subject}: {relative!r} in the checkpoint store {str(root)!r} is a symlink or special file; the store "
        "never follows symlinks, since reads and deletes through them would reach outside the store; remove it "
        "(or replace it with the real directory or file)"
    )


def check_no_symlinks(root: Path, path: Path, subject: str) -> Path:
    """``path`` (below ``root``) if none of its existing components below the root is a symlink.

    Components that do not exist yet are fine: the store creates them as real directories.
    """
    relative = path.relative_to(root)
    if any(part in ("", ".", "..") for part in relative.parts):
        raise ValueError(f"store path {path} is not normalized")  # a bug: callers join validated names only
    current = root
    for part in relative.parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return path
        if stat.S_ISLNK(mode):
            raise unsafe_entry(root, current, subject)
    return path


def check_tree(root: Path, directory: Path, subject: str) -> None:
    """Everything below ``directory`` is a real directory or a regular file (no symlinks, fifos, devices)."""
    for entry in os.scandir(directory):
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            check_tree(root, Path(entry.path), subject)
        elif not stat.S_ISREG(mode):
            raise unsafe_entry(root, Path(entry.path), subject)


def is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def is_regular_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in the regular file ``path`` (never through a symlink), or None if missing or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
