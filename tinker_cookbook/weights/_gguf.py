"""``export_gguf``: a merged model folder as one GGUF file for llama.cpp and Ollama, with the ``gguf`` package.

The layout follows llama.cpp's converter for the families the engine trains (``llama`` for Llama-3 and SmolLM2,
``qwen3``, ``qwen2``): tensors renamed with the package's name map, the query and key projections of ``llama``
models permuted to the interleaved rotary layout llama.cpp computes with (Qwen uses the split layout transformers
uses, so nothing moves), 1-D tensors (norms) kept in f32, and the tokenizer (byte-level BPE vocabulary, merges,
special ids) and the chat template in the metadata. ``read_gguf`` converts a file back to transformers' names and
layout, which is how the tests check a file against the folder it came from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tinker_cookbook.exceptions import ConfigurationError, WeightsError
from tinker_cookbook.weights._base import BaseFiles
from tinker_cookbook.weights._card import EXPORT_INFO_FILE, export_info
from tinker_cookbook.weights._chat_format import chat_format
from tinker_cookbook.weights._names import QUANT_NAMES
from tinker_cookbook.weights._output import check_target, output_file

QUANT_TYPES = QUANT_NAMES


@dataclass(frozen=True)
class _Arch:
    gguf_name: str
    tokenizer_pre: str
    permute_qk: bool


_ARCHES = {"llama": _Arch("llama", "llama-bpe", True), "qwen3": _Arch("qwen3", "qwen2", False),
           "qwen2": _Arch("qwen2", "qwen2", False)}
# SmolLM2 is a llama model whose byte-level BPE splits text as GPT-2 does rather than as Llama-3 does.
_SMOLLM_VOCAB = 49152


def _arch(config: dict[str, Any]) -> _Arch:
    model_type = str(config.get("model_type"))
    if model_type not in _ARCHES:
        raise WeightsError(f"GGUF export of model_type={model_type!r} is not supported yet; supported: "
                           f"{', '.join(sorted(_ARCHES))} (Llama-3, SmolLM2, Qwen3). A Qwen3-VL merge loads in "
                           "transformers and vLLM; its GGUF needs llama.cpp's own converter (language model + mmproj)")
    return _ARCHES[model_type]


def _ggml_type(quant: str) -> Any:
    import gguf

    if quant not in QUANT_TYPES:
        raise ConfigurationError(f"quant={quant!r} is not offered; choose one of {', '.join(QUANT_TYPES)}")
    return {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16,
            "f32": gguf.GGMLQuantizationType.F32, "q8_0": gguf.GGMLQuantizationType.Q8_0}[quant]


def _permute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """HF's split-halves rotary layout -> the interleaved one llama.cpp uses for ``llama`` (per head)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def _unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    return weight.reshape(heads, weight.shape[0] // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def _encode(name: str, tensor: torch.Tensor, quant: str) -> tuple[np.ndarray, Any]:
    """The tensor's data as written, and its GGML type (1-D tensors and rows not a multiple of 32 stay float)."""
    import gguf

    data = tensor.float().numpy()
    wanted = _ggml_type(quant)
    if tensor.dim() == 1:
        return data.astype(np.float32), gguf.GGMLQuantizationType.F32
    if wanted == gguf.GGMLQuantizationType.Q8_0 and data.shape[-1] % 32:
        wanted = gguf.GGMLQuantizationType.F16  # q8_0 blocks are 32 values along a row
    if wanted == gguf.GGMLQuantizationType.F32:
        return data.astype(np.float32), wanted
    if wanted == gguf.GGMLQuantizationType.F16:
        return data.astype(np.float16), wanted
    return gguf.quants.quantize(data, wanted), wanted


def _hyperparameters(writer: Any, config: dict[str, Any], name: str) -> None:
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    writer.add_name(name)
    writer.add_context_length(int(config.get("max_position_embeddings", 2048)))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads", heads)))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    writer.add_rope_freq_base(float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(int(config["vocab_size"]))


def _tokenizer_metadata(writer: Any, folder: Path, arch: _Arch, vocab_size: int) -> None:
    import gguf
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    added = {t.content: t.special for t in tokenizer.added_tokens_decoder.values()}
    tokens, types = [], []
    for index in range(vocab_size):
        token = by_id.get(index)
        if token is None:  # embedding rows past the tokenizer (padding to a round vocabulary size)
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(token)
            special = added.get(token)
            types.append(gguf.TokenType.NORMAL if special is None else
                         gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm" if vocab_size == _SMOLLM_VOCAB and arch.gguf_name == "llama"
                             else arch.tokenizer_pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size).add_to_gguf(writer, quiet=True)
    generation = folder / "generation_config.json"
    eos = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
    if isinstance(eos, list) and len(eos) > 1:  # the renderer's end of turn, where it differs from the eos
        writer.add_eot_token_id(int(eos[-1]))


def export_gguf(model_path: str, output_path: str, quant: str = "f16", ollama: bool = False,
                force: bool = False) -> str:
    """Write the merged model folder ``model_path`` (from :func:`build_hf_model`) as the GGUF file ``output_path``.

    ``quant``: ``f16`` (default), ``bf16``, ``f32`` or ``q8_0`` (8-bit blocks of 32; 1-D tensors stay f32). With
    ``ollama``, a ``Modelfile`` beside the file gives Ollama the renderer's prompt template and stop sequences
    (``ollama create NAME -f Modelfile``). Returns the GGUF path.
    """
    import gguf

    _ggml_type(quant)
    folder, target = Path(model_path).expanduser(), Path(output_path).expanduser()
    base = BaseFiles(str(folder), folder)
    if not (folder / "config.json").is_file():
        raise WeightsError(f"model_path={model_path!r} is not a model folder (no config.json); pass the output of "
                           "`tinker-cookbook weights merge`")
    config = base.config
    arch = _arch(config)
    modelfile = target.parent / "Modelfile"
    check_target(target, force)
    if ollama:
        check_target(modelfile, force)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.gguf_name.upper()], int(config["num_hidden_layers"]))
    heads, kv_heads = int(config["num_attention_heads"]), int(config.get("num_key_value_heads",
                                                                           config["num_attention_heads"]))
    with output_file(target, force) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch.gguf_name)
        _hyperparameters(writer, config, folder.name)
        writer.add_file_type({"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}[quant])
        _tokenizer_metadata(writer, folder, arch, int(config["vocab_size"]))
        for key, tensor in base.tensors():
            name = names.get_name(key, try_suffixes=(".weight", ".bias"))
            if name is None:
                raise WeightsError(f"tensor {key!r} of {model_path!r} has no GGUF name for {arch.gguf_name}")
            if arch.permute_qk and key.endswith("q_proj.weight"):
                tensor = _permute(tensor, heads)
            elif arch.permute_qk and key.endswith("k_proj.weight"):
                tensor = _permute(tensor, kv_heads)
            data, ggml_type = _encode(key, tensor, quant)
            writer.add_tensor(name, data, raw_dtype=ggml_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    if ollama:
        _write_modelfile(folder, target, modelfile, force)
    return str(target)


def _write_modelfile(folder: Path, gguf_path: Path, modelfile: Path, force: bool) -> None:
    from transformers import AutoTokenizer

    from tinker_cookbook.weights._tokenizer import stop_strings

    renderer = export_info(folder).get("renderer_name")
    if not renderer:
        raise WeightsError(f"{folder} does not record its renderer ({EXPORT_INFO_FILE}); merge it with "
                           "`tinker-cookbook weights merge` to get an Ollama Modelfile")
    stops = stop_strings(AutoTokenizer.from_pretrained(str(folder)), renderer)
    lines = [f"FROM ./{gguf_path.name}", f'TEMPLATE """{chat_format(renderer).ollama()}"""']
    lines += [f"PARAMETER stop {json.dumps(s)}" for s in stops]
    with output_file(modelfile, force) as tmp:
        tmp.write_text("\n".join(lines) + "\n")


def read_gguf(path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A GGUF file's metadata (scalars and strings) and its tensors, dequantized to fp32, under transformers'
    names and layout (the inverse of :func:`export_gguf` for the supported architectures)."""
    import gguf

    reader = gguf.GGUFReader(path)
    metadata: dict[str, Any] = {}
    for field in reader.fields.values():
        if field.types and field.types[0] != gguf.GGUFValueType.ARRAY:
            metadata[field.name] = field.contents()
    arch_name = str(metadata["general.architecture"])
    blocks = int(metadata[f"{arch_name}.block_count"])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch_name.upper()], blocks)
    heads, kv_heads = int(metadata[f"{arch_name}.attention.head_count"]), int(
        metadata[f"{arch_name}.attention.head_count_kv"])
    reverse = {}
    for hf_key in _hf_keys(arch_name, blocks):
        name = names.get_name(hf_key, try_suffixes=(".weight", ".bias"))
        if name is not None:
            reverse[name] = hf_key
    tensors = {}
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        value = torch.from_numpy(np.array(data, dtype=np.float32)).reshape(tuple(reversed(tensor.shape.tolist())))
        key = reverse[tensor.name]
        if _ARCHES[arch_name].permute_qk and key.endswith(("q_proj.weight", "k_proj.weight")):
            value = _unpermute(value, heads if key.endswith("q_proj.weight") else kv_heads)
        tensors[key] = value
    return metadata, tensors


def _hf_keys(arch_name: str, blocks: int) -> list[str]:
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                 "input_layernorm", "post_attention_layernorm"]
    keys = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    keys += [f"model.layers.{i}.{m}.{p}" for i in range(blocks) for m in per_layer for p in ("weight", "bias")]
    return keys
