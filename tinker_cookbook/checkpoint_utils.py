"""``checkpoints.jsonl``: the record of a run's saved checkpoints, and resuming from it.

Each save appends one JSON object per line to ``<log_path>/checkpoints.jsonl``::

    {"name": "000020", "step": 20, "epoch": 0, "batch": 20,
     "state_path": "tinker://<run>/weights/000020", "sampler_path": "tinker://<run>/sampler_weights/000020"}

The semantics, which every loop in this package follows:

- A row describes the state **after** ``step`` optimizer steps have completed (``step`` counts finished steps),
  and the loop state to continue from: for the supervised loop ``(epoch, batch)`` is the *next* batch to train.
  The loops save only once the step's ``optim_step`` is done and before the next step's requests are queued, so
  the saved weights and the recorded position always agree.
- A row is appended only after its save requests have completed, so a run killed during a save never leaves a
  row that points to a missing or half-written checkpoint; it resumes from the row before.
- ``"final": true`` marks the checkpoint at the planned end of a run; re-running a finished run is a no-op.
- Resuming = the last row that has ``state_path`` (``get_last_checkpoint``), loaded with
  ``ServiceClient.create_training_client_from_state_with_optimizer`` (weights and Adam state).

Every loop resumes the same way, through ``resume_point`` and ``ResumePoint.begin`` (the loops, by way of
``run_core``, and the flat recipes): the log-dir policy (``cli_utils.check_log_dir``) decides whether an existing run is kept; a kept
run must have been started with the same model, data and adapter shape (else ``ConfigurationError`` naming each
differing field); it continues from its last complete checkpoint; a run that already reached its last step is a
no-op; and the ``metrics.jsonl`` rows logged after that checkpoint by the interrupted attempt are dropped, since the
resumed run logs those steps again. So a run killed anywhere logs each step exactly once.

Extra loop-state keys are kept as given and come back unchanged from ``load_checkpoints_file``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from tinker_cookbook import cli_utils, tinker
from tinker_cookbook.exceptions import CheckpointError, ConfigurationError
from tinker_cookbook.utils import ml_log

logger = logging.getLogger(__name__)

CHECKPOINTS_FILE = "checkpoints.jsonl"
CheckpointKind: TypeAlias = Literal["state", "sampler", "both"]
RENDERER_NAME_METADATA_KEY = "renderer_name"
# A run in log_path can only be resumed by a config that agrees on these (they define what is being trained).
RUN_IDENTITY_KEYS: tuple[str, ...] = (
    "model_name", "dataset_builder", "lora_rank", "renderer_name", "load_checkpoint_path",
)


# ---------------------------------------------------------------------------------------------------------
# Reading and writing checkpoints.jsonl
# ---------------------------------------------------------------------------------------------------------


def checkpoints_path(log_path: str | Path) -> Path:
    return Path(log_path) / CHECKPOINTS_FILE


def append_checkpoint_record(log_path: str | Path, record: Mapping[str, Any]) -> None:
    """Append one row and force it to disk, so that a row, once written, survives a crash."""
    path = checkpoints_path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ml_log.remove_torn_tail(path)
    line = json.dumps(dict(record)) + "\n"
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def load_checkpoints_file(log_path: str | Path) -> list[dict[str, Any]]:
    """All rows of ``checkpoints.jsonl`` (empty when there is none).

    A torn last line (the process died while appending it) is skipped with a warning: its checkpoint completed,
    but the row was never fully recorded, so the run resumes from the row before it. A bad line anywhere else is
    an error, because it means the file was edited or corrupted.
    """
    path = checkpoints_path(log_path)
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                logger.warning("%s line %d is incomplete (killed while writing); ignoring it", path, number)
                continue
            raise CheckpointError(f"{path} line {number} is not valid JSON ({exc}); fix or remove that line") from exc
        if not isinstance(row, dict):
            raise CheckpointError(f"{path} line {number} is not a JSON object: {line[:80]!r}")
        rows.append(row)
    return rows


def get_last_checkpoint(log_path: str | Path, required_key: str = "state_path") -> dict[str, Any] | None:
    """The last row that has ``required_key`` (``state_path`` to resume training, ``sampler_path`` to sample)."""
    rows = [row for row in load_checkpoints_file(log_path) if required_key in row]
    if not rows:
        return None
    return rows[-1]


# ---------------------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------------------


@dataclass
class PendingCheckpoint:
    """Save requests that have been queued on the training client but not yet recorded.

    The two-stage form lets a pipelined loop queue the save right after step ``s``'s ``optim_step`` (so the saved
    weights are exactly those after step ``s``), queue step ``s + 1`` behind it, and record the row once the save
    has finished.
    """

    name: str
    log_path: Path
    loop_state: dict[str, Any]
    futures: dict[str, tinker.APIFuture[Any]] = field(default_factory=dict)

    async def finish_async(self) -> dict[str, Any]:
        """Wait for the saves, then append the row; returns the row."""
        from tinker_cookbook.utils.progress import phase

        with phase("saving"):
            return self._record({key: (await fut.result_async()).path for key, fut in self.futures.items()})

    def finish(self) -> dict[str, Any]:
        """Blocking form of ``finish_async``."""
        return self._record({key: fut.result().path for key, fut in self.futures.items()})

    def _record(self, paths: dict[str, str]) -> dict[str, Any]:
        record = {"name": self.name, **self.loop_state, **paths}
        append_checkpoint_record(self.log_path, record)
        logger.info("saved checkpoint %s: %s", self.name, ", ".join(f"{k}={v}" for k, v in paths.items()))
        return record


def _check_kind(kind: str) -> None:
    if kind not in ("state", "sampler", "both"):
        raise ConfigurationError(f"checkpoint kind={kind!r} is not valid; use 'state', 'sampler' or 'both'")


def start_checkpoint(
    training_client: tinker.TrainingClient,
    name: str,
    log_path: str | Path,
    loop_state: Mapping[str, Any],
    kind: CheckpointKind = "both",
    ttl_seconds: int | None = None,
) -> PendingCheckpoint:
    """Queue the save requests (ordered after everything already submitted on ``training_client``)."""
    _check_kind(kind)
    pending = PendingCheckpoint(name=name, log_path=Path(log_path), loop_state=dict(loop_state))
    if kind in ("state", "both"):
        pending.futures["state_path"] = training_client.save_state(name, ttl_seconds=ttl_seconds)
    if kind in ("sampler", "both"):
        pending.futures["sampler_path"] = training_client.save_weights_for_sampler(name, ttl_seconds=ttl_seconds)
    return pending


async def save_checkpoint_async(
    training_client: tinker.TrainingClient,
    name: str,
    log_path: str | Path,
    loop_state: Mapping[str, Any],
    kind: CheckpointKind = "both",
    ttl_seconds: int | None = None,
) -> dict[str, Any]:
    """Save and record a checkpoint; returns the row written to ``checkpoints.jsonl``."""
    return await start_checkpoint(training_client, name, log_path, loop_state, kind, ttl_seconds).finish_async()


def save_checkpoint(
    training_client: tinker.TrainingClient,
    name: str,
    log_path: str | Path,
    loop_state: Mapping[str, Any],
    kind: CheckpointKind = "both",
    ttl_seconds: int | None = None,
) -> dict[str, Any]:
    """Blocking form of ``save_checkpoint_async``."""
    return start_checkpoint(training_client, name, log_path, loop_state, kind, ttl_seconds).finish()


# ---------------------------------------------------------------------------------------------------------
# Resuming
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResumePoint:
    """Where a run in ``log_path`` continues from: ``row`` is the checkpoint to load, None to start at step 0."""

    log_path: Path
    row: dict[str, Any] | None

    def begin(self, start_step: int, end_step: int) -> bool:
        """Get ``log_path`` ready for steps ``start_step .. end_step - 1``; False when there is nothing to do.

        A run that already reached ``end_step`` (finished, or stopped at a ``max_steps`` that was not raised) is
        left untouched. Otherwise the ``metrics.jsonl`` rows from ``start_step`` on are dropped: the interrupted
        attempt logged them after its last checkpoint, and this run logs those steps again.
        Call before ``ml_log.setup_logging``, which appends to ``metrics.jsonl``.
        """
        if start_step >= end_step:
            name = None if self.row is None else self.row.get("name")
            logger.info(
                "%s: the run already reached step %d (checkpoint %r); nothing to do. Raise max_steps (or lengthen "
                "the run) to train further, or pass behavior_if_log_dir_exists=delete to start over",
                self.log_path, start_step, name,
            )
            print(f"Nothing to do: the run in {self.log_path} already reached step {start_step}.")
            return False
        ml_log.truncate_metrics(self.log_path, keep_below_step=start_step)
        return True


def resume_point(
    log_path: str | Path,
    behavior_if_log_dir_exists: cli_utils.LogdirBehavior,
    config: Any,
    identity_keys: Sequence[str] = RUN_IDENTITY_KEYS,
) -> ResumePoint:
    """Apply the log-dir policy to ``log_path`` and find the checkpoint that this run continues from.

    No run there (or it was deleted by the policy): start at step 0. A kept run must have been started with a
    config (``config.json``) that agrees with ``config`` on ``identity_keys``, otherwise ``ConfigurationError``
    names each differing field; it continues from its last complete checkpoint, or from step 0 when it has none.
    Call this before anything writes to ``log_path``: ``ml_log.setup_logging`` overwrites ``config.json``.
    """
    log_path = Path(log_path)
    if cli_utils.check_log_dir(log_path, behavior_if_log_dir_exists) == "fresh":
        return ResumePoint(log_path, None)
    check_config_compatible(log_path, ml_log.dump_config(config), identity_keys)
    row = get_last_checkpoint(log_path, required_key="state_path")
    if row is None:
        logger.info("%s has no complete checkpoint yet: starting from step 0", log_path)
    return ResumePoint(log_path, row)


def check_config_compatible(
    log_path: str | Path, new_config: Mapping[str, Any], keys: Sequence[str]
) -> None:
    """Refuse to resume a run whose ``config.json`` differs from ``new_config`` in any of ``keys``.

    ``new_config`` is the dumped config (``ml_log.dump_config``). Keys absent from the old config are not compared
    (older runs may predate a field). Raises ``ConfigurationError`` listing each differing key.
    """
    path = Path(log_path) / "config.json"
    if not path.exists():
        return
    try:
        old = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{path} is not valid JSON ({exc}); delete the log dir or fix the file") from exc
    diffs = [
        f"{path}: {a!r} (in the log dir) != {b!r} (now)"
        for key in keys
        if key in old
        for path, a, b in _leaf_differences(key, old[key], new_config.get(key))
    ]
    if diffs:
        raise ConfigurationError(
            f"log_path={str(log_path)!r} holds another run, so it cannot be resumed with this config:\n  "
            + "\n  ".join(diffs)
            + "\nUse another log_path, or behavior_if_log_dir_exists=delete to replace that run"
        )


def _leaf_differences(path: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """``(dotted.path, old, new)`` for each leaf where two dumped configs differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            diff
            for key in sorted(set(old) | set(new))
            for diff in _leaf_differences(f"{path}.{key}", old.get(key), new.get(key))
        ]
    return [] if old == new else [(path, old, new)]


def renderer_user_metadata(renderer_name: str | None) -> dict[str, str]:
    """``user_metadata`` for a training client that remembers which renderer its data was rendered with."""
    return {} if renderer_name is None else {RENDERER_NAME_METADATA_KEY: renderer_name}


def get_renderer_name_from_checkpoint(service_client: tinker.ServiceClient, tinker_path: str) -> str | None:
    """The renderer name stored in the metadata of the run that wrote ``tinker_path`` (None if not stored)."""
    rest_client = service_client.create_rest_client()
    run = rest_client.get_training_run_by_tinker_path(tinker_path).result()
    return (run.user_metadata or {}).get(RENDERER_NAME_METADATA_KEY)


def check_renderer_name_for_checkpoint(
    service_client: tinker.ServiceClient, tinker_path: str, renderer_name: str | None
) -> None:
    """Raise when a checkpoint was trained with a different renderer than the one now configured."""
    stored = get_renderer_name_from_checkpoint(service_client, tinker_path)
    if stored is not None and renderer_name is not None and stored != renderer_name:
        raise ConfigurationError(
            f"renderer_name={renderer_name!r} differs from the renderer {stored!r} the checkpoint {tinker_path} "
            f"was trained with; pass renderer_name={stored} (or start from another checkpoint)"
        )
