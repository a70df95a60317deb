"""RestClient: SDK method names over the local store, sync (future) and async forms."""

from __future__ import annotations

import asyncio
import tarfile
import urllib.request
from pathlib import Path

import pytest

from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore
from tinker_cookbook.tinker import errors, types
from tinker_cookbook.tinker.futures import APIFuture
from tinker_cookbook.tinker.rest_client import RestClient


@pytest.fixture
def client(tmp_path: Path) -> RestClient:
    return RestClient(CheckpointStore(tmp_path / "home"))


@pytest.fixture
def run_id(client: RestClient) -> str:
    return client.store.create_run("tiny-model", types.LoraConfig(rank=4, train_mlp=False))


def _save(
    client: RestClient, run_id: str, kind: str, name: str, files: dict[str, bytes] | None = None
) -> str:
    def write(directory: Path) -> None:
        for rel, content in (files or {"adapter_model.safetensors": b"w"}).items():
            (directory / rel).write_bytes(content)

    return client.store.write_checkpoint(run_id, kind, name, write, {}).tinker_path  # type: ignore[arg-type]


def test_sync_methods_return_completed_futures(client: RestClient, run_id: str) -> None:
    path = _save(client, run_id, "weights", "0001")
    future = client.get_training_run(run_id)
    assert isinstance(future, APIFuture) and future.done()
    run = future.result()
    assert run.training_run_id == run_id and run.last_checkpoint is not None
    assert run.last_checkpoint.tinker_path == path
    assert client.get_training_run_by_tinker_path(path).result().training_run_id == run_id
    info = client.get_weights_info_by_tinker_path(path).result()
    assert (info.base_model, info.lora_rank, info.train_mlp, info.train_attn) == (
        "tiny-model",
        4,
        False,
        True,
    )
    assert [r.training_run_id for r in client.list_training_runs().result().training_runs] == [run_id]
    assert [c.tinker_path for c in client.list_checkpoints(run_id).result().checkpoints] == [path]
    assert client.list_user_checkpoints(limit=1).result().cursor == types.Cursor(
        offset=0, limit=1, total_count=1
    )


def test_errors_surface_on_result(client: RestClient, run_id: str) -> None:
    future = client.get_training_run("no-such-run")
    assert future.done()
    with pytest.raises(errors.NotFoundError, match="no-such-run"):
        future.result()
    with pytest.raises(errors.BadRequestError, match="tinker://"):
        client.get_weights_info_by_tinker_path("s3://bucket/weights/x").result()
    with pytest.raises(errors.BadRequestError, match="access_scope"):
        client.list_training_runs(access_scope="everyone").result()  # type: ignore[arg-type]
    with pytest.raises(errors.BadRequestError, match="checkpoint_id"):
        client.delete_checkpoint(run_id, "../../x").result()


def test_archive_url_downloads(client: RestClient, run_id: str, tmp_path: Path) -> None:
    files = {"adapter_model.safetensors": b"\x01\x02", "adapter_config.json": b'{"r": 4}'}
    path = _save(client, run_id, "sampler_weights", "final", files)
    response = client.get_checkpoint_archive_url_from_tinker_path(path).result()
    assert response.url.startswith("file://") and response.expires is None
    target = tmp_path / "archive.tar"
    urllib.request.urlretrieve(response.url, target)
    with tarfile.open(target) as tar:
        assert sorted(tar.getnames()) == ["adapter_config.json", "adapter_model.safetensors"]
        assert tar.extractfile("adapter_config.json").read() == b'{"r": 4}'  # type: ignore[union-attr]
    by_id = client.get_checkpoint_archive_url(run_id, "sampler_weights/final").result()
    assert by_id.url == response.url


def test_archive_url_expiry_follows_ttl(client: RestClient, run_id: str) -> None:
    path = _save(client, run_id, "sampler_weights", "ttl")
    client.set_checkpoint_ttl_from_tinker_path(path, 3600).result()
    response = client.get_checkpoint_archive_url_from_tinker_path(path).result()
    assert response.expires == client.store.get_checkpoint(path).expires_at is not None


def test_publish_unpublish_delete(client: RestClient, run_id: str) -> None:
    path = _save(client, run_id, "weights", "pub")
    assert client.publish_checkpoint_from_tinker_path(path).result() is None
    assert client.list_checkpoints(run_id).result().checkpoints[0].public is True
    client.unpublish_checkpoint_from_tinker_path(path).result()
    assert client.list_checkpoints(run_id).result().checkpoints[0].public is False
    client.delete_checkpoint(run_id, "weights/pub").result()
    assert client.list_checkpoints(run_id).result().checkpoints == []
    other = _save(client, run_id, "sampler_weights", "other")
    client.delete_checkpoint_from_tinker_path(other).result()
    with pytest.raises(errors.NotFoundError):
        client.delete_checkpoint_from_tinker_path(other).result()


def test_async_twins_return_values(client: RestClient, run_id: str) -> None:
    path = _save(client, run_id, "sampler_weights", "a")

    async def go() -> None:
        run = await client.get_training_run_async(run_id)
        assert run.last_sampler_checkpoint is not None and run.last_sampler_checkpoint.tinker_path == path
        assert (await client.get_training_run_by_tinker_path_async(path)).training_run_id == run_id
        assert (await client.get_weights_info_by_tinker_path_async(path)).lora_rank == 4
        assert len((await client.list_training_runs_async(limit=5)).training_runs) == 1
        assert len((await client.list_checkpoints_async(run_id)).checkpoints) == 1
        assert len((await client.list_user_checkpoints_async()).checkpoints) == 1
        url = (await client.get_checkpoint_archive_url_from_tinker_path_async(path)).url
        assert url == (await client.get_checkpoint_archive_url_async(run_id, "sampler_weights/a")).url
        await client.publish_checkpoint_from_tinker_path_async(path)
        assert client.store.get_checkpoint(path).public
        await client.unpublish_checkpoint_from_tinker_path_async(path)
        assert not client.store.get_checkpoint(path).public
        await client.set_checkpoint_ttl_from_tinker_path_async(path, 60)
        assert client.store.get_checkpoint(path).expires_at is not None
        await client.delete_checkpoint_async(run_id, "sampler_weights/a")
        with pytest.raises(errors.NotFoundError):
            await client.delete_checkpoint_from_tinker_path_async(path)
        with pytest.raises(errors.NotFoundError):
            await client.get_training_run_async("missing")

    asyncio.run(go())


def test_default_store_uses_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_COOKBOOK_HOME", str(tmp_path / "env-home"))
    assert RestClient().store.root == tmp_path / "env-home"
