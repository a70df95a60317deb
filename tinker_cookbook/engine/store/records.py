"""A checkpoint's record (``checkpoint.json``): times, expiry, size, and its API form; listing pages.

``now`` is the store's one clock (tests move it to expire checkpoints): call it as ``records.now()``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tinker_cookbook.engine.store import paths
from tinker_cookbook.engine.store.names import KIND_TO_TYPE, CheckpointKind
from tinker_cookbook.tinker import errors, types

CHECKPOINT_FILE = "checkpoint.json"


def now() -> datetime:
    return datetime.now(UTC)


def read_checkpoint_record(ckpt_dir: Path) -> dict[str, Any] | None:
    """checkpoint.json if present and well-formed (parseable time and expires_at), else None."""
    record = paths.read_json(ckpt_dir / CHECKPOINT_FILE)
    if record is None:
        return None
    try:
        datetime.fromisoformat(record["time"])
        if record.get("expires_at") is not None:
            datetime.fromisoformat(record["expires_at"])
    except (KeyError, TypeError, ValueError):
        return None  # hand-edited or foreign: not a checkpoint this store can serve
    return record


def expired(record: dict[str, Any]) -> bool:
    expires = record.get("expires_at")
    return expires is not None and datetime.fromisoformat(expires) <= now()


MAX_TTL_SECONDS = 100 * 365 * 24 * 3600
"""A century: longer TTLs would overflow the date arithmetic (year 9999) and mean "keep it", which is None."""


def expires_at(ttl_seconds: int | None) -> datetime | None:
    """When a checkpoint given ``ttl_seconds`` from now expires (None: never); BadRequestError if invalid."""
    if ttl_seconds is None:
        return None
    if (isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int)
            or not 0 < ttl_seconds <= MAX_TTL_SECONDS):
        raise errors.BadRequestError(
            f"ttl_seconds={ttl_seconds!r} must be a positive integer number of seconds up to {MAX_TTL_SECONDS} "
            "(100 years), or None to keep the checkpoint until it is deleted"
        )
    return now() + timedelta(seconds=ttl_seconds)


def dir_size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if paths.is_regular_file(p))


def new_record(kind: CheckpointKind, size_bytes: int, expires: datetime | None, metadata: dict[str, Any]
               ) -> dict[str, Any]:
    """The checkpoint.json of a checkpoint being written now."""
    return {
        "checkpoint_type": KIND_TO_TYPE[kind],
        "time": now().isoformat(),
        "size_bytes": size_bytes,
        "public": False,
        "expires_at": expires.isoformat() if expires else None,
        "metadata": metadata,
    }


def checkpoint_from_record(run_id: str, kind: CheckpointKind, name: str, record: dict[str, Any]) -> types.Checkpoint:
    expires = record.get("expires_at")
    return types.Checkpoint(
        checkpoint_id=f"{kind}/{name}",
        checkpoint_type=KIND_TO_TYPE[kind],
        time=datetime.fromisoformat(record["time"]),
        tinker_path=types.format_tinker_path(run_id, kind, name),
        size_bytes=record.get("size_bytes"),
        public=bool(record.get("public", False)),
        expires_at=datetime.fromisoformat(expires) if expires else None,
    )


def paginate(items: list[Any], limit: int, offset: int) -> tuple[list[Any], types.Cursor]:
    """Slice a full listing; ``limit=0`` means all items."""
    if not isinstance(limit, int) or limit < 0:
        raise errors.BadRequestError(f"limit={limit!r} must be an integer >= 0 (0 means all)")
    if not isinstance(offset, int) or offset < 0:
        raise errors.BadRequestError(f"offset={offset!r} must be an integer >= 0")
    page = items[offset:] if limit == 0 else items[offset : offset + limit]
    cursor = types.Cursor(offset=offset, limit=limit if limit else len(items), total_count=len(items))
    return page, cursor
