"""``RestClient``: training runs and checkpoints of the local store, with the official SDK's method names.

Every sync method returns an already-completed ``APIFuture`` (its ``.result()`` gives the value or raises the
error); every ``*_async`` twin returns the value itself and runs the file work in a thread so that the event loop
is not blocked.

Example::

    rc = service_client.create_rest_client()
    url = rc.get_checkpoint_archive_url_from_tinker_path("tinker://<run_id>/sampler_weights/final").result().url
    urllib.request.urlretrieve(url, "archive.tar")
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from tinker_cookbook.tinker import errors, types
from tinker_cookbook.tinker.backend import CheckpointStoreAPI, resolve_store
from tinker_cookbook.tinker.futures import APIFuture

T = TypeVar("T")
AccessScope = Literal["owned", "accessible"]


def _completed(fn: Callable[..., T], *args: Any) -> APIFuture[T]:
    """Run ``fn`` now and wrap its value (or its error) in a finished future."""
    try:
        return APIFuture.completed(fn(*args))
    except Exception as exc:  # noqa: BLE001 - the error belongs to whoever calls .result()
        return APIFuture.failed(exc)


def _check_scope(access_scope: str) -> None:
    # Everything in the local store belongs to the local user, so both scopes see the same runs.
    if access_scope not in ("owned", "accessible"):
        raise errors.BadRequestError(f"access_scope={access_scope!r} must be 'owned' or 'accessible'")


def _checkpoint_path(training_run_id: str, checkpoint_id: str) -> str:
    """``tinker://<run>/<checkpoint_id>`` where checkpoint_id is ``weights/<name>`` or ``sampler_weights/<name>``."""
    kind, _, name = str(checkpoint_id).partition("/")  # a caller may pass anything; it gets the error below
    if kind in types.CHECKPOINT_KINDS:
        path = types.format_tinker_path(training_run_id, kind, name)
        try:
            types.ParsedCheckpointTinkerPath.from_tinker_path(path)
            return path
        except ValueError:
            pass
    raise errors.BadRequestError(
        f"training_run_id={training_run_id!r}, checkpoint_id={checkpoint_id!r} do not name a checkpoint; "
        "checkpoint_id is 'weights/<name>' or 'sampler_weights/<name>' as listed by list_checkpoints"
    )


def _parse_tinker_path(tinker_path: Any) -> types.ParsedCheckpointTinkerPath:
    try:
        return types.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
    except ValueError as exc:
        raise errors.BadRequestError(f"tinker_path: {exc}") from None


class RestClient:
    """Query and manage training runs and checkpoints."""

    def __init__(self, store: CheckpointStoreAPI | None = None):
        self.store = store if store is not None else resolve_store(None)

    # -- plain implementations (shared by the sync and async forms) ----------------------------------------

    def _get_training_run(self, training_run_id: str, access_scope: str = "owned") -> types.TrainingRun:
        _check_scope(access_scope)
        return self.store.get_run(training_run_id)

    def _get_training_run_by_tinker_path(
        self, tinker_path: str, access_scope: str = "owned"
    ) -> types.TrainingRun:
        _check_scope(access_scope)
        return self.store.get_run(_parse_tinker_path(tinker_path).training_run_id)

    def _list_training_runs(
        self, limit: int = 20, offset: int = 0, access_scope: str = "owned", project_id: str | None = None
    ) -> types.TrainingRunsResponse:
        _check_scope(access_scope)
        return self.store.list_runs(limit=limit, offset=offset)

    def _archive_url(self, tinker_path: str) -> types.CheckpointArchiveUrlResponse:
        # A file:// URL stays valid as long as the checkpoint exists, i.e. until it expires or is deleted.
        tar_path = self.store.archive(tinker_path)
        expires = self.store.get_checkpoint(tinker_path).expires_at
        return types.CheckpointArchiveUrlResponse(url=tar_path.resolve().as_uri(), expires=expires)

    def _set_ttl(self, tinker_path: str, ttl_seconds: int | None) -> None:
        self.store.set_ttl(tinker_path, ttl_seconds)

    # -- runs ------------------------------------------------------------------------------------------------

    def get_training_run(
        self, training_run_id: str, access_scope: AccessScope = "owned"
    ) -> APIFuture[types.TrainingRun]:
        return _completed(self._get_training_run, training_run_id, access_scope)

    async def get_training_run_async(
        self, training_run_id: str, access_scope: AccessScope = "owned"
    ) -> types.TrainingRun:
        return await asyncio.to_thread(self._get_training_run, training_run_id, access_scope)

    def get_training_run_by_tinker_path(
        self, tinker_path: str, access_scope: AccessScope = "owned"
    ) -> APIFuture[types.TrainingRun]:
        return _completed(self._get_training_run_by_tinker_path, tinker_path, access_scope)

    async def get_training_run_by_tinker_path_async(
        self, tinker_path: str, access_scope: AccessScope = "owned"
    ) -> types.TrainingRun:
        return await asyncio.to_thread(self._get_training_run_by_tinker_path, tinker_path, access_scope)

    def list_training_runs(
        self,
        limit: int = 20,
        offset: int = 0,
        access_scope: AccessScope = "owned",
        project_id: str | None = None,
    ) -> APIFuture[types.TrainingRunsResponse]:
        """Training runs, newest first."""
        return _completed(self._list_training_runs, limit, offset, access_scope, project_id)

    async def list_training_runs_async(
        self,
        limit: int = 20,
        offset: int = 0,
        access_scope: AccessScope = "owned",
        project_id: str | None = None,
    ) -> types.TrainingRunsResponse:
        return await asyncio.to_thread(self._list_training_runs, limit, offset, access_scope, project_id)

    def _list_training_run_ids(
        self, limit: int = 20, offset: int = 0, access_scope: str = "owned"
    ) -> list[str]:
        return [run.training_run_id for run in self._list_training_runs(limit, offset, access_scope).training_runs]

    def list_training_run_ids(
        self, limit: int = 20, offset: int = 0, access_scope: AccessScope = "owned"
    ) -> APIFuture[list[str]]:
        """The ids of ``list_training_runs`` (newest first, the same paging): the method the docs' async table
        names. The official SDK has no signature for it to copy, so it mirrors ``list_training_runs``."""
        return _completed(self._list_training_run_ids, limit, offset, access_scope)

    async def list_training_run_ids_async(
        self, limit: int = 20, offset: int = 0, access_scope: AccessScope = "owned"
    ) -> list[str]:
        return await asyncio.to_thread(self._list_training_run_ids, limit, offset, access_scope)

    def get_weights_info_by_tinker_path(self, tinker_path: str) -> APIFuture[types.WeightsInfoResponse]:
        return _completed(self.store.weights_info, tinker_path)

    async def get_weights_info_by_tinker_path_async(self, tinker_path: str) -> types.WeightsInfoResponse:
        return await asyncio.to_thread(self.store.weights_info, tinker_path)

    # -- listing checkpoints ---------------------------------------------------------------------------------

    def list_checkpoints(self, training_run_id: str) -> APIFuture[types.CheckpointsListResponse]:
        """The run's checkpoints of both kinds, newest first."""
        return _completed(self.store.list_checkpoints, training_run_id)

    async def list_checkpoints_async(self, training_run_id: str) -> types.CheckpointsListResponse:
        return await asyncio.to_thread(self.store.list_checkpoints, training_run_id)

    def list_user_checkpoints(
        self, limit: int = 100, offset: int = 0
    ) -> APIFuture[types.CheckpointsListResponse]:
        """Checkpoints of all runs, newest first."""
        return _completed(self.store.list_user_checkpoints, limit, offset)

    async def list_user_checkpoints_async(
        self, limit: int = 100, offset: int = 0
    ) -> types.CheckpointsListResponse:
        return await asyncio.to_thread(self.store.list_user_checkpoints, limit, offset)

    # -- archives --------------------------------------------------------------------------------------------

    def get_checkpoint_archive_url(
        self, training_run_id: str, checkpoint_id: str
    ) -> APIFuture[types.CheckpointArchiveUrlResponse]:
        return _completed(lambda: self._archive_url(_checkpoint_path(training_run_id, checkpoint_id)))

    async def get_checkpoint_archive_url_async(
        self, training_run_id: str, checkpoint_id: str
    ) -> types.CheckpointArchiveUrlResponse:
        return await asyncio.to_thread(
            lambda: self._archive_url(_checkpoint_path(training_run_id, checkpoint_id))
        )

    def get_checkpoint_archive_url_from_tinker_path(
        self, tinker_path: str
    ) -> APIFuture[types.CheckpointArchiveUrlResponse]:
        """A ``file://`` URL of a tar of the checkpoint's files (the local stand-in for a signed URL)."""
        return _completed(self._archive_url, tinker_path)

    async def get_checkpoint_archive_url_from_tinker_path_async(
        self, tinker_path: str
    ) -> types.CheckpointArchiveUrlResponse:
        return await asyncio.to_thread(self._archive_url, tinker_path)

    # -- deleting, publishing, TTL ---------------------------------------------------------------------------

    def delete_checkpoint(self, training_run_id: str, checkpoint_id: str) -> APIFuture[None]:
        return _completed(
            lambda: self.store.delete_checkpoint(_checkpoint_path(training_run_id, checkpoint_id))
        )

    async def delete_checkpoint_async(self, training_run_id: str, checkpoint_id: str) -> None:
        path = _checkpoint_path(training_run_id, checkpoint_id)
        await asyncio.to_thread(self.store.delete_checkpoint, path)

    def delete_checkpoint_from_tinker_path(self, tinker_path: str) -> APIFuture[None]:
        return _completed(self.store.delete_checkpoint, tinker_path)

    async def delete_checkpoint_from_tinker_path_async(self, tinker_path: str) -> None:
        await asyncio.to_thread(self.store.delete_checkpoint, tinker_path)

    def publish_checkpoint_from_tinker_path(self, tinker_path: str) -> APIFuture[None]:
        """Mark the checkpoint public (in the local store this is a recorded flag, shown by list and info)."""
        return _completed(self.store.set_public, tinker_path, True)

    async def publish_checkpoint_from_tinker_path_async(self, tinker_path: str) -> None:
        await asyncio.to_thread(self.store.set_public, tinker_path, True)

    def unpublish_checkpoint_from_tinker_path(self, tinker_path: str) -> APIFuture[None]:
        return _completed(self.store.set_public, tinker_path, False)

    async def unpublish_checkpoint_from_tinker_path_async(self, tinker_path: str) -> None:
        await asyncio.to_thread(self.store.set_public, tinker_path, False)

    def set_checkpoint_ttl_from_tinker_path(
        self, tinker_path: str, ttl_seconds: int | None
    ) -> APIFuture[None]:
        """Expire the checkpoint ``ttl_seconds`` from now; None removes the expiry."""
        return _completed(self._set_ttl, tinker_path, ttl_seconds)

    async def set_checkpoint_ttl_from_tinker_path_async(
        self, tinker_path: str, ttl_seconds: int | None
    ) -> None:
        await asyncio.to_thread(self._set_ttl, tinker_path, ttl_seconds)
