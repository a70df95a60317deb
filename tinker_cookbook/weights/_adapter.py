"""A trained LoRA adapter as the weights tools see it: a ``sampler_weights/`` checkpoint in PEFT's saved format.

An adapter comes from a ``tinker://<run>/sampler_weights/<name>`` path (fetched through the public RestClient) or a
local folder holding ``adapter_model.safetensors`` and ``adapter_config.json`` (what ``weights download`` writes).
Each adapted module ``M`` has ``base_model.model.M.lora_A.weight`` ([r, in]) and ``...lora_B.weight`` ([out, r]);
its weight change is ``scale · B @ A`` with ``scale = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with rsLoRA).
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tinker_cookbook.checkpoint_utils import RENDERER_NAME_METADATA_KEY
from tinker_cookbook.exceptions import CheckpointError
from tinker_cookbook.weights._download import extract_checkpoint, parse_tinker_path, rest_client

ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
PEFT_PREFIX = "base_model.model."
UNEMBED_MODULE = "lm_head"


@dataclass(frozen=True)
class LoraPair:
    """One adapted module: ``delta = scale · B @ A``."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float

    def delta(self) -> torch.Tensor:
        """The weight change in fp32 ([out, in])."""
        return self.scale * (self.b.float() @ self.a.float())


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter and where it came from."""

    config: dict[str, Any]
    pairs: dict[str, LoraPair]
    """Module name (as in the base model's state dict, without ``.weight``) -> its LoRA pair."""
    source: str
    """The tinker:// path or local folder it was read from."""
    run_id: str | None = None
    renderer_name: str | None = None
    """The renderer the run recorded in its metadata (tinker:// sources only)."""
    run_metadata: dict[str, str] = field(default_factory=dict)

    @property
    def base_model(self) -> str | None:
        value = self.config.get("base_model_name_or_path")
        return str(value) if value else None

    @property
    def rank(self) -> int:
        return int(self.config["r"])

    @property
    def trains_unembed(self) -> bool:
        return UNEMBED_MODULE in self.pairs


def lora_scale(config: dict[str, Any]) -> float:
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha", rank))
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def _not_an_adapter(source: str, why: str) -> CheckpointError:
    return CheckpointError(
        f"{source} is not a sampler checkpoint ({why}); pass a tinker://<run>/sampler_weights/<name> path (saved by "
        "save_weights_for_sampler; `tinker-cookbook checkpoint list` shows them) or a folder downloaded from one")


def read_adapter_folder(folder: Path, source: str) -> tuple[dict[str, Any], dict[str, LoraPair]]:
    """The config and LoRA pairs of the PEFT adapter in ``folder``; CheckpointError naming ``source`` otherwise."""
    import safetensors.torch

    weights, config_file = folder / ADAPTER_WEIGHTS_FILE, folder / ADAPTER_CONFIG_FILE
    if not folder.is_dir():
        raise _not_an_adapter(source, "no such folder")
    if not weights.is_file() or not config_file.is_file():
        raise _not_an_adapter(source, f"it has no {ADAPTER_WEIGHTS_FILE} and {ADAPTER_CONFIG_FILE}")
    try:
        config = json.loads(config_file.read_text())
        state = safetensors.torch.load_file(str(weights))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, Exception) as exc:  # noqa: BLE001 - any damage
        raise _not_an_adapter(source, f"its files are not readable: {exc}") from exc
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA" or not isinstance(config.get("r"), int):
        raise _not_an_adapter(source, f"{ADAPTER_CONFIG_FILE} is not a LoRA config with an integer r")
    scale = lora_scale(config)
    pairs: dict[str, LoraPair] = {}
    for key in state:
        if key.endswith(".lora_A.weight"):
            module = key.removesuffix(".lora_A.weight")
            b_key = f"{module}.lora_B.weight"
            if b_key not in state:
                raise _not_an_adapter(source, f"{key} has no matching lora_B")
            pairs[module.removeprefix(PEFT_PREFIX)] = LoraPair(state[key], state[b_key], scale)
    if not pairs:
        raise _not_an_adapter(source, "it holds no LoRA tensors")
    return config, pairs


@contextlib.contextmanager
def open_adapter(adapter_path: str, base_url: str | None = None) -> Iterator[Adapter]:
    """The adapter at a ``tinker://`` sampler path (fetched into a temporary folder) or in a local folder."""
    if not adapter_path.startswith("tinker://"):
        config, pairs = read_adapter_folder(Path(adapter_path).expanduser(), repr(adapter_path))
        yield Adapter(config, pairs, source=str(adapter_path))
        return
    parsed = parse_tinker_path(adapter_path)
    if not parsed.checkpoint_id.startswith("sampler_weights/"):
        raise _not_an_adapter(adapter_path, "it is a training-state checkpoint (weights/...); save_weights_for_sampler "
                              "writes the sampler_weights/ checkpoint of the same step")
    rc = rest_client(base_url)
    run = rc.get_training_run_by_tinker_path(adapter_path).result()
    metadata = dict(run.user_metadata or {})
    with tempfile.TemporaryDirectory(prefix="tinker-adapter-") as scratch:
        folder = Path(scratch) / "adapter"
        folder.mkdir()
        extract_checkpoint(rc, adapter_path, folder)
        config, pairs = read_adapter_folder(folder, adapter_path)
        config.setdefault("base_model_name_or_path", run.base_model)
        yield Adapter(config, pairs, source=adapter_path, run_id=parsed.training_run_id,
                      renderer_name=metadata.get(RENDERER_NAME_METADATA_KEY), run_metadata=metadata)
