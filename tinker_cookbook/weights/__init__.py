"""Trained weights out of the store: download an adapter, merge it into a full model, export GGUF, publish.

- :func:`download`: a checkpoint's files (a ``sampler_weights/`` checkpoint is a PEFT adapter folder);
- :func:`build_hf_model`: the base model with the adapter merged in, a Hugging Face folder for transformers,
  vLLM or SGLang (tokenizer with the run's chat template, model card, sharded safetensors);
- :func:`build_lora_adapter`: the adapter alone in the PEFT layout serving engines load beside the base;
- :func:`export_gguf`: a merged folder as one GGUF file (f16, bf16, f32 or q8_0) for llama.cpp and Ollama;
- :func:`publish`: a folder pushed to the Hugging Face Hub;
- :class:`FolderSamplingClient`: sample from a merged folder with transformers, as from a ``SamplingClient``.

Every output appears complete or not at all (written under a temporary name, renamed at the end). The same
operations are the ``tinker-cookbook weights ...`` commands; see ``docs/weights.md``.

Example::

    from tinker_cookbook import weights

    merged = weights.build_hf_model(adapter_path="tinker://RUN/sampler_weights/final", output_path="./merged")
    weights.export_gguf(merged, "./model.gguf", quant="q8_0", ollama=True)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tinker_cookbook.weights._card import EXPORT_INFO_FILE, export_info
    from tinker_cookbook.weights._download import download
    from tinker_cookbook.weights._folder_sampler import FolderSamplingClient
    from tinker_cookbook.weights._gguf import export_gguf, read_gguf
    from tinker_cookbook.weights._merge import build_hf_model
    from tinker_cookbook.weights._names import DTYPE_NAMES, QUANT_NAMES
    from tinker_cookbook.weights._peft import build_lora_adapter, serving_limitations
    from tinker_cookbook.weights._publish import planned_upload, publish

# Loaded on first use: the package pulls in torch and transformers, which `tinker-cookbook --help` should not.
_WHERE = {
    "EXPORT_INFO_FILE": "_card", "export_info": "_card", "download": "_download",
    "FolderSamplingClient": "_folder_sampler", "export_gguf": "_gguf", "read_gguf": "_gguf",
    "build_hf_model": "_merge", "DTYPE_NAMES": "_names", "QUANT_NAMES": "_names", "build_lora_adapter": "_peft",
    "serving_limitations": "_peft", "planned_upload": "_publish", "publish": "_publish",
}

__all__ = [
    "DTYPE_NAMES", "EXPORT_INFO_FILE", "QUANT_NAMES", "FolderSamplingClient", "build_hf_model", "build_lora_adapter",
    "download", "export_gguf", "export_info", "planned_upload", "publish", "read_gguf", "serving_limitations",
]
assert set(__all__) == set(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
