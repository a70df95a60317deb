"""The frozen base model that every training session's adapter sits on, loaded once per process.

Its weights never change: sessions add and remove named peft adapters on it, and forward passes activate the
adapter of their request (or, in a mixed pass, route each row through its own, see ``multi_lora``). On the CPU its
Linear layers run on packed weights (``frozen_linear``) and its decoder layers as fused autograd functions
(``fused_layers``), as ``engine.settings`` allows.
"""

from __future__ import annotations

import contextlib
import json
import random
import warnings
from typing import Any

import torch
from transformers import PreTrainedModel

from tinker_cookbook.engine import model_paths, settings, vision
from tinker_cookbook.engine.models import ModelSpec
from tinker_cookbook.engine.training import frozen_linear, fused_layers, general, multi_lora
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

LORA_ALPHA = 32
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)


class BaseModel:
    """One frozen base model shared by all adapters on it, plus clean references to its weights."""

    def __init__(self, spec: ModelSpec, model: PreTrainedModel, compute_dtype: torch.dtype = torch.float32) -> None:
        """``model``: fp32, on the engine's device. ``compute_dtype`` bf16 runs the frozen base's matmuls in bf16
        (on the CPU through bf16 weights packed once, see ``frozen_linear``; elsewhere autocast); LoRA parameters,
        gradients, the optimizer state and the logits stay fp32 either way."""
        self.spec = spec
        self.config = model.config
        self.device = next(model.parameters()).device
        self.compute_dtype = compute_dtype
        text_config = getattr(model.config, "text_config", None) or model.config
        self.vocab_size: int = int(text_config.vocab_size)
        self.is_vision = hasattr(model.config, "vision_config")
        self.image_inputs = vision.image_inputs_for(spec.name, spec.source, model.config)
        # References (no copies) to the weights before peft wraps the modules; they never change.
        tied = bool(getattr(text_config, "tie_word_embeddings", False) or getattr(model.config, "tie_word_embeddings", False))
        self.base_state: dict[str, torch.Tensor] = {
            k: v.detach() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")
        }
        # peft records this as the adapter's base model (adapter_config.json); config-built models have none.
        model.config.name_or_path = spec.name
        model.__dict__["name_or_path"] = spec.name
        self._model = model
        self._peft_model: Any = None
        self.decoder_positions = 0
        """Token positions run through the decoder so far (padding and each shared prefix once included)."""
        # On the CPU the frozen Linear layers compute through packed weights (bf16: instead of autocast, which
        # re-casts every weight per call, forward and backward). In bf16 mode only their matmuls are bf16: the
        # activations between them, attention, LoRA and the unembedding (so the logits) stay fp32.
        self.packed_bytes = 0
        self.general = model_paths.is_general(model.config)
        """On the general path (``engine.model_paths``): the transformers modules as they are, LoRA targets found
        from them (``general.lora_targets``), no packed weights, no fused layers, no shared-prefix pass."""
        self._targets = general.lora_targets(model) if self.general else None
        self._expert_targets: tuple[str, ...] | None = None
        if self.general:
            model_paths.check_general(spec.name, model.config)
            model_paths.announce(spec.name, model.config)
        elif self.device.type == "cpu" and (compute_dtype == torch.bfloat16 or settings.pack_fp32_base()):
            skip = UNEMBED_MODULES if compute_dtype != torch.float32 else ()
            self.packed_bytes = frozen_linear.install(model, compute_dtype, skip=skip)
        if self.device.type == "cpu" and settings.fused_layers() and not self.general:
            fused_layers.install(model)
        self.packs_rows = (getattr(model.config, "_attn_implementation", None) == fused_layers.ATTENTION_NAME
                           and (compute_dtype == torch.float32 or self.packed_bytes > 0))
        """Whether training passes may pack long rows without padding (``passes.packable``): where the fused
        attention computes each packed row's attention on its own, which needs fp32 activations (not autocast).
        Elsewhere the packed mask would cost more than the padding saves."""

    def add_adapter(self, name: str, lora: types.LoraConfig) -> None:
        import peft  # slow to import; only needed once a training client exists

        targets = [
            *(ATTN_MODULES if lora.train_attn else ()),
            *(MLP_MODULES if lora.train_mlp else ()),
            *(UNEMBED_MODULES if lora.train_unembed else ()),
        ] if self._targets is None else self._targets.modules(lora)
        parameters = self._targets.parameters(lora) if self._targets is not None else []
        self._check_expert_targets(parameters)
        config = peft.LoraConfig(
            r=lora.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=targets, bias="none",
            base_model_name_or_path=self.spec.name, target_parameters=parameters or None,
        )
        seed = lora.seed if lora.seed is not None else random.SystemRandom().randrange(2**31)
        # peft initialises LoRA A from the global RNG: seed it locally so callers' RNG streams are untouched.
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings(), general.v5_targets():
            # With tied embeddings a LoRA on lm_head changes only the output projection, which is what
            # train_unembed means; the sampler gives lm_head its own weight when it merges. peft warns anyway.
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
            torch.manual_seed(seed)
            if self._peft_model is None:
                self._peft_model = peft.get_peft_model(self._model, config, adapter_name=name)
            else:
                self._peft_model.add_adapter(name, config)
        for param in self._peft_model.parameters():
            param.requires_grad_(False)

    def _check_expert_targets(self, parameters: list[str]) -> None:
        """peft adapts fused expert weights of all adapters on one model through the same wrappers: every adapter
        that targets them must target the same ones (train_mlp on or off does not mix on one base)."""
        live = self._peft_model is not None and any(
            getattr(c, "target_parameters", None) for c in self._peft_model.peft_config.values())
        if parameters and live and self._expert_targets != tuple(parameters):
            raise BadRequestError(f"train_mlp adapts the experts {parameters}, but another live client on "
                                  f"{self.spec.name} adapts {list(self._expert_targets or ())}; close it first")
        if parameters:
            self._expert_targets = tuple(parameters)

    def remove_adapter(self, name: str) -> None:
        if self._peft_model is not None and name in self._peft_model.peft_config:
            self._peft_model.delete_adapter(name)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The precision of the decoder's forward (its backward follows it): bf16 matmuls, or plain fp32."""
        if self.compute_dtype == torch.float32 or self.packed_bytes:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def activate(self, name: str) -> Any:
        """Make ``name`` the adapter that forward passes use; returns the wrapped HF causal LM."""
        self._peft_model.base_model.set_adapter(name)
        return self._peft_model.base_model.model

    def adapter_params(self, name: str) -> dict[str, torch.nn.Parameter]:
        """The adapter's trainable tensors, keyed without the adapter name (so saved state loads into any name)."""
        marker = f".{name}."
        return {
            k.replace(marker, "."): p for k, p in self._peft_model.named_parameters() if marker in k and "lora_" in k
        }

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """The adapter's weights under PEFT's saved-format keys (copies)."""
        import peft

        state = peft.get_peft_model_state_dict(self._peft_model, adapter_name=name, save_embedding_layers=False)
        return {k: v.detach().clone().contiguous() for k, v in state.items()}

    def check_adapter_state(self, name: str, state: dict[str, torch.Tensor], source: str) -> None:
        """Raise BadRequestError (naming ``source``) unless ``state`` has exactly the adapter's tensors, finite."""
        expected = self.adapter_state(name)
        bad = [k for k in expected if k not in state or state[k].shape != expected[k].shape]
        extra = [k for k in state if k not in expected]
        if bad or extra:
            raise BadRequestError(
                f"{source} does not match this adapter ({len(bad)} missing/mis-shaped, {len(extra)} unexpected "
                f"tensors, e.g. {(bad + extra)[:2]}); load it into a client with the same base model, rank and "
                "train_attn/train_mlp/train_unembed, or use create_training_client_from_state"
            )
        for key, tensor in state.items():
            if not tensor.dtype.is_floating_point or not bool(torch.isfinite(tensor).all()):
                raise BadRequestError(f"{source}: tensor {key!r} (dtype {tensor.dtype}) is not finite floating-point "
                                      "data; the checkpoint is damaged: load an earlier checkpoint or save it again")

    def load_adapter_state(self, name: str, state: dict[str, torch.Tensor], source: str = "adapter state") -> None:
        import peft

        self.check_adapter_state(name, state, source)
        with torch.no_grad():
            peft.set_peft_model_state_dict(self._peft_model, state, adapter_name=name)

    def adapter_config_dict(self, name: str) -> dict[str, Any]:
        config = self._peft_model.peft_config[name].to_dict()
        return json.loads(json.dumps(config, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))

    def lora_layers(self) -> list[Any]:
        """The LoRA-wrapped layers of every adapter (``multi_lora``'s view of the peft model)."""
        return multi_lora.lora_layers(self._peft_model)
