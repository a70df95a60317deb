"""A PEFT LoRA adapter as the sampler reads it: its LoRA pairs as low-rank deltas (``LoraDelta``, merged into the
fused weights by ``decoder_model`` or kept apart by ``sampling.lora``) and its full-weight overrides, validated
against the base state dict."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tinker_cookbook.tinker.errors import BadRequestError

_PEFT_PREFIX = "base_model.model."
_LORA_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B")


def split_adapter_state(
    adapter_state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
    """LoRA pairs ``{module: {"lora_A": A, "lora_B": B}}`` and full-weight overrides ``{base key: tensor}``.

    PEFT saves whole weights next to the LoRA pairs in some cases (``lm_head.base_layer.weight`` when the
    unembedding of a tied model is adapted, ``modules_to_save``); loading the adapter replaces the base weights
    with them, so they override ``base_state`` here.
    """
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    overrides: dict[str, torch.Tensor] = {}
    for key, tensor in adapter_state.items():
        parts = key.removeprefix(_PEFT_PREFIX).split(".")
        lora = [i for i, part in enumerate(parts) if part in _LORA_PARTS]
        if lora:
            # lora_A/B are saved as ".weight"; embedding factors as the bare parameter. Anything else (PEFT's
            # lora_bias adds "lora_B.bias") would otherwise overwrite a factor silently.
            if parts[lora[0] + 1 :] not in (["weight"], []):
                raise BadRequestError(
                    f"adapter_state[{key!r}]: only the LoRA factors are supported, not "
                    f"{'.'.join(parts[lora[0] + 1 :])!r}; train the adapter without lora_bias"
                )
            pairs.setdefault(".".join(parts[: lora[0]]), {})[parts[lora[0]]] = tensor
        else:
            overrides[".".join(p for p in parts if p not in ("base_layer", "modules_to_save"))] = tensor
    return pairs, overrides


@dataclass(frozen=True)
class LoraDelta:
    """The LoRA update ``scale * left @ right`` of one weight, kept as its low-rank factors until it is merged."""

    left: torch.Tensor
    """[out, r]"""
    right: torch.Tensor
    """[r, in]"""
    scale: float

    def merge_into(self, out: torch.Tensor, base: torch.Tensor) -> None:
        """``out = base + scale * left @ right`` in fp32, one pass over ``out`` (a row block of a fused weight)."""
        left, right = self.left.to(base.device).float(), self.right.to(base.device).float()
        torch.addmm(base.float(), left, right, alpha=self.scale, out=out)


def lora_deltas(
    pairs: Mapping[str, Mapping[str, torch.Tensor]], adapter_config: Mapping[str, Any]
) -> dict[str, LoraDelta]:
    """``{base weight key: scale * B @ A}`` for every LoRA pair (as factors: merged straight into the weights)."""
    if "r" not in adapter_config:
        raise BadRequestError(f"adapter_config has no 'r' (the LoRA rank): {dict(adapter_config)!r}")
    rank = int(adapter_config["r"])
    alpha = float(adapter_config.get("lora_alpha") or rank)
    for field in ("rank_pattern", "alpha_pattern"):
        if adapter_config.get(field):
            raise BadRequestError(
                f"adapter_config.{field} is not supported by the sampler; use one rank and alpha"
            )
    if adapter_config.get("use_dora"):
        raise BadRequestError("adapter_config.use_dora=True is not supported by the sampler; use plain LoRA")
    scale = alpha / math.sqrt(rank) if adapter_config.get("use_rslora") else alpha / rank
    deltas: dict[str, LoraDelta] = {}
    for module, pair in pairs.items():
        if "lora_A" in pair and "lora_B" in pair:
            delta = LoraDelta(pair["lora_B"], pair["lora_A"], scale)  # [out, r] @ [r, in]
        elif "lora_embedding_A" in pair and "lora_embedding_B" in pair:
            # peft's embedding update is (B @ A).T with A [r, vocab], B [hidden, r]: A.T @ B.T, [vocab, hidden].
            delta = LoraDelta(pair["lora_embedding_A"].T, pair["lora_embedding_B"].T, scale)
        else:
            raise BadRequestError(
                f"adapter_state has an unpaired LoRA weight for module {module!r}: {sorted(pair)}"
            )
        deltas[f"{module}.weight"] = delta
    return deltas


def parse_adapter(
    base_state: Mapping[str, torch.Tensor],
    adapter_state: Mapping[str, torch.Tensor],
    adapter_config: Mapping[str, Any] | None,
) -> tuple[dict[str, LoraDelta], dict[str, torch.Tensor]]:
    """A PEFT adapter's LoRA deltas ``{base weight key: delta}`` and full-weight overrides ``{base key: tensor}``,
    validated against the base (merged or kept apart, see ``sampling.lora``)."""
    if adapter_config is None:
        raise BadRequestError("adapter_state was given without adapter_config; pass the PEFT LoraConfig dict")
    pairs, overrides = split_adapter_state(adapter_state)
    unknown = sorted(k for k in overrides if k not in base_state and k != "lm_head.weight")
    if unknown:
        raise BadRequestError(f"adapter_state holds weights that the base model does not have: {unknown[:4]}")
    return lora_deltas(pairs, adapter_config), overrides
