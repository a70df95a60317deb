"""Write-then-rename (``base.atomic_files``): a target appears complete or not at all, and no temporary is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinker_cookbook.base.atomic_files import atomic_dir, atomic_file, stale_temps


def test_a_file_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "metrics.jsonl"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old\n" and stale_temps(target) == []
    with atomic_file(target) as tmp:
        tmp.write_text("new\n")
    assert target.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


def test_a_directory_keeps_another_writers_complete_copy(tmp_path: Path) -> None:
    target = tmp_path / "cache"

    def complete(directory: Path) -> bool:
        return (directory / "done").exists()

    with atomic_dir(target, is_complete=complete) as tmp:
        (tmp / "done").write_text("first")
    with atomic_dir(target, is_complete=complete) as tmp:  # a second writer that lost the race
        (tmp / "done").write_text("second")
    assert (target / "done").read_text() == "first" and sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    (target / "done").rename(target / "partial")  # now incomplete, not empty: the rename must fail loudly
    with pytest.raises(OSError), atomic_dir(target, is_complete=complete) as tmp:
        (tmp / "done").write_text("third")
    assert stale_temps(target) == []
