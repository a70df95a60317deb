"""LoRA targets of a model on the general path (``engine.model_paths``): found from its modules, any architecture.

- attention (``train_attn``): every ``nn.Linear`` inside an attention module (a module path with ``attn`` in it):
  ``q/k/v/o_proj``, or multi-head latent attention's ``q_a/q_b/kv_a/kv_b`` projections;
- MLP (``train_mlp``): every other ``nn.Linear`` of the decoder (dense MLPs, shared experts) except routers, and the
  fused expert weights (3-D parameters ``[experts, ., .]``, e.g. ``experts.gate_up_proj``), which peft adapts through
  ``target_parameters`` with one LoRA pair per expert (its only layout for fused experts);
- unembedding (``train_unembed``): the output projection.

Routers (``gate``, ``router``, ``*_gate``) are never adapted: routing is the base model's, frozen. Nor is a
vision-language model's vision tower: LoRA trains the language model, so every sampler snapshot of a base shares
its one tower's weights, as on the fast path.

peft rewrites the targets ``gate_proj`` / ``up_proj`` / ``down_proj`` of some MoE families (DeepSeek-V3, Qwen2/3-MoE,
Mixtral) into their fused expert weights, so that adapters trained on transformers v4 load on v5; with targets
found on the v5 modules that rewrite would drop the LoRA of dense MLPs and shared experts. ``v5_targets`` turns it
off while the engine makes its adapters.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tinker_cookbook.tinker import types

_ROUTER_NAMES = ("gate", "router")
_VISION_TOWERS = ("visual", "vision_tower", "vision_model")
"""Module names of vision towers in transformers' vision-language models (Qwen3-VL's is ``model.visual``)."""
_conversion_lock = threading.Lock()


@dataclass(frozen=True)
class LoraTargets:
    """What each LoRA switch adapts, as peft ``target_modules`` names and ``target_parameters`` names."""

    attn: tuple[str, ...]
    mlp: tuple[str, ...]
    experts: tuple[str, ...]
    unembed: tuple[str, ...]

    def modules(self, lora: types.LoraConfig) -> list[str]:
        return [*(self.attn if lora.train_attn else ()), *(self.mlp if lora.train_mlp else ()),
                *(self.unembed if lora.train_unembed else ())]

    def parameters(self, lora: types.LoraConfig) -> list[str]:
        return list(self.experts) if lora.train_mlp else []


def _is_router(leaf: str) -> bool:
    return leaf in _ROUTER_NAMES or leaf.endswith("_gate")


def _in_vision_tower(name: str) -> bool:
    return any(part in _VISION_TOWERS for part in name.split("."))


def lora_targets(model: Any) -> LoraTargets:
    """The LoRA targets of the HF causal LM (or vision-language model) ``model``, before peft wraps it."""
    head = model.get_output_embeddings()
    head_name = next(name for name, module in model.named_modules() if module is head)
    attn: dict[str, str] = {}
    mlp: dict[str, str] = {}
    tower_leaves: set[str] = set()
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if _in_vision_tower(name):
            tower_leaves.add(leaf)
        elif not _is_router(leaf):
            (attn if "attn" in name or "attention" in name else mlp)[name] = leaf
    experts = sorted({f"{module.rsplit('.', 1)[-1]}.{param}"
                      for module, param in (n.rsplit(".", 1) for n, p in model.named_parameters()
                                            if p.dim() == 3 and not _in_vision_tower(n))})
    attn_leaves, mlp_leaves = set(attn.values()), set(mlp.values())
    # A leaf name in both groups, or also in the vision tower: full module names keep them apart.
    if attn_leaves & mlp_leaves or (attn_leaves | mlp_leaves) & tower_leaves:
        return LoraTargets(tuple(sorted(attn)), tuple(sorted(mlp)), tuple(experts), (head_name,))
    return LoraTargets(tuple(sorted(attn_leaves)), tuple(sorted(mlp_leaves)), tuple(experts), (head_name,))


@contextlib.contextmanager
def v5_targets() -> Iterator[None]:
    """peft's v4-to-v5 rewrite of MoE LoRA targets, off while held (see the module docstring)."""
    from peft.utils import transformers_weight_conversion as conversion

    with _conversion_lock:
        original = conversion.convert_peft_config_for_transformers
        conversion.convert_peft_config_for_transformers = _keep_config
        try:
            yield
        finally:
            conversion.convert_peft_config_for_transformers = original


def _keep_config(peft_config: Any, model: Any, conversions: Any) -> None:
    """The engine's targets already name the v5 modules and parameters: nothing to convert."""
