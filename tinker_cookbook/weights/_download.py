"""Checkpoint files from the store (``tinker://`` paths) into a local folder, through the public ``RestClient``."""

from __future__ import annotations

import tarfile
import tempfile
import urllib.request
from pathlib import Path

from tinker_cookbook import tinker
from tinker_cookbook.tinker import errors, types
from tinker_cookbook.weights._output import output_dir as atomic_output_dir


def parse_tinker_path(tinker_path: str) -> types.ParsedCheckpointTinkerPath:
    """The parts of a ``tinker://<run>/<kind>/<name>`` path; BadRequestError saying what the path should be."""
    try:
        return types.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
    except ValueError as exc:
        raise errors.BadRequestError(str(exc)) from None


def rest_client(base_url: str | None = None) -> tinker.RestClient:
    """The store of the local engine (``base_url`` None) or of the Tinker-protocol server at ``base_url``."""
    return tinker.ServiceClient(base_url=base_url).create_rest_client() if base_url else tinker.RestClient()


def extract_checkpoint(rc: tinker.RestClient, tinker_path: str, into: Path) -> None:
    """Fetch the checkpoint's archive and extract its files into the existing folder ``into``."""
    url = rc.get_checkpoint_archive_url_from_tinker_path(tinker_path).result().url
    with tempfile.TemporaryDirectory(prefix=".download-", dir=into.parent) as scratch:
        tar_path, _ = urllib.request.urlretrieve(url, Path(scratch) / "archive.tar")
        with tarfile.open(tar_path) as tar:
            tar.extractall(into, filter="data")


def download(*, tinker_path: str, output_dir: str, base_url: str | None = None, force: bool = False) -> str:
    """Download a checkpoint's files into ``<output_dir>/<run_id>_<kind>_<name>/`` and return that folder.

    A ``sampler_weights/`` checkpoint is a PEFT adapter (``adapter_model.safetensors`` + ``adapter_config.json``).
    The folder appears complete or not at all; an existing one is replaced only with ``force``.
    """
    parsed = parse_tinker_path(tinker_path)
    kind, name = parsed.checkpoint_id.split("/", 1)
    target = Path(output_dir).expanduser() / f"{parsed.training_run_id}_{kind}_{name}"
    rc = rest_client(base_url)
    with atomic_output_dir(target, force) as folder:
        extract_checkpoint(rc, tinker_path, folder)
    return str(target)
