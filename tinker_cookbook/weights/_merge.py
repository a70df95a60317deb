"""``build_hf_model``: the base model with a LoRA adapter merged in, as a Hugging Face model folder.

Every adapted weight becomes ``W + scale · B @ A`` (computed in fp32, then cast to the output dtype), including the
unembedding where the run trained it: a model with tied embeddings then gets its own ``lm_head.weight`` (the input
embedding stays as it was) and ``tie_word_embeddings: false``. The base is streamed one tensor at a time and written
in safetensors shards one tensor at a time (each file's header is known from the base's headers), so peak memory
is about one tensor (twice the largest, in fp32, while it is merged) above the process itself.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from tinker_cookbook.exceptions import ConfigurationError, WeightsError
from tinker_cookbook.weights._adapter import UNEMBED_MODULE, Adapter, LoraPair, open_adapter
from tinker_cookbook.weights._base import INDEX_FILE, SAFETENSORS_DTYPES, SINGLE_FILE, BaseFiles, resolve_base
from tinker_cookbook.weights._card import CARD_FILE, model_card, write_export_info
from tinker_cookbook.weights._names import DTYPE_NAMES
from tinker_cookbook.weights._output import check_target, output_dir
from tinker_cookbook.weights._tokenizer import choose_renderer, save_tokenizer, stop_token_ids

DTYPES: dict[str, torch.dtype | None] = {
    "auto": None, "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16,
}
"""Output dtype names (``_names.DTYPE_NAMES``); ``auto`` keeps each tensor's dtype in the base model's files."""
assert tuple(DTYPES) == DTYPE_NAMES, "the CLI's dtype names and the merge's differ"
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9


def parse_dtype(dtype: str) -> torch.dtype | None:
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ConfigurationError(f"dtype={dtype!r} is not offered; choose one of {', '.join(DTYPES)}") from None


def _embedding_key(keys: dict[str, tuple[int, ...]]) -> str | None:
    return next((k for k in keys if k.endswith("embed_tokens.weight")), None)


def plan_targets(adapter: Adapter, base: BaseFiles) -> dict[str, str]:
    """Base tensor key -> adapted module, checked against the base's shapes before anything is written.

    The unembedding of a model with tied embeddings has no tensor of its own: its LoRA applies to a new
    ``lm_head.weight`` made from the embedding, keyed here by the embedding."""
    if adapter.config.get("target_parameters"):
        # PEFT's fused-expert layout (one LoRA pair per expert on a stacked parameter) has no merge here yet; the
        # module check below would otherwise blame the base model.
        raise WeightsError(
            f"the adapter {adapter.source} adapts the fused expert weights of a mixture-of-experts model "
            f"({', '.join(adapter.config['target_parameters'])}), which merge and export do not support yet; use "
            "`weights adapter` or `weights download` for the PEFT folder, which peft loads onto the transformers model")
    shapes = base.keys_and_shapes()
    targets: dict[str, str] = {}
    for module, pair in adapter.pairs.items():
        key = f"{module}.weight"
        if key not in shapes and module == UNEMBED_MODULE:
            key = _embedding_key(shapes) or key
        if key not in shapes:
            raise WeightsError(f"the adapter {adapter.source} adapts {module!r}, which the base model {base.name!r} "
                               "does not have: it was trained on another model; pass that model as base_model")
        want = (pair.b.shape[0], pair.a.shape[1])
        if tuple(shapes[key]) != want:
            raise WeightsError(f"the adapter {adapter.source} changes {module!r} with shape {list(want)}, but the "
                               f"base model {base.name!r} has {list(shapes[key])}: it was trained on another model")
        targets[key] = module
    return targets


def merged_tensors(adapter: Adapter, base: BaseFiles, dtype: torch.dtype | None
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """The merged model's tensors, one at a time, in the base's order (plus an untied ``lm_head.weight``)."""
    targets = plan_targets(adapter, base)

    def merge(weight: torch.Tensor, pair: LoraPair) -> torch.Tensor:
        return (weight.float() + pair.delta()).to(dtype or weight.dtype)

    for key, tensor in base.tensors():
        module = targets.get(key)
        if module == UNEMBED_MODULE and not key.startswith(UNEMBED_MODULE):  # tied: the embedding itself stays
            yield key, tensor.to(dtype or tensor.dtype)
            yield f"{UNEMBED_MODULE}.weight", merge(tensor, adapter.pairs[module])
        elif module is not None:
            yield key, merge(tensor, adapter.pairs[module])
        else:
            yield key, tensor.to(dtype or tensor.dtype)


Layout = list[tuple[str, tuple[int, ...], torch.dtype]]
"""(key, shape, dtype) of each output tensor, in writing order."""


def merged_layout(adapter: Adapter, base: BaseFiles, dtype: torch.dtype | None) -> Layout:
    """What :func:`merged_tensors` yields, known from the headers before any tensor is read."""
    targets = plan_targets(adapter, base)
    layout: Layout = []
    for key, (shape, stored) in base.layout().items():
        layout.append((key, shape, dtype or stored))
        if targets.get(key) == UNEMBED_MODULE and not key.startswith(UNEMBED_MODULE):
            layout.append((f"{UNEMBED_MODULE}.weight", shape, dtype or stored))
    return layout


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def write_safetensors(path: Path, layout: Layout, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
    """A safetensors file of the tensors ``layout`` announces, written one tensor at a time: the header comes from
    the layout, so no tensor waits in memory for the others (``safetensors.save_file`` would hold them all and a
    serialised copy)."""
    names = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, shape, dtype in layout:
        size = _nbytes(shape, dtype)
        header[key] = {"dtype": names[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        for key, shape, dtype in layout:
            got, tensor = next(tensors)
            if got != key or tuple(tensor.shape) != shape or tensor.dtype != dtype:
                raise AssertionError(f"merge wrote {got} {tuple(tensor.shape)} {tensor.dtype} where the layout has "
                                     f"{key} {shape} {dtype}")
            handle.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)


def write_shards(layout: Layout, tensors: Iterator[tuple[str, torch.Tensor]], out: Path, max_shard_bytes: int
                 ) -> list[str]:
    """Write ``tensors`` as safetensors shards of at most ``max_shard_bytes`` (a bigger tensor gets its own), named
    as ``save_pretrained`` names them, with an index when there are several; returns the file names."""
    shards: list[Layout] = [[]]
    size = 0
    for entry in layout:
        nbytes = _nbytes(entry[1], entry[2])
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    if len(shards) == 1:
        write_safetensors(out / SINGLE_FILE, shards[0], tensors)
        return [SINGLE_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for shard, name in zip(shards, names, strict=True):
        write_safetensors(out / name, shard, tensors)
    weight_map = {key: name for shard, name in zip(shards, names, strict=True) for key, _, _ in shard}
    total = sum(_nbytes(shape, dtype) for _, shape, dtype in layout)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return names


def _config(base: BaseFiles, dtype: torch.dtype | None, untied: bool) -> dict[str, Any]:
    config = base.config
    if dtype is not None:
        config["torch_dtype" if "torch_dtype" in config else "dtype"] = str(dtype).removeprefix("torch.")
    if untied:
        config["tie_word_embeddings"] = False
        if isinstance(config.get("text_config"), dict):
            config["text_config"]["tie_word_embeddings"] = False
    return config


def _generation_config(base: BaseFiles, config: dict[str, Any], stops: list[int]) -> dict[str, Any]:
    """The base's generation config, stopping also on the renderer's end-of-turn tokens."""
    path = base.folder / "generation_config.json"
    generation = json.loads(path.read_text()) if path.is_file() else {}
    text_config = config.get("text_config") or config
    eos = generation.get("eos_token_id", text_config.get("eos_token_id"))
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    generation["eos_token_id"] = eos_ids + [s for s in stops if s not in eos_ids]
    for key in ("bos_token_id", "pad_token_id"):
        if key not in generation and text_config.get(key) is not None:
            generation[key] = text_config[key]
    return generation


def prepare_export(adapter: Adapter, base_model: str | None, renderer_name: str | None) -> tuple[str, BaseFiles, str]:
    """(base model name, its files, renderer name) for exporting ``adapter``, with everything that can be wrong
    (no base model, an adapter of another model, an unknown renderer) refused before anything is written."""
    name = base_model or adapter.base_model
    if not name:
        raise WeightsError(f"the adapter {adapter.source} does not record its base model; pass base_model")
    base = resolve_base(name)
    plan_targets(adapter, base)
    return name, base, choose_renderer(adapter, adapter.base_model or name, renderer_name)


def build_hf_model(*, adapter_path: str, output_path: str, base_model: str | None = None, dtype: str = "auto",
                   renderer_name: str | None = None, log_path: str | None = None, base_url: str | None = None,
                   max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, force: bool = False) -> str:
    """Merge the LoRA adapter at ``adapter_path`` into its base model; write a Hugging Face model folder.

    Args:
        adapter_path: a ``tinker://<run>/sampler_weights/<name>`` path or a downloaded adapter folder.
        output_path: the folder to create; an existing one is replaced only with ``force``.
        base_model: a model name or a local Hugging Face folder; default: the one the adapter was trained on.
        dtype: ``auto`` (each tensor as stored in the base), ``float32``, ``bfloat16`` or ``float16``.
        renderer_name: the chat format of the saved tokenizer; default: the run's renderer, else the base model's
            recommended one.
        log_path: the run's log folder, to put its ``config.json`` and final metrics into the model card.
        base_url: the Tinker-protocol server holding the checkpoint (default: the local store).
        max_shard_bytes: the largest safetensors shard.

    Returns the output folder. The folder holds ``config.json``, ``generation_config.json``, safetensors (sharded
    above ``max_shard_bytes``), the tokenizer with the renderer's chat template, and a model card ``README.md``.
    """
    target = Path(output_path).expanduser()
    out_dtype = parse_dtype(dtype)
    check_target(target, force)
    with open_adapter(adapter_path, base_url) as adapter:
        name, base, renderer = prepare_export(adapter, base_model, renderer_name)
        with output_dir(target, force) as out:
            layout = merged_layout(adapter, base, out_dtype)
            write_shards(layout, merged_tensors(adapter, base, out_dtype), out, max_shard_bytes)
            untied = adapter.trains_unembed and f"{UNEMBED_MODULE}.weight" not in base.keys_and_shapes()
            config = _config(base, out_dtype, untied=untied)
            (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            tokenizer = save_tokenizer(out, base, renderer)
            generation = _generation_config(base, config, stop_token_ids(tokenizer, renderer))
            (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
            usage = ("```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
                     f"model = AutoModelForCausalLM.from_pretrained({target.name!r})\n"
                     f"tokenizer = AutoTokenizer.from_pretrained({target.name!r})\n```")
            (out / CARD_FILE).write_text(model_card(adapter, name, "merged", renderer, log_path, usage))
            write_export_info(out, adapter, name, renderer)
            _copy_extras(base, out)
    return str(target)


def _copy_extras(base: BaseFiles, out: Path) -> None:
    """Processor files of vision-language models (the merge changes only the language model)."""
    for name in ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json"):
        if (base.folder / name).is_file() and not (out / name).exists():
            shutil.copyfile(base.folder / name, out / name)
