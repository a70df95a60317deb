"""Where exported weights are written: a complete folder or file at the output path, or nothing at all.

Everything is written under a temporary name beside the target and renamed into place at the end
(``base.atomic_files``), so a run that fails half-way (a disk that fills up, Ctrl-C, a crash) never leaves an
output that looks complete. An existing output is refused unless ``force`` is given, and then replaced only once
the new one is complete.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

from tinker_cookbook.base.atomic_files import atomic_dir, atomic_file, remove_path
from tinker_cookbook.exceptions import ConfigurationError, WeightsError


def check_target(target: Path, force: bool, flag: str = "--force") -> None:
    """Refuse an existing ``target`` unless ``force``: before any slow work starts."""
    if target.exists() and not force:
        raise ConfigurationError(f"output {str(target)!r} already exists; pass {flag} (force=True) to replace it, "
                                 "or choose another output path")


@contextlib.contextmanager
def _disk_errors(target: Path) -> Iterator[None]:
    try:
        yield
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise WeightsError(f"the disk filled up while writing {str(target)!r} ({error.strerror}); nothing was "
                               "left at that path: free some space (or choose another output path) and run again"
                               ) from error
        raise


@contextlib.contextmanager
def output_dir(target: Path, force: bool) -> Iterator[Path]:
    """An empty temporary folder to fill; renamed to ``target`` (replacing it when ``force``) when the block ends."""
    check_target(target, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _disk_errors(target), atomic_dir(target) as tmp:
        yield tmp
        if target.exists():  # only with force: the old output goes once the new one is complete
            remove_path(target)


@contextlib.contextmanager
def output_file(target: Path, force: bool) -> Iterator[Path]:
    """A temporary path to write a file at; it replaces ``target`` when the block ends."""
    check_target(target, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _disk_errors(target), atomic_file(target) as tmp:
        yield tmp
