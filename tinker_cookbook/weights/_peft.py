"""``build_lora_adapter``: the adapter alone, in the PEFT layout that serving engines load beside the base model.

``vllm serve BASE --enable-lora --lora-modules name=FOLDER`` and SGLang's ``--lora-paths name=FOLDER`` read
``adapter_config.json`` + ``adapter_model.safetensors`` with keys ``base_model.model.<module>.lora_A/B.weight``.
Neither takes a LoRA on the unembedding (``lm_head``): an adapter that trained it is written whole (PEFT loads it),
and the function says so; serve the merged model instead (``build_hf_model``), or train with
``train_unembed=False`` for adapters meant for those engines.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tinker_cookbook.weights._adapter import PEFT_PREFIX, UNEMBED_MODULE, Adapter, open_adapter
from tinker_cookbook.weights._card import CARD_FILE, model_card, write_export_info
from tinker_cookbook.weights._merge import prepare_export
from tinker_cookbook.weights._output import check_target, output_dir
from tinker_cookbook.weights._tokenizer import save_tokenizer

logger = logging.getLogger(__name__)

SERVING_ENGINES = "vLLM and SGLang"


def serving_limitations(adapter: Adapter) -> list[str]:
    """What the serving engines cannot load of this adapter, each with what to do instead."""
    if not adapter.trains_unembed:
        return []
    return [f"{SERVING_ENGINES} do not load a LoRA on the unembedding ({UNEMBED_MODULE}), which this run trained: "
            "serve the merged model instead (`tinker-cookbook weights merge`), or train with train_unembed=False. "
            "PEFT (transformers) loads the whole adapter."]


def _peft_config(adapter: Adapter, base_model: str) -> dict[str, object]:
    config = dict(adapter.config)
    config.update(base_model_name_or_path=base_model, task_type="CAUSAL_LM", peft_type="LORA", inference_mode=True)
    config["target_modules"] = sorted({m.rsplit(".", 1)[-1] for m in adapter.pairs})
    return config


def build_lora_adapter(*, adapter_path: str, output_path: str, base_model: str | None = None,
                       renderer_name: str | None = None, log_path: str | None = None, base_url: str | None = None,
                       force: bool = False) -> str:
    """Write the adapter at ``adapter_path`` as a PEFT folder for serving engines, with the tokenizer (the run's
    chat template) and a model card; returns the folder. ``base_model`` (a name or a local folder) defaults to the
    one the adapter was trained on; the adapter is checked against its shapes. What serving engines cannot load is
    logged as a warning and written into the model card (see :func:`serving_limitations`)."""
    import safetensors.torch

    target = Path(output_path).expanduser()
    check_target(target, force)
    with open_adapter(adapter_path, base_url) as adapter:
        name, base, renderer = prepare_export(adapter, base_model, renderer_name)
        limits = serving_limitations(adapter)
        with output_dir(target, force) as out:
            state = {}
            for module, pair in adapter.pairs.items():
                state[f"{PEFT_PREFIX}{module}.lora_A.weight"] = pair.a.contiguous()
                state[f"{PEFT_PREFIX}{module}.lora_B.weight"] = pair.b.contiguous()
            safetensors.torch.save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
            (out / "adapter_config.json").write_text(json.dumps(_peft_config(adapter, name), indent=2) + "\n")
            save_tokenizer(out, base, renderer)
            usage = (f"```bash\nvllm serve {name} --enable-lora --max-lora-rank {adapter.rank} "
                     f"--lora-modules adapter={target.name}\n```\n\n```python\nfrom peft import PeftModel\n"
                     f"model = PeftModel.from_pretrained(base_model, {target.name!r})\n```")
            if limits:
                usage += "\n\n**Serving engines:** " + " ".join(limits)
            (out / CARD_FILE).write_text(model_card(adapter, name, "adapter", renderer, log_path, usage))
            write_export_info(out, adapter, name, renderer)
    for limit in limits:
        logger.warning("%s", limit)
    return str(target)
