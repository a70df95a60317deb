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


SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
"""The safetensors header's dtype names."""


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

    def layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Key -> (shape, dtype) of every tensor, in the order of :meth:`tensors`, read from the headers alone."""
        from safetensors import safe_open

        found: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        for path in self.weight_files():
            with safe_open(str(path), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118
                    view = handle.get_slice(key)
                    found[key] = (tuple(view.get_shape()), SAFETENSORS_DTYPES[view.get_dtype()])
        return found

    def keys_and_shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: shape for key, (shape, _) in self.layout().items()}


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
