"""Names in the checkpoint store: run ids, checkpoint names and kinds, and the ``tinker://`` paths made of them."""

from __future__ import annotations

from typing import Any

from tinker_cookbook.tinker import errors, types

CheckpointKind = types.CheckpointKind
KINDS = types.CHECKPOINT_KINDS
KIND_TO_TYPE: dict[str, types.CheckpointType] = {"weights": "training", "sampler_weights": "sampler"}
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_MAX_NAME_LEN = 128


def validate_name(field: str, value: Any) -> str:
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


def normalize_kind(kind: str) -> CheckpointKind:
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
        validate_name("run_id", parsed.training_run_id)
        validate_name("checkpoint name", name)
    except errors.BadRequestError as e:
        raise errors.BadRequestError(
            f"malformed checkpoint path {tinker_path!r}: {e}; expected tinker://<run_id>/weights/<name> "
            "or tinker://<run_id>/sampler_weights/<name>"
        ) from None
    return parsed.training_run_id, normalize_kind(kind_dir), name


def kind_mismatch_message(tinker_path: str, kind: CheckpointKind) -> str:
    """Why a checkpoint of ``kind`` cannot serve where the other kind is needed."""
    if kind == "weights":
        return (
            f"{tinker_path} is a training state (from save_state); sampling needs a sampler_weights/ path "
            "from save_weights_for_sampler"
        )
    return (
        f"{tinker_path} holds sampler weights (from save_weights_for_sampler) without optimizer state; "
        "load_state and create_training_client_from_state need a weights/ path from save_state"
    )
