"""Trained weights out of the store: download an adapter, merge it into a full model, export GGUF, publish.

- :func:`download`: a checkpoint's files (a ``sampler_weights/`` checkpoint is a PEFT adapter folder);
- :func:`build_hf_model`: the base model with the adapter merged in, a Hugging Face folder for transformers,
  vLLM or SGLang (tokenizer with the run's chat template, model card, sharded safetensors);
- :func:`build_lora_adapter`: the adapter alone in the PEFT layout serving engines load beside the base;
- :func:`export_gguf`: a merged folder as one GGUF file (f16, bf16, f32 or q8_0) for llama.cpp and Ollama;
- :func:`publish`: a folder pushed to the Hugging Face Hub.

Every output appears complete or not at all (written under a temporary name, renamed at the end). The same
operations are the ``tinker-cookbook weights ...`` commands; see ``docs/weights.md``.

Example::

    from tinker_cookbook import weights

    merged = weights.build_hf_model(adapter_path="tinker://RUN/sampler_weights/final", output_path="./merged")
    weights.export_gguf(merged, "./model.gguf", quant="q8_0", ollama=True)
"""

from tinker_cookbook.weights._download import download
from tinker_cookbook.weights._gguf import QUANT_TYPES, export_gguf, read_gguf
from tinker_cookbook.weights._merge import build_hf_model
from tinker_cookbook.weights._peft import build_lora_adapter, serving_limitations

__all__ = ["QUANT_TYPES", "build_hf_model", "build_lora_adapter", "download", "export_gguf", "read_gguf",
           "serving_limitations"]
