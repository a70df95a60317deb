"""The base model an adapter was trained on, as a Hugging Face folder of files to stream from."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tinker_cookbook import backends
from tinker_cookbook.exceptions import WeightsError
from tinker_cookbook.tinker import errors

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class BaseFiles:
    """A base model's folder: ``config.json`` and its safetensors (one file or an index of shards)."""

    name: str
    folder: Path

    @property
    def config(self) -> dict[str, Any]:
        return json.loads((self.folder / "config.json").read_text())

    def weight_files(self) -> list[Path]:
        index = self.folder / INDEX_FILE
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return [self.folder / shard for shard in shards]
        return [self.folder / SINGLE_FILE]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor, one at a time (only the current one is in memory)."""
        from safetensors import safe_open

        for path in self.weight_files():
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                    yield key, handle.get_tensor(key)

    def keys_and_shapes(self) -> dict[str, tuple[int, ...]]:
        from safetensors import safe_open

        shapes: dict[str, tuple[int, ...]] = {}
        for path in self.weight_files():
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        return shapes


def resolve_base(base_model: str) -> BaseFiles:
    """A local folder (``config.json`` + safetensors) as given, else the files of the base model of that name (the
    Hugging Face cache or hub, or the engine's own models); WeightsError saying how to make it available."""
    folder = Path(base_model).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file() or not any((folder / f).is_file() for f in (SINGLE_FILE, INDEX_FILE)):
            raise WeightsError(f"base_model={base_model!r} is a folder without config.json and {SINGLE_FILE} (or "
                               f"{INDEX_FILE}); pass a Hugging Face model folder or a model name")
        return BaseFiles(base_model, folder)
    try:
        return BaseFiles(base_model, backends.base_model_dir(base_model))
    except errors.TinkerError as exc:
        raise WeightsError(f"the base model {base_model!r} is missing: {exc}") from exc
