"""Crash safety for the checkpoint store: durable writes, atomic swaps, and cleaning up after killed processes.

Every temporary entry lives in a run's ``.staging`` directory under a name that carries its role and the id of the
process that made it (``<role>+<pid>+<random>+<target...>``). An entry whose process is gone is a leftover of a
kill: opening the store removes it, or, for the backup of a killed overwrite, puts it back in place. Entries of
live processes are never touched, so a save running in another process is safe from a concurrent open.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tinker_cookbook.base.atomic_files import atomic_file, fsync_dir, remove_path
from tinker_cookbook.engine.store import paths

# A staging entry this old is stale even if a process with its pid is alive: pids get reused, and no save takes
# a day. Entries of dead processes are stale at once.
STALE_SECONDS = 24 * 3600
# '+' is not allowed in run ids or checkpoint names, so it separates the fields of a staging entry's name.
_SEP = "+"


# -------------------------------------------------------------------------------------------------------------
# Durability
# -------------------------------------------------------------------------------------------------------------


def write_json_atomic(path: Path, data: dict[str, Any], staging: Path) -> None:
    """Write JSON via a file in ``staging``: readers see the old or the new file, never a partial one."""
    with atomic_file(path, tmp_dir=staging, tmp_name=staging_name("tmp", path.name)) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)


# -------------------------------------------------------------------------------------------------------------
# Atomic directory exchange
# -------------------------------------------------------------------------------------------------------------

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # from <linux/fs.h>
_renameat2: Any = None


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False where the C library, kernel or filesystem has no exchange, so callers can fall back.
    """
    global _renameat2
    if _renameat2 is None:
        try:
            _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
            _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _renameat2.restype = ctypes.c_int
        except (AttributeError, OSError, TypeError):  # no such C function here (glibc < 2.28, macOS, ...)
            _renameat2 = False
    if not _renameat2:
        return False
    result = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


# -------------------------------------------------------------------------------------------------------------
# Staging entries: named after their owner so a later open can tell a killed save from a live one
# -------------------------------------------------------------------------------------------------------------


class StagingEntry(NamedTuple):
    role: str
    """'new' (a save being written), 'old' (the checkpoint an overwrite replaces), 'trash', or 'tmp'."""
    pid: int
    created: int
    """Unix time the entry got this name. Not the directory's mtime: a backup keeps its old checkpoint's."""
    target: tuple[str, ...]
    """For 'new' and 'old': (kind, name) of the checkpoint; for 'tmp': the file name."""


def staging_name(role: str, *target: str) -> str:
    """``<role>+<pid>+<unix time>+<random>+<target...>``."""
    return _SEP.join((role, str(os.getpid()), str(int(time.time())), uuid.uuid4().hex[:8], *target))


def parse_staging_name(name: str) -> StagingEntry | None:
    role, _, rest = name.partition(_SEP)
    fields = rest.split(_SEP)
    if role not in ("new", "old", "trash", "tmp") or len(fields) < 3 or not all(f.isdigit() for f in fields[:2]):
        return None
    return StagingEntry(role, int(fields[0]), int(fields[1]), tuple(fields[3:]))


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    except OverflowError:
        return False
    return True


def is_stale(path: Path, entry: StagingEntry | None) -> bool:
    """Whether a staging entry is a leftover: its process is gone, or it is older than any save takes."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(info.st_mode):
        return True  # the store never makes links, so no live save owns this one
    if entry is None:  # not named by this store (or by an older version of it): judge by age alone
        return time.time() - info.st_mtime > STALE_SECONDS
    return time.time() - entry.created > STALE_SECONDS or not _pid_alive(entry.pid)


# -------------------------------------------------------------------------------------------------------------
# Moving directories into place and out of the way
# -------------------------------------------------------------------------------------------------------------


def discard(path: Path, staging: Path) -> None:
    """Delete ``path``, renamed into ``staging`` first so it vanishes at once and no other process moves it."""
    trash = staging / staging_name("trash")
    try:
        os.rename(path, trash)
    except FileNotFoundError:  # nothing there, or someone else removed it first
        return
    remove_path(trash)


def replace_dir(new: Path, target: Path, staging: Path, complete_marker: str) -> None:
    """Put the directory ``new`` in place of the existing directory ``target``; a kill never loses both.

    The exchange is atomic, after which ``new`` holds the old directory for the caller to delete. Without one,
    the old directory is renamed to a backup named for its target, then the new one renamed in; a kill between
    the two leaves the backup for :func:`clean_staging` to restore. Raises FileExistsError if another process put
    a complete directory (one holding ``complete_marker``) at ``target`` meanwhile.
    """
    if exchange(new, target):
        return
    backup = staging / staging_name("old", target.parent.name, target.name)
    os.rename(target, backup)
    try:
        os.rename(new, target)
    except OSError as e:
        if not paths.is_regular_file(target / complete_marker):  # nothing took its place: put it back
            os.rename(backup, target)
            raise
        remove_path(backup)
        raise FileExistsError(e.errno, f"{target} was written concurrently") from e
    fsync_dir(target.parent)  # the new one is durably in place before the old one goes
    remove_path(backup)


def clean_staging(staging: Path, backup_target: Callable[[StagingEntry], Path | None], complete_marker: str) -> None:
    """Remove the leftovers of dead processes from ``staging``; restore a killed overwrite's backup.

    ``backup_target`` maps a backup to the directory it was moved away from (None: leave the backup alone). The
    backup goes back unless a complete directory (holding ``complete_marker``) is there now.
    """
    for dir_entry in os.scandir(staging):
        path = Path(dir_entry.path)
        entry = parse_staging_name(dir_entry.name)
        if not is_stale(path, entry):
            continue
        if entry is None or entry.role != "old" or not paths.is_real_dir(path):
            remove_path(path)
            continue
        target = backup_target(entry)
        if target is None:
            continue
        if not paths.is_regular_file(target / complete_marker):
            discard(target, staging)  # debris of an incomplete directory, if any
            target.parent.mkdir(exist_ok=True)
            try:
                os.rename(path, target)
                fsync_dir(target.parent)
                continue
            except OSError:
                pass  # another process restored it, or saved a new one, first
        discard(path, staging)
