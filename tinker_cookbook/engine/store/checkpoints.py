"""The checkpoints of the store's runs: looked up by ``tinker://`` path, listed, changed and deleted.

A checkpoint directory counts only when it holds a well-formed ``checkpoint.json`` (written last by
``writes``); an expired one is removed the first time it is looked at.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tinker_cookbook.base.atomic_files import remove_path
from tinker_cookbook.engine.store import crash_safety, paths, records
from tinker_cookbook.engine.store.layout import StoreLayout
from tinker_cookbook.engine.store.names import (
    KINDS,
    CheckpointKind,
    kind_mismatch_message,
    normalize_kind,
    parse_tinker_path,
)
from tinker_cookbook.engine.store.records import CHECKPOINT_FILE
from tinker_cookbook.engine.store.runs import RunRegistry
from tinker_cookbook.tinker import errors, types


class CheckpointIndex:
    """Reads, lists and changes checkpoints (every path checked for symlinks before use)."""

    def __init__(self, layout: StoreLayout, runs: RunRegistry) -> None:
        self.layout = layout
        self.runs = runs

    def load(self, run_dir: Path, kind: CheckpointKind, name: str, subject: str) -> dict[str, Any] | None:
        """The checkpoint.json of a complete, unexpired checkpoint, else None (expired ones are removed).

        Raises paths.UnsafeStoreEntryError if the checkpoint's path or any file in it is a symlink.
        """
        ckpt_dir = self.layout.checkpoint_dir(run_dir, kind, name, subject)
        if not paths.is_real_dir(ckpt_dir):
            return None
        paths.check_tree(self.layout.root, ckpt_dir, subject)
        record = records.read_checkpoint_record(ckpt_dir)
        if record is None:
            return None
        if records.expired(record):
            self.remove(run_dir, kind, name, subject)
            return None
        return record

    def remove(self, run_dir: Path, kind: CheckpointKind, name: str, subject: str) -> None:
        """Delete a checkpoint and its cached archives (every path checked before anything is removed)."""
        ckpt_dir = self.layout.checkpoint_dir(run_dir, kind, name, subject)
        archives = self.layout.archive_dir(run_dir, kind, name, subject)
        staging = self.layout.staging(run_dir, subject)
        with self.layout.lock:
            crash_safety.discard(ckpt_dir, staging)
        remove_path(archives)

    def resolve(self, tinker_path: str) -> tuple[str, CheckpointKind, str, Path, dict[str, Any]]:
        """Parse and look up a path: (run_id, kind, name, directory, checkpoint.json)."""
        run_id, kind, name = parse_tinker_path(tinker_path)
        run_dir = self.runs.run_dir(run_id, tinker_path)
        ckpt_dir = self.layout.checkpoint_dir(run_dir, kind, name, tinker_path)
        record = self.load(run_dir, kind, name, tinker_path)
        if record is None:
            # A process killed while overwriting it may have left it as a backup: put that back and look again.
            try:
                self.layout.recover_run(run_dir)
            except paths.UnsafeStoreEntryError:
                pass  # a symlinked staging directory: not what this lookup is about; a write reports it
            record = self.load(run_dir, kind, name, tinker_path)
        if record is None:
            names = [c.tinker_path for c in self.run_checkpoints(run_dir)][:10]
            raise errors.NotFoundError(
                f"checkpoint {tinker_path} not found (never saved, deleted, or expired); checkpoints of run "
                f"{run_id!r}: {names or 'none'}. List them with `tinker-cookbook checkpoint list --run-id {run_id}`"
            )
        return run_id, kind, name, ckpt_dir, record

    def checkpoint_dir(self, tinker_path: str, expected_kind: str | None = None) -> Path:
        """The directory of a complete checkpoint, optionally checking it is of ``expected_kind``."""
        _, kind, _ = parse_tinker_path(tinker_path)
        if expected_kind is not None and normalize_kind(expected_kind) != kind:
            raise errors.BadRequestError(kind_mismatch_message(tinker_path, kind))
        return self.resolve(tinker_path)[3]

    def checkpoint_metadata(self, tinker_path: str) -> dict[str, Any]:
        """The engine's metadata dict stored with the checkpoint."""
        return dict(self.resolve(tinker_path)[4].get("metadata") or {})

    def get_checkpoint(self, tinker_path: str) -> types.Checkpoint:
        run_id, kind, name, _, record = self.resolve(tinker_path)
        return records.checkpoint_from_record(run_id, kind, name, record)

    def _iter_checkpoints(self, run_dir: Path) -> Iterator[types.Checkpoint]:
        """Live checkpoints of a run; entries the store refuses to serve (symlinks) are skipped."""
        for kind in KINDS:
            kind_dir = run_dir / kind
            if not paths.is_real_dir(kind_dir):
                continue
            for entry in os.scandir(kind_dir):
                if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                    continue
                subject = types.format_tinker_path(run_dir.name, kind, entry.name)
                try:
                    record = self.load(run_dir, kind, entry.name, subject)
                except paths.UnsafeStoreEntryError:
                    continue
                if record is not None:
                    yield records.checkpoint_from_record(run_dir.name, kind, entry.name, record)

    def run_checkpoints(self, run_dir: Path) -> list[types.Checkpoint]:
        """All live checkpoints of a run, newest first."""
        return sorted(self._iter_checkpoints(run_dir), key=lambda c: (c.time, c.tinker_path), reverse=True)

    def list_checkpoints(self, run_id: str) -> types.CheckpointsListResponse:
        """The run's checkpoints of both kinds, newest first."""
        checkpoints = self.run_checkpoints(self.runs.run_dir(run_id))
        cursor = types.Cursor(offset=0, limit=len(checkpoints), total_count=len(checkpoints))
        return types.CheckpointsListResponse(checkpoints=checkpoints, cursor=cursor)

    def list_user_checkpoints(self, limit: int = 100, offset: int = 0) -> types.CheckpointsListResponse:
        """Checkpoints of every run, newest first; ``limit=0`` lists all."""
        everything = [c for _, _, run_dir in self.runs.run_dirs() for c in self._iter_checkpoints(run_dir)]
        everything.sort(key=lambda c: (c.time, c.tinker_path), reverse=True)
        page, cursor = records.paginate(everything, limit, offset)
        return types.CheckpointsListResponse(checkpoints=page, cursor=cursor)

    def weights_info(self, tinker_path: str) -> types.WeightsInfoResponse:
        """Base model and LoRA config the checkpoint was trained with."""
        run_id = self.resolve(tinker_path)[0]
        record = self.runs.run_record(run_id)
        return types.WeightsInfoResponse(
            base_model=record["base_model"],
            is_lora=True,
            lora_rank=record.get("lora_rank"),
            train_unembed=record.get("train_unembed"),
            train_mlp=record.get("train_mlp"),
            train_attn=record.get("train_attn"),
        )

    def delete_checkpoint(self, tinker_path: str) -> None:
        with self.layout.lock:
            run_id, kind, name, _, _ = self.resolve(tinker_path)
            self.remove(self.layout.runs_dir / run_id, kind, name, tinker_path)

    def _update_record(self, tinker_path: str, **changes: Any) -> None:
        with self.layout.lock:
            run_id, _, _, ckpt_dir, record = self.resolve(tinker_path)
            staging = self.layout.staging(self.layout.runs_dir / run_id, tinker_path)
            record.update(changes)
            crash_safety.write_json_atomic(ckpt_dir / CHECKPOINT_FILE, record, staging)

    def set_public(self, tinker_path: str, public: bool) -> None:
        self._update_record(tinker_path, public=bool(public))

    def set_ttl(self, tinker_path: str, ttl_seconds: int | None) -> None:
        """Expire the checkpoint ``ttl_seconds`` from now; None keeps it until deleted."""
        expires_at = records.expires_at(ttl_seconds)
        self._update_record(tinker_path, expires_at=expires_at.isoformat() if expires_at else None)
