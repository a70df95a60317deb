"""The run registry: one ``runs/<run_id>/run.json`` per training run (base model, LoRA config, user metadata,
times), created and listed here."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tinker_cookbook.base.atomic_files import fsync_dir, remove_path
from tinker_cookbook.engine import settings
from tinker_cookbook.engine.store import crash_safety, paths, records
from tinker_cookbook.engine.store.layout import RUN_FILE, StoreLayout
from tinker_cookbook.engine.store.names import KIND_TO_TYPE, validate_name
from tinker_cookbook.tinker import errors, types


class RunRegistry:
    """Training runs under a store root; ``checkpoints_of(run_dir)`` lists a run's live checkpoints, newest first
    (for each run's last checkpoints)."""

    def __init__(self, layout: StoreLayout, checkpoints_of: Callable[[Path], list[types.Checkpoint]]) -> None:
        self.layout = layout
        self._checkpoints_of = checkpoints_of

    def run_dir(self, run_id: str, subject: str | None = None) -> Path:
        """The directory of an existing run; NotFoundError if there is none."""
        runs_dir = self.layout.runs_dir
        run_dir = runs_dir / validate_name("run_id", run_id)
        self.layout.checked(run_dir / RUN_FILE, subject or f"training run {run_id!r}")
        if not paths.is_regular_file(run_dir / RUN_FILE):
            known = [name for _, name, _ in self.run_dirs()][:10]
            raise errors.NotFoundError(
                f"training run {run_id!r} not found in {str(runs_dir)!r}; known runs (newest first): "
                f"{', '.join(map(repr, known)) if known else 'none'}. List them with `tinker-cookbook run list` "
                f"(set {settings.HOME_ENV} to use another store)"
            )
        return run_dir

    def create_run(
        self,
        base_model: str,
        lora_config: types.LoraConfig,
        user_metadata: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> str:
        """Register a new training run and return its id (``run-YYYYmmdd-HHMMSS-xxxxxx`` unless given)."""
        if user_metadata is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in user_metadata.items()
        ):
            raise errors.BadRequestError(f"user_metadata={user_metadata!r} must map strings to strings")
        created = records.now()
        record = {
            "base_model": base_model,
            "lora_rank": lora_config.rank,
            "seed": lora_config.seed,
            "train_unembed": lora_config.train_unembed,
            "train_mlp": lora_config.train_mlp,
            "train_attn": lora_config.train_attn,
            "user_metadata": dict(user_metadata) if user_metadata else None,
            "created_time": created.isoformat(),
            "last_request_time": created.isoformat(),
        }
        runs_dir = self.layout.runs_dir
        self.layout.checked(runs_dir, "creating a training run")
        runs_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            candidate = run_id or f"run-{created:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
            run_dir = runs_dir / validate_name("run_id", candidate)
            try:
                run_dir.mkdir()
            except FileExistsError:
                if run_id is not None:
                    raise errors.ConflictError(
                        f"training run {run_id!r} already exists; pass run_id=None for a fresh id"
                    ) from None
                continue
            staging = self.layout.staging(run_dir, f"training run {candidate!r}")
            crash_safety.write_json_atomic(run_dir / RUN_FILE, record, staging)
            fsync_dir(runs_dir)
            return candidate
        raise errors.InternalServerError(f"could not find a free run id under {str(runs_dir)!r}")

    def discard_new_run(self, run_id: str) -> None:
        """Remove a run that was just created and holds no checkpoint (its client could not be built)."""
        run_dir = self.run_dir(run_id)
        if self._checkpoints_of(run_dir):
            raise errors.ConflictError(f"training run {run_id!r} holds checkpoints; it is not discarded")
        remove_path(run_dir)
        fsync_dir(self.layout.runs_dir)

    def touch_run(self, run_id: str) -> None:
        """Record that the run just served a request (shown as last_request_time)."""
        with self.layout.lock:
            record = self.run_record(run_id)
            run_dir = self.layout.runs_dir / run_id
            record["last_request_time"] = records.now().isoformat()
            staging = self.layout.staging(run_dir, f"training run {run_id!r}")
            crash_safety.write_json_atomic(run_dir / RUN_FILE, record, staging)

    def run_record(self, run_id: str) -> dict[str, Any]:
        """The raw ``run.json`` of a run (base model, LoRA config, user metadata, times)."""
        run_dir = self.run_dir(run_id)
        record = paths.read_json(run_dir / RUN_FILE)
        if record is None:
            raise errors.RequestFailedError(
                f"{str(run_dir / RUN_FILE)!r} is unreadable; the run is corrupted"
            )
        return record

    def get_run(self, run_id: str) -> types.TrainingRun:
        return self._training_run(self.run_dir(run_id))

    def list_runs(self, limit: int = 20, offset: int = 0) -> types.TrainingRunsResponse:
        """Training runs, newest first; ``limit=0`` lists all."""
        every = [self._training_run(run_dir) for _, _, run_dir in self.run_dirs()]
        page, cursor = records.paginate(every, limit, offset)
        return types.TrainingRunsResponse(training_runs=page, cursor=cursor)

    def run_dirs(self) -> list[tuple[datetime, str, Path]]:
        """(created time, run id, directory) of every run, newest first; symlinked entries are skipped."""
        runs_dir = self.layout.runs_dir
        self.layout.checked(runs_dir, "listing training runs")
        if not paths.is_real_dir(runs_dir):
            return []
        runs = []
        for entry in os.scandir(runs_dir):
            run_dir = Path(entry.path)
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            if paths.is_regular_file(run_dir / RUN_FILE):
                runs.append((_created_time(run_dir), entry.name, run_dir))
        runs.sort(key=lambda t: (t[0], t[1]), reverse=True)
        return runs

    def _training_run(self, run_dir: Path) -> types.TrainingRun:
        record = paths.read_json(run_dir / RUN_FILE)
        if record is None or "base_model" not in record:
            return types.TrainingRun(
                training_run_id=run_dir.name, base_model="<unreadable run.json>", corrupted=True
            )
        checkpoints = self._checkpoints_of(run_dir)
        last = {
            kind: next((c for c in checkpoints if c.checkpoint_type == ckpt_type), None)
            for kind, ckpt_type in KIND_TO_TYPE.items()
        }
        last_request = record.get("last_request_time")
        return types.TrainingRun(
            training_run_id=run_dir.name,
            base_model=record["base_model"],
            is_lora=True,
            lora_rank=record.get("lora_rank"),
            last_request_time=datetime.fromisoformat(last_request) if last_request else None,
            last_checkpoint=last["weights"],
            last_sampler_checkpoint=last["sampler_weights"],
            user_metadata=record.get("user_metadata"),
        )


def _created_time(run_dir: Path) -> datetime:
    record = paths.read_json(run_dir / RUN_FILE) or {}
    try:
        return datetime.fromisoformat(record["created_time"])
    except (KeyError, TypeError, ValueError):
        return datetime.fromtimestamp((run_dir / RUN_FILE).lstat().st_mtime, UTC)
