"""The local checkpoint store behind ``tinker://`` paths.

Layout under the root (``$TINKER_COOKBOOK_HOME``, default ``~/.tinker_cookbook``)::

    runs/<run_id>/run.json                         base model, LoRA config, user metadata, times
    runs/<run_id>/weights/<name>/                  training state (save_state)
    runs/<run_id>/sampler_weights/<name>/          sampler weights (save_weights_for_sampler)
    runs/<run_id>/.staging/                        saves being written, replaced checkpoints, deletions
    runs/<run_id>/.archives/<kind>/<name>/         cached .tar archives for download

A checkpoint directory holds the engine's files plus ``checkpoint.json``. Writes are atomic: the engine fills a
staging directory, everything is fsynced, ``checkpoint.json`` is written last, and one rename moves the whole
directory into place, so a killed save never leaves a half checkpoint that lists or loads. A directory without
``checkpoint.json`` is never listed or loaded. An overwrite swaps old and new in one atomic exchange where the
filesystem has one; elsewhere the old checkpoint is renamed to a backup first, and a store opened after a kill
between the two renames puts the backup back. Staging entries carry their process id, so opening the store removes
the leftovers of killed processes and never a save still running elsewhere.

Nothing below the root may be a symlink (see ``store.paths``): the store refuses them rather than read or delete
through them. The store only moves files around; it never unpickles anything.
"""

from __future__ import annotations

import json
import os
import secrets
import tarfile
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeAlias

from tinker_cookbook.engine import settings
from tinker_cookbook.engine.store import crash_safety, paths
from tinker_cookbook.tinker import errors, types

CHECKPOINT_FILE = "checkpoint.json"
RUN_FILE = "run.json"
CheckpointKind: TypeAlias = Literal["weights", "sampler_weights"]
KINDS: tuple[CheckpointKind, ...] = ("weights", "sampler_weights")
_KIND_TO_TYPE: dict[str, types.CheckpointType] = {"weights": "training", "sampler_weights": "sampler"}
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_MAX_NAME_LEN = 128


def _now() -> datetime:
    return datetime.now(UTC)


def _validate_name(field: str, value: Any) -> str:
    """Check a run id or checkpoint name: letters, digits, '_', '-', '.', not starting with '.'."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > _MAX_NAME_LEN
        or not set(value) <= _NAME_CHARS
        or value.startswith(".")
    ):
        raise errors.BadRequestError(
            f"{field}={value!r} is not a valid name; use 1-{_MAX_NAME_LEN} letters, digits, '_', '-' or '.' "
            "(not starting with '.'), e.g. 'step_0010'"
        )
    return value


def _normalize_kind(kind: str) -> CheckpointKind:
    """Accept both directory kinds (weights/sampler_weights) and API types (training/sampler)."""
    mapping: dict[str, CheckpointKind] = {
        "weights": "weights",
        "training": "weights",
        "sampler_weights": "sampler_weights",
        "sampler": "sampler_weights",
    }
    if kind not in mapping:
        raise errors.BadRequestError(
            f"kind={kind!r} is not a checkpoint kind; use 'weights' or 'sampler_weights'"
        )
    return mapping[kind]


def parse_tinker_path(tinker_path: Any) -> tuple[str, CheckpointKind, str]:
    """Split ``tinker://<run_id>/(weights|sampler_weights)/<name>`` into (run_id, kind, name).

    Raises BadRequestError for anything else: other schemes, local file paths, extra or missing segments,
    unsafe names.
    """
    try:
        parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
    except ValueError as e:  # the contract's parser names the path, what is wrong and the expected form
        raise errors.BadRequestError(str(e)) from None
    kind_dir, name = parsed.checkpoint_id.split("/", 1)
    try:
        _validate_name("run_id", parsed.training_run_id)
        _validate_name("checkpoint name", name)
    except errors.BadRequestError as e:
        raise errors.BadRequestError(
            f"malformed checkpoint path {tinker_path!r}: {e}; expected tinker://<run_id>/weights/<name> "
            "or tinker://<run_id>/sampler_weights/<name>"
        ) from None
    return parsed.training_run_id, _normalize_kind(kind_dir), name


def make_tinker_path(run_id: str, kind: CheckpointKind, name: str) -> str:
    return f"tinker://{run_id}/{kind}/{name}"


def _read_checkpoint_record(ckpt_dir: Path) -> dict[str, Any] | None:
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


def _expired(record: dict[str, Any]) -> bool:
    expires = record.get("expires_at")
    return expires is not None and datetime.fromisoformat(expires) <= _now()


def _dir_size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if paths.is_regular_file(p))


def _paginate(items: list[Any], limit: int, offset: int) -> tuple[list[Any], types.Cursor]:
    """Slice a full listing; ``limit=0`` means all items."""
    if not isinstance(limit, int) or limit < 0:
        raise errors.BadRequestError(f"limit={limit!r} must be an integer >= 0 (0 means all)")
    if not isinstance(offset, int) or offset < 0:
        raise errors.BadRequestError(f"offset={offset!r} must be an integer >= 0")
    page = items[offset:] if limit == 0 else items[offset : offset + limit]
    cursor = types.Cursor(offset=offset, limit=limit if limit else len(items), total_count=len(items))
    return page, cursor


class CheckpointStore:
    """Runs and checkpoints on the local filesystem, addressed by ``tinker://`` paths.

    Opening a store cleans up after processes that were killed while saving (see the module docstring).
    """

    def __init__(self, root: Path | None = None):
        self.root = Path(root).expanduser() if root is not None else settings.store_home()
        self._lock = threading.RLock()
        self._recover_all()

    # ----------------------------------------------------------------------------------------------------------
    # Paths: every one is checked to have no symlink below the root before it is used
    # ----------------------------------------------------------------------------------------------------------

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    def _checked(self, path: Path, subject: str) -> Path:
        return paths.check_no_symlinks(self.root, path, subject)

    def _run_dir(self, run_id: str, subject: str | None = None) -> Path:
        """The directory of an existing run; NotFoundError if there is none."""
        run_dir = self.runs_dir / _validate_name("run_id", run_id)
        self._checked(run_dir / RUN_FILE, subject or f"training run {run_id!r}")
        if not paths.is_regular_file(run_dir / RUN_FILE):
            known = [name for _, name, _ in self._run_dirs()][:10]
            raise errors.NotFoundError(
                f"training run {run_id!r} not found in {str(self.runs_dir)!r}; known runs (newest first): "
                f"{', '.join(map(repr, known)) if known else 'none'}. List them with `tinker-cookbook run list` "
                f"(set {settings.HOME_ENV} to use another store)"
            )
        return run_dir

    def _staging(self, run_dir: Path, subject: str) -> Path:
        """The run's staging directory, created if missing."""
        staging = self._checked(run_dir / ".staging", subject)
        staging.mkdir(exist_ok=True)
        return staging

    def _archive_dir(self, run_dir: Path, kind: CheckpointKind, name: str, subject: str) -> Path:
        return self._checked(run_dir / ".archives" / kind / name, subject)

    # ----------------------------------------------------------------------------------------------------------
    # Leftovers of killed processes
    # ----------------------------------------------------------------------------------------------------------

    def _recover_all(self) -> None:
        """Clean every run's staging directory; best effort, since a read-only store must still open."""
        try:
            self._checked(self.runs_dir, "opening the store")
            run_dirs = [Path(e.path) for e in os.scandir(self.runs_dir) if e.is_dir(follow_symlinks=False)]
        except (OSError, paths.UnsafeStoreEntryError):
            return  # missing, unreadable or symlinked: every later use reports it
        for run_dir in run_dirs:
            try:
                self._recover_run(run_dir)
            except (OSError, paths.UnsafeStoreEntryError):
                continue

    def _recover_run(self, run_dir: Path) -> None:
        """Remove stale staging entries; put back a checkpoint whose overwrite was killed between its renames."""
        staging = self._checked(run_dir / ".staging", "cleaning up killed saves")
        if not paths.is_real_dir(staging):
            return

        def backup_target(entry: crash_safety.StagingEntry) -> Path | None:
            """Where a backup goes back to; None keeps it (it may be the only copy): a person should look."""
            kind, name = (*entry.target, "", "")[:2]
            try:
                path = run_dir / _normalize_kind(kind) / _validate_name("name", name)
                return self._checked(path, "restoring a killed overwrite")
            except (errors.BadRequestError, paths.UnsafeStoreEntryError):
                return None

        with self._lock:
            crash_safety.clean_staging(staging, backup_target, CHECKPOINT_FILE)

    # ----------------------------------------------------------------------------------------------------------
    # Runs
    # ----------------------------------------------------------------------------------------------------------

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
        created = _now()
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
        self._checked(self.runs_dir, "creating a training run")
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            candidate = run_id or f"run-{created:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
            run_dir = self.runs_dir / _validate_name("run_id", candidate)
            try:
                run_dir.mkdir()
            except FileExistsError:
                if run_id is not None:
                    raise errors.ConflictError(
                        f"training run {run_id!r} already exists; pass run_id=None for a fresh id"
                    ) from None
                continue
            crash_safety.write_json_atomic(run_dir / RUN_FILE, record, self._staging(run_dir, f"training run {candidate!r}"))
            crash_safety.fsync_dir(self.runs_dir)
            return candidate
        raise errors.InternalServerError(f"could not find a free run id under {str(self.runs_dir)!r}")

    def touch_run(self, run_id: str) -> None:
        """Record that the run just served a request (shown as last_request_time)."""
        with self._lock:
            record = self.run_record(run_id)
            run_dir = self.runs_dir / run_id
            record["last_request_time"] = _now().isoformat()
            crash_safety.write_json_atomic(run_dir / RUN_FILE, record, self._staging(run_dir, f"training run {run_id!r}"))

    def run_record(self, run_id: str) -> dict[str, Any]:
        """The raw ``run.json`` of a run (base model, LoRA config, user metadata, times)."""
        run_dir = self._run_dir(run_id)
        record = paths.read_json(run_dir / RUN_FILE)
        if record is None:
            raise errors.RequestFailedError(
                f"{str(run_dir / RUN_FILE)!r} is unreadable; the run is corrupted"
            )
        return record

    def get_run(self, run_id: str) -> types.TrainingRun:
        return self._training_run(self._run_dir(run_id))

    def list_runs(self, limit: int = 20, offset: int = 0) -> types.TrainingRunsResponse:
        """Training runs, newest first; ``limit=0`` lists all."""
        page, cursor = _paginate(self._all_runs(), limit, offset)
        return types.TrainingRunsResponse(training_runs=page, cursor=cursor)

    def _run_dirs(self) -> list[tuple[datetime, str, Path]]:
        """(created time, run id, directory) of every run, newest first; symlinked entries are skipped."""
        self._checked(self.runs_dir, "listing training runs")
        if not paths.is_real_dir(self.runs_dir):
            return []
        runs = []
        for entry in os.scandir(self.runs_dir):
            run_dir = Path(entry.path)
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            if paths.is_regular_file(run_dir / RUN_FILE):
                runs.append((self._created_time(run_dir), entry.name, run_dir))
        runs.sort(key=lambda t: (t[0], t[1]), reverse=True)
        return runs

    def _all_runs(self) -> list[types.TrainingRun]:
        return [self._training_run(run_dir) for _, _, run_dir in self._run_dirs()]

    @staticmethod
    def _created_time(run_dir: Path) -> datetime:
        record = paths.read_json(run_dir / RUN_FILE) or {}
        try:
            return datetime.fromisoformat(record["created_time"])
        except (KeyError, TypeError, ValueError):
            return datetime.fromtimestamp((run_dir / RUN_FILE).lstat().st_mtime, UTC)

    def _training_run(self, run_dir: Path) -> types.TrainingRun:
        record = paths.read_json(run_dir / RUN_FILE)
        if record is None or "base_model" not in record:
            return types.TrainingRun(
                training_run_id=run_dir.name, base_model="<unreadable run.json>", corrupted=True
            )
        checkpoints = self._run_checkpoints(run_dir)
        last = {
            kind: next((c for c in checkpoints if c.checkpoint_type == ckpt_type), None)
            for kind, ckpt_type in _KIND_TO_TYPE.items()
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

    # ----------------------------------------------------------------------------------------------------------
    # Writing checkpoints
    # ----------------------------------------------------------------------------------------------------------

    def write_checkpoint(
        self,
        run_id: str,
        kind: CheckpointKind,
        name: str,
        writer: Callable[[Path], None],
        metadata: dict[str, Any],
        ttl_seconds: int | None = None,
        overwrite: bool = False,
    ) -> types.Checkpoint:
        """Create ``tinker://<run_id>/<kind>/<name>`` atomically.

        ``writer`` fills the staging directory it is given with the engine's files (safetensors, JSON). If it
        raises, the staging directory is removed and nothing becomes visible. An existing checkpoint of the same
        name is a ConflictError unless ``overwrite=True``, in which case it is replaced as a whole: a kill at any
        moment leaves the old or the new checkpoint loadable.
        """
        kind = _normalize_kind(kind)
        _validate_name("name", name)
        try:
            json.dumps(metadata)
        except (TypeError, ValueError) as e:
            raise TypeError(f"checkpoint metadata must be JSON-serializable, got {metadata!r}: {e}") from None
        expires_at = self._expires_at(ttl_seconds)
        tinker_path = make_tinker_path(run_id, kind, name)
        run_dir = self._run_dir(run_id, tinker_path)
        # Check every path this save touches before the engine spends time writing.
        target = self._checked(run_dir / kind / name, tinker_path)
        archives = self._archive_dir(run_dir, kind, name, tinker_path)
        staging = self._staging(run_dir, tinker_path)
        if self._load_checkpoint(run_dir, kind, name, tinker_path) is not None and not overwrite:
            raise self._conflict(tinker_path)
        self._recover_run(run_dir)
        tmp = staging / crash_safety.staging_name("new", kind, name)
        tmp.mkdir()
        try:
            writer(tmp)
            paths.check_tree(self.root, tmp, tinker_path)
            crash_safety.fsync_tree(tmp)
            record = {
                "checkpoint_type": _KIND_TO_TYPE[kind],
                "time": _now().isoformat(),
                "size_bytes": _dir_size(tmp),
                "public": False,
                "expires_at": expires_at.isoformat() if expires_at else None,
                "metadata": metadata,
            }
            # checkpoint.json last: its presence is what marks the directory complete.
            crash_safety.write_json_atomic(tmp / CHECKPOINT_FILE, record, staging)
            self._move_into_place(tmp, target, tinker_path, overwrite, staging)
        finally:
            paths.remove_tree(tmp)  # a failed save, or the old checkpoint after an exchange
        paths.remove_tree(archives)
        self.touch_run(run_id)
        return self._checkpoint_from_record(run_id, kind, name, record)

    @staticmethod
    def _conflict(tinker_path: str) -> errors.ConflictError:
        return errors.ConflictError(
            f"checkpoint {tinker_path} already exists; choose another name or pass overwrite=True to replace it"
        )

    def _move_into_place(self, tmp: Path, target: Path, tinker_path: str, overwrite: bool, staging: Path) -> None:
        with self._lock:
            target.parent.mkdir(exist_ok=True)
            exists = os.path.lexists(self._checked(target, tinker_path))
            if exists:
                if not paths.is_real_dir(target):
                    raise paths.unsafe_entry(self.root, target, tinker_path)
                record = _read_checkpoint_record(target)
                if record is not None and not _expired(record) and not overwrite:
                    raise self._conflict(tinker_path)
            try:
                if exists:
                    crash_safety.replace_dir(tmp, target, staging, CHECKPOINT_FILE)
                else:
                    os.rename(tmp, target)
            except OSError as e:  # another process created the same checkpoint in the meantime
                if paths.is_regular_file(target / CHECKPOINT_FILE):
                    raise errors.ConflictError(f"checkpoint {tinker_path} was written concurrently: {e}") from None
                raise
            crash_safety.fsync_dir(target.parent)
            crash_safety.fsync_dir(staging)

    @staticmethod
    def _expires_at(ttl_seconds: int | None) -> datetime | None:
        if ttl_seconds is None:
            return None
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds <= 0:
            raise errors.BadRequestError(
                f"ttl_seconds={ttl_seconds!r} must be a positive integer number of seconds, or None to keep "
                "the checkpoint until it is deleted"
            )
        return _now() + timedelta(seconds=ttl_seconds)

    # ----------------------------------------------------------------------------------------------------------
    # Reading checkpoints
    # ----------------------------------------------------------------------------------------------------------

    def _load_checkpoint(
        self, run_dir: Path, kind: CheckpointKind, name: str, subject: str
    ) -> dict[str, Any] | None:
        """The checkpoint.json of a complete, unexpired checkpoint, else None (expired ones are removed).

        Raises paths.UnsafeStoreEntryError if the checkpoint's path or any file in it is a symlink.
        """
        ckpt_dir = self._checked(run_dir / kind / name, subject)
        if not paths.is_real_dir(ckpt_dir):
            return None
        paths.check_tree(self.root, ckpt_dir, subject)
        record = _read_checkpoint_record(ckpt_dir)
        if record is None:
            return None
        if _expired(record):
            self._remove_checkpoint(run_dir, kind, name, subject)
            return None
        return record

    def _remove_checkpoint(self, run_dir: Path, kind: CheckpointKind, name: str, subject: str) -> None:
        """Delete a checkpoint and its cached archives (every path checked before anything is removed)."""
        ckpt_dir = self._checked(run_dir / kind / name, subject)
        archives = self._archive_dir(run_dir, kind, name, subject)
        staging = self._staging(run_dir, subject)
        with self._lock:
            crash_safety.discard(ckpt_dir, staging)
        paths.remove_tree(archives)

    def _resolve(self, tinker_path: str) -> tuple[str, CheckpointKind, str, Path, dict[str, Any]]:
        """Parse and look up a path: (run_id, kind, name, directory, checkpoint.json)."""
        run_id, kind, name = parse_tinker_path(tinker_path)
        run_dir = self._run_dir(run_id, tinker_path)
        ckpt_dir = self._checked(run_dir / kind / name, tinker_path)
        record = self._load_checkpoint(run_dir, kind, name, tinker_path)
        if record is None:
            # A process killed while overwriting it may have left it as a backup: put that back and look again.
            try:
                self._recover_run(run_dir)
            except paths.UnsafeStoreEntryError:
                pass  # a symlinked staging directory: not what this lookup is about; a write reports it
            record = self._load_checkpoint(run_dir, kind, name, tinker_path)
        if record is None:
            names = [c.tinker_path for c in self._run_checkpoints(run_dir)][:10]
            raise errors.NotFoundError(
                f"checkpoint {tinker_path} not found (never saved, deleted, or expired); checkpoints of run "
                f"{run_id!r}: {names or 'none'}. List them with `tinker-cookbook checkpoint list --run-id {run_id}`"
            )
        return run_id, kind, name, ckpt_dir, record

    def checkpoint_dir(self, tinker_path: str, expected_kind: str | None = None) -> Path:
        """The directory of a complete checkpoint, optionally checking it is of ``expected_kind``."""
        _, kind, _ = parse_tinker_path(tinker_path)
        if expected_kind is not None and _normalize_kind(expected_kind) != kind:
            raise errors.BadRequestError(self._kind_mismatch_message(tinker_path, kind))
        return self._resolve(tinker_path)[3]

    @staticmethod
    def _kind_mismatch_message(tinker_path: str, kind: CheckpointKind) -> str:
        if kind == "weights":
            return (
                f"{tinker_path} is a training state (from save_state); sampling needs a sampler_weights/ path "
                "from save_weights_for_sampler"
            )
        return (
            f"{tinker_path} holds sampler weights (from save_weights_for_sampler) without optimizer state; "
            "load_state and create_training_client_from_state need a weights/ path from save_state"
        )

    def checkpoint_metadata(self, tinker_path: str) -> dict[str, Any]:
        """The engine's metadata dict stored with the checkpoint."""
        return dict(self._resolve(tinker_path)[4].get("metadata") or {})

    def get_checkpoint(self, tinker_path: str) -> types.Checkpoint:
        run_id, kind, name, _, record = self._resolve(tinker_path)
        return self._checkpoint_from_record(run_id, kind, name, record)

    @staticmethod
    def _checkpoint_from_record(
        run_id: str, kind: CheckpointKind, name: str, record: dict[str, Any]
    ) -> types.Checkpoint:
        expires = record.get("expires_at")
        return types.Checkpoint(
            checkpoint_id=f"{kind}/{name}",
            checkpoint_type=_KIND_TO_TYPE[kind],
            time=datetime.fromisoformat(record["time"]),
            tinker_path=make_tinker_path(run_id, kind, name),
            size_bytes=record.get("size_bytes"),
            public=bool(record.get("public", False)),
            expires_at=datetime.fromisoformat(expires) if expires else None,
        )

    def _iter_checkpoints(self, run_dir: Path) -> Iterator[types.Checkpoint]:
        """Live checkpoints of a run; entries the store refuses to serve (symlinks) are skipped."""
        for kind in KINDS:
            kind_dir = run_dir / kind
            if not paths.is_real_dir(kind_dir):
                continue
            for entry in os.scandir(kind_dir):
                if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                    continue
                subject = make_tinker_path(run_dir.name, kind, entry.name)
                try:
                    record = self._load_checkpoint(run_dir, kind, entry.name, subject)
                except paths.UnsafeStoreEntryError:
                    continue
                if record is not None:
                    yield self._checkpoint_from_record(run_dir.name, kind, entry.name, record)

    def _run_checkpoints(self, run_dir: Path) -> list[types.Checkpoint]:
        """All live checkpoints of a run, newest first."""
        return sorted(self._iter_checkpoints(run_dir), key=lambda c: (c.time, c.tinker_path), reverse=True)

    def list_checkpoints(self, run_id: str) -> types.CheckpointsListResponse:
        """The run's checkpoints of both kinds, newest first."""
        checkpoints = self._run_checkpoints(self._run_dir(run_id))
        cursor = types.Cursor(offset=0, limit=len(checkpoints), total_count=len(checkpoints))
        return types.CheckpointsListResponse(checkpoints=checkpoints, cursor=cursor)

    def list_user_checkpoints(self, limit: int = 100, offset: int = 0) -> types.CheckpointsListResponse:
        """Checkpoints of every run, newest first; ``limit=0`` lists all."""
        everything = [c for _, _, run_dir in self._run_dirs() for c in self._iter_checkpoints(run_dir)]
        everything.sort(key=lambda c: (c.time, c.tinker_path), reverse=True)
        page, cursor = _paginate(everything, limit, offset)
        return types.CheckpointsListResponse(checkpoints=page, cursor=cursor)

    def weights_info(self, tinker_path: str) -> types.WeightsInfoResponse:
        """Base model and LoRA config the checkpoint was trained with."""
        run_id = self._resolve(tinker_path)[0]
        record = self.run_record(run_id)
        return types.WeightsInfoResponse(
            base_model=record["base_model"],
            is_lora=True,
            lora_rank=record.get("lora_rank"),
            train_unembed=record.get("train_unembed"),
            train_mlp=record.get("train_mlp"),
            train_attn=record.get("train_attn"),
        )

    # ----------------------------------------------------------------------------------------------------------
    # Changing checkpoints
    # ----------------------------------------------------------------------------------------------------------

    def delete_checkpoint(self, tinker_path: str) -> None:
        with self._lock:
            run_id, kind, name, _, _ = self._resolve(tinker_path)
            self._remove_checkpoint(self.runs_dir / run_id, kind, name, tinker_path)

    def _update_record(self, tinker_path: str, **changes: Any) -> None:
        with self._lock:
            run_id, _, _, ckpt_dir, record = self._resolve(tinker_path)
            staging = self._staging(self.runs_dir / run_id, tinker_path)
            record.update(changes)
            crash_safety.write_json_atomic(ckpt_dir / CHECKPOINT_FILE, record, staging)

    def set_public(self, tinker_path: str, public: bool) -> None:
        self._update_record(tinker_path, public=bool(public))

    def set_ttl(self, tinker_path: str, ttl_seconds: int | None) -> None:
        """Expire the checkpoint ``ttl_seconds`` from now; None keeps it until deleted."""
        expires_at = self._expires_at(ttl_seconds)
        self._update_record(tinker_path, expires_at=expires_at.isoformat() if expires_at else None)

    def archive(self, tinker_path: str) -> Path:
        """A .tar of the checkpoint's files (without the store's checkpoint.json), built once and cached."""
        run_id, kind, name, ckpt_dir, record = self._resolve(tinker_path)
        cache_dir = self._archive_dir(self.runs_dir / run_id, kind, name, tinker_path)
        # Keyed by the checkpoint's write time, so an overwritten checkpoint never serves a stale archive.
        stamp = datetime.fromisoformat(record["time"]).strftime("%Y%m%dT%H%M%S%f")
        tar_path = cache_dir / f"{run_id}_{kind}_{name}_{stamp}.tar"
        if paths.is_regular_file(tar_path):
            return tar_path
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache_dir / f".{uuid.uuid4().hex}.tmp"
        try:
            with tarfile.open(tmp, "w") as tar:
                for file in sorted(ckpt_dir.rglob("*")):
                    if paths.is_regular_file(file) and file.name != CHECKPOINT_FILE:
                        tar.add(file, arcname=file.relative_to(ckpt_dir).as_posix(), recursive=False)
            os.replace(tmp, tar_path)
        finally:
            paths.remove_tree(tmp)
        for stale in cache_dir.glob("*.tar"):
            if stale != tar_path:
                paths.remove_tree(stale)
        return tar_path
