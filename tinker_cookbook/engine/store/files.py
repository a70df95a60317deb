"""The engine's files inside a checkpoint directory: the PEFT adapter, its config and the Adam state.

Writers produce what PEFT's ``save_pretrained`` would (so a ``sampler_weights/`` checkpoint loads in PEFT as is);
readers check everything a damaged or foreign file could get wrong and refuse it with a BadRequestError that
names the file by its ``tinker://`` path, never by where this machine keeps it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from tinker_cookbook.tinker.errors import BadRequestError

ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.safetensors"


def write_adapter(directory: Path, state: Mapping[str, torch.Tensor], config: dict[str, Any]) -> None:
    """The adapter's weights (PEFT's saved-format keys) and its PEFT config, as PEFT writes them."""
    cpu_state = {k: v.cpu() for k, v in state.items()}
    safetensors.torch.save_file(cpu_state, str(directory / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / ADAPTER_CONFIG_FILE).write_text(json.dumps(config, indent=2))


def write_optimizer(directory: Path, state: Mapping[str, torch.Tensor]) -> None:
    """The optimizer's state tensors."""
    safetensors.torch.save_file({k: v.cpu() for k, v in state.items()}, str(directory / OPTIMIZER_FILE))


def read_tensors(path: Path, label: str) -> dict[str, torch.Tensor]:
    """A checkpoint's safetensors file; missing, truncated or corrupt is a BadRequestError naming ``label``."""
    if not path.is_file():
        raise BadRequestError(f"{label} is missing; the checkpoint is incomplete: load an earlier one or save again")
    try:
        return safetensors.torch.load_file(str(path))
    except safetensors.SafetensorError as exc:  # its messages name no file
        raise BadRequestError(f"{label} is not a readable safetensors file ({exc}); the checkpoint is damaged: load "
                              "an earlier one or save again") from exc


def read_json(path: Path, label: str) -> dict[str, Any]:
    """A checkpoint's JSON object file; missing or corrupt is a BadRequestError naming ``label``."""
    if not path.is_file():
        raise BadRequestError(f"{label} is missing; the checkpoint is incomplete: load an earlier one or save again")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequestError(f"{label} is not valid JSON ({exc}); the checkpoint is damaged: load an earlier one "
                              "or save again") from exc
    if not isinstance(value, dict):
        raise BadRequestError(f"{label} holds a {type(value).__name__}, not a JSON object; the checkpoint is damaged")
    return value


def read_sampler_adapter(directory: Path, source: str, base_state: Mapping[str, torch.Tensor], model_name: str
                         ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The PEFT adapter of a ``sampler_weights/`` checkpoint, checked against the base model ``model_name`` (its
    weights ``base_state``, plain HF keys) before the sampler merges it.

    Checks what a damaged file could get wrong: readable files, finite floating-point tensors, LoRA pairs of the
    configured rank whose outer dimensions match the base weight they adapt.
    """
    weights_label, config_label = f"{source}/{ADAPTER_WEIGHTS_FILE}", f"{source}/{ADAPTER_CONFIG_FILE}"
    state = read_tensors(directory / ADAPTER_WEIGHTS_FILE, weights_label)
    config = read_json(directory / ADAPTER_CONFIG_FILE, config_label)
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise BadRequestError(f"{config_label} has r={rank!r}; the LoRA rank must be a positive integer")
    embed = next((v for k, v in base_state.items() if k.endswith("embed_tokens.weight")), None)
    for key, tensor in state.items():
        if not tensor.dtype.is_floating_point or not bool(torch.isfinite(tensor).all()):
            raise BadRequestError(f"{weights_label}: tensor {key!r} (dtype {tensor.dtype}) is not finite "
                                  "floating-point data; the checkpoint is damaged: load an earlier one or save again")
        for part, rank_dim in ((".lora_A.weight", 0), (".lora_B.weight", 1)):
            if not key.endswith(part):
                continue
            module = key.removesuffix(part).removeprefix("base_model.model.")
            target = base_state.get(f"{module}.weight", embed if module == "lm_head" else None)
            outer = 1 - rank_dim  # A is [rank, in] and B is [out, rank], for a base weight of [out, in]
            # A fused expert stack (no 2-D base weight of that name) has one rank-r pair per expert: rank x experts.
            ranks = tensor.shape[rank_dim] % rank if target is None and tensor.dim() == 2 else tensor.shape[rank_dim] != rank
            if tensor.dim() != 2 or ranks or (
                    target is not None and tensor.shape[outer] != target.shape[outer]):
                raise BadRequestError(f"{weights_label}: tensor {key!r} has shape {list(tensor.shape)}, which does not "
                                      f"fit rank {rank} on {model_name}; the checkpoint is damaged or for another "
                                      "model")
    return state, config

