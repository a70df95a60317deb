"""A sampling client over a Hugging Face model folder (a merged export), run with transformers.

It answers ``sample`` the way ``tinker.SamplingClient`` does (a future of a ``SampleResponse``), so that code written
against the API (``chat``, completers) runs on an exported model as well, without the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.futures import APIFuture
from tinker_cookbook.weights._card import export_info


class FolderSamplingClient:
    """Samples from the model in ``folder`` (``config.json`` + safetensors + tokenizer) on the CPU or ``device``."""

    def __init__(self, folder: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.folder = Path(folder).expanduser()
        model = AutoModelForCausalLM.from_pretrained(str(self.folder), dtype=dtype)
        torch.nn.Module.to(model, device)  # in place (transformers' typed ``to`` wrapper confuses type checkers)
        self.model = model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
        self.device = device
        self.info = export_info(self.folder)

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def get_base_model(self) -> str:
        return str(self.info.get("base_model") or self.folder)

    def _one(self, prompt: list[int], params: types.SamplingParams, generator: torch.Generator) -> types.SampledSequence:
        stops = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        stop_ids = {s for s in stops if isinstance(s, int)}
        stop_texts = [s for s in stops if isinstance(s, str)]
        tokens = list(prompt)
        out: list[int] = []
        past = None
        ids = torch.tensor([tokens], device=self.device)
        with torch.no_grad():
            while len(out) < (params.max_tokens or 1):
                result = self.model(ids, past_key_values=past, use_cache=True)
                past, logits = result.past_key_values, result.logits[0, -1].float()
                if not params.temperature:
                    token = int(logits.argmax())
                else:
                    probs = torch.softmax(logits / params.temperature, dim=-1)
                    token = int(torch.multinomial(probs.cpu(), 1, generator=generator))
                out.append(token)
                if token in stop_ids or any(s in self.tokenizer.decode(out) for s in stop_texts):
                    return types.SampledSequence(stop_reason="stop", tokens=out)
                ids = torch.tensor([[token]], device=self.device)
        return types.SampledSequence(stop_reason="length", tokens=out)

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
               **_: Any) -> APIFuture[types.SampleResponse]:
        """``num_samples`` continuations of ``prompt`` (greedy at temperature 0), stopping on ``sampling_params.stop``."""
        generator = torch.Generator().manual_seed(sampling_params.seed or 0)
        sequences = [self._one(prompt.to_ints(), sampling_params, generator) for _ in range(num_samples)]
        return APIFuture.completed(types.SampleResponse(sequences=sequences))
