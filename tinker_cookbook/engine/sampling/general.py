"""The sampler's general path (``engine.model_paths``): any transformers causal LM, through its own modules with a
KV cache, with the same request semantics as the compact decoder (``sampler``'s docstring is the spec).

- ``GeneralModel``: a snapshot's model. Each snapshot has its own module tree, built on the meta device and
  pointed at the frozen base's tensors (no copy); a LoRA adapter is merged by peft itself (``merge_and_unload`` with
  ``safe_merge``: the adapted weights, fused expert stacks included, become new tensors, the base's stay untouched),
  so whatever peft trains, the sampler runs.
- ``GeneralBatch``: a snapshot's requests. The samples of every request with the same prompt form a cohort: the
  prompt is prefilled once (its prompt logprobs and every sample's first token come from that pass), its cache is
  repeated for the cohort's samples, and each decode step advances a cohort's rows in one forward (equal lengths:
  no padding, no mask); finished rows leave the cache at once. Routing, sliding windows and latent attention are
  the model's own, through the cache it makes for itself.
- Images (Qwen3-VL-MoE): the prefill of a prompt with images runs the model on their pixels (its own vision tower)
  at the prompt's multimodal positions (``vision.PromptImages``); its samples then decode at positions shifted by
  the prompt's rope delta, as the model's own generation does.

Token selection, stops and seeds are ``batch``'s, shared with the fast path: the same seed gives the same tokens on
either path wherever the logits agree.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tinker_cookbook.engine import vision
from tinker_cookbook.engine.sampling.batch import Sequence, select_tokens_per_owner
from tinker_cookbook.engine.sampling.requests import ModelLimits
from tinker_cookbook.engine.sampling.steps import (
    BatchLimits,
    PendingRequest,
    PromptKey,
    SamplerStats,
    advance,
)
from tinker_cookbook.engine.training.general import v5_targets
from tinker_cookbook.tinker.errors import UnprocessableEntityError

# Prompt positions scored per unembedding matmul when prompt logprobs are asked for (bounds [rows, vocab] memory).
_SCORE_CHUNK = 256


@dataclass(eq=False)
class GeneralModel:
    """A snapshot's transformers causal LM (LoRA merged), in eval mode, and what requests are checked against."""

    model: Any
    limits: ModelLimits
    dtype: torch.dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def hidden(self, ids: torch.Tensor, cache: Any, images: vision.PromptVision | None = None, rope_delta: int = 0
               ) -> tuple[torch.Tensor, Any]:
        """The decoder's final hidden states of ``ids [rows, n]`` after ``cache`` (None: a new sequence), fp32, and
        the cache extended by them (the model makes the kind of cache it needs).

        ``images``: the prompt's images and multimodal positions (a prefill of one prompt). ``rope_delta``: after
        a prompt with images, a token at cache position ``p`` sits at rotary position ``p + rope_delta``. Positions
        are always passed explicitly then, so the model's own generation state (``rope_deltas``) is never used.
        """
        inputs: dict[str, Any] = {}
        if images is not None:
            pixel_values, grid = vision.image_batch(images.images)
            inputs = dict(pixel_values=pixel_values.to(ids.device), image_grid_thw=grid.to(ids.device),
                          position_ids=images.position_ids[:, None, :].to(ids.device))
        elif rope_delta:
            start = cache.get_seq_length() + rope_delta
            positions = torch.arange(start, start + ids.shape[1], device=ids.device)
            inputs = dict(position_ids=positions.view(1, 1, -1).expand(3, ids.shape[0], -1))
        out = self.model.base_model(input_ids=ids, cache=cache, use_cache=True, **inputs)
        return out.last_hidden_state.float(), out.cache

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits of fp32 hidden states (the output projection alone, as the trainer computes them)."""
        head = self.model.get_output_embeddings()
        return head(hidden.to(self.dtype)).float()


def build_general_model(config: Any, base_state: Mapping[str, torch.Tensor], adapter_state: Mapping[str, torch.Tensor]
                        | None, adapter_config: Mapping[str, Any] | None, dtype: torch.dtype) -> GeneralModel:
    """A snapshot of the base ``base_state`` (HF keys, only read) with the PEFT adapter ``adapter_state`` merged."""
    model = _skeleton(config, base_state)
    if adapter_state:
        model = _merged(model, adapter_state, dict(adapter_config or {}))
    if dtype != torch.float32:
        torch.nn.Module.to(model, dtype)  # copies: the base's tensors keep their dtype
    model.eval()
    text_config = getattr(config, "text_config", None) or config
    images = vision.prompt_images(config, base_state)
    limits = ModelLimits(vocab_size=int(text_config.vocab_size),
                         context_window=int(getattr(text_config, "max_position_embeddings", None) or 2048),
                         model_type=str(config.model_type), accepts_images=images is not None, vision=images)
    return GeneralModel(model=model, limits=limits, dtype=dtype)


def _skeleton(config: Any, base_state: Mapping[str, torch.Tensor]) -> Any:
    """The model's modules built on the meta device, their parameters the base's tensors (shared, never written)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if vision.is_vision_config(config) else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(copy.deepcopy(config))
    device = next(iter(base_state.values())).device
    model.load_state_dict(dict(base_state), strict=False, assign=True)
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head.weight.device.type == "meta":  # tied embeddings: the head gets its own Parameter on the same tensor, so
        head.weight = torch.nn.Parameter(embed.weight.detach(), requires_grad=False)  # merging LoRA into it is its own
    for module in model.modules():  # non-persistent buffers (rotary frequencies, embedding scales) are in no state
        _compute_buffers(model, module, device)  # dict: the model's own initialisation computes them
    missing = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if missing:
        raise UnprocessableEntityError(f"the base state has no tensor for {missing[:3]} ({len(missing)} in all); pass "
                                       "the model's full state dict")
    model.requires_grad_(False)
    return model


def _compute_buffers(model: Any, module: torch.nn.Module, device: torch.device) -> None:
    """Fill ``module``'s meta buffers as transformers' loading does (``model._init_weights``), on a scratch copy of
    the module whose parameters stay on the meta device: the initialisation also (re)initialises parameters, and
    the real ones are the base's shared tensors, which must never be written."""
    meta = [name for name, b in module._buffers.items() if b is not None and b.device.type == "meta"]
    if not meta:
        return
    scratch = copy.copy(module)
    scratch._parameters = {name: None if p is None else torch.nn.Parameter(torch.empty_like(p, device="meta"),
                                                                           requires_grad=False)
                           for name, p in module._parameters.items()}
    scratch._buffers = {name: None if b is None else torch.empty_like(b, device=device)
                        for name, b in module._buffers.items()}
    scratch._modules = {}
    model._init_weights(scratch)
    for name in meta:
        module._buffers[name] = scratch._buffers[name]


def _merged(model: Any, adapter_state: Mapping[str, torch.Tensor], adapter_config: dict[str, Any]) -> Any:
    """``model`` with the PEFT adapter merged by peft (new tensors for the adapted weights only)."""
    import peft

    config = peft.LoraConfig.from_peft_type(**adapter_config)
    config.inference_mode = True
    # peft initialises the LoRA weights it is about to overwrite from the global RNG: keep callers' streams intact.
    with torch.random.fork_rng(devices=[]), v5_targets():
        wrapped = peft.get_peft_model(model, config)
    peft.set_peft_model_state_dict(wrapped, dict(adapter_state))
    return wrapped.merge_and_unload(safe_merge=True)


@dataclass(eq=False)
class Cohort:
    """The decoding samples of one prompt: one cache row each, all at the same length."""

    rows: list[Sequence]
    cache: Any
    rope_delta: int = 0
    """The prompt's rotary position shift (non-zero only after images)."""

    def select(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` (in that order), in the list and in the cache."""
        self.rows = [self.rows[i] for i in keep]
        if self.rows:
            self.cache.batch_select_indices(torch.tensor(keep, device=_cache_device(self.cache)))


def _cache_device(cache: Any) -> torch.device:
    keys = next((layer.keys for layer in cache.layers if getattr(layer, "keys", None) is not None), None)
    return keys.device if keys is not None else torch.device("cpu")


def _cache_bytes(cache: Any) -> int:
    tensors = [t for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class GeneralBatch:
    """Requests and cohorts of one general-path snapshot (the ``DecoderBatch`` of the general path)."""

    def __init__(self, model: GeneralModel, limits: BatchLimits, stats: SamplerStats) -> None:
        self.model = model
        self.limits = limits
        self.stats = stats
        self.waiting: collections.deque[PendingRequest] = collections.deque()
        self.ready: collections.deque[Sequence] = collections.deque()  # unused: cohorts start decoding at once
        self.cohorts: list[Cohort] = []

    @property
    def active(self) -> list[Sequence]:
        return [row for cohort in self.cohorts for row in cohort.rows]

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.cohorts)

    @property
    def kv_bytes(self) -> int:
        return sum(_cache_bytes(c.cache) for c in self.cohorts)

    def drop_active(self) -> None:
        self.cohorts = []

    def requests(self) -> list[PendingRequest]:
        return list(self.waiting) + [row.request for row in self.active]

    def step(self) -> None:
        """Prefill waiting prompts while their samples fit, then decode one token for every cohort."""
        room = self.limits.max_batch_sequences - len(self.active)
        chosen: dict[PromptKey, list[PendingRequest]] = {}
        while self.waiting and room > 0:
            request = self.waiting.popleft()
            if not request.done:
                chosen.setdefault(request.prompt_key, []).append(request)  # tokens and images
                room -= request.spec.num_samples
        for requests in chosen.values():
            self._prefill(requests)
        for cohort in list(self.cohorts):
            self._decode(cohort)
        self.cohorts = [c for c in self.cohorts if c.rows]

    def _prefill(self, requests: list[PendingRequest]) -> None:
        """One forward over the prompt of ``requests`` (all with the same tokens and images): prompt logprobs,
        first tokens, a cohort."""
        model = self.model
        prompt, images = requests[0].spec.prompt, requests[0].spec.vision
        try:
            hidden, cache = model.hidden(torch.tensor([prompt], device=model.device), None, images)
            hidden = hidden[0]
            last_logits = model.logits(hidden[-1:])
        except Exception as error:  # noqa: BLE001 - the forward failed: these requests fail, others go on
            for request in requests:
                request.fail(error, self.stats)
            return
        self.stats.prefill_forwards += 1
        self.stats.prompts_prefilled += 1
        self.stats.prefill_tokens += len(prompt)
        self.stats.max_prompts_per_prefill = max(self.stats.max_prompts_per_prefill, 1)
        sequences: list[Sequence] = []
        for request in requests:
            spec = request.spec
            try:
                if spec.include_prompt_logprobs or spec.topk_prompt_logprobs:
                    scored, topk = self._score(hidden, prompt, spec.topk_prompt_logprobs)
                    request.prompt_logprobs = scored if spec.include_prompt_logprobs else None
                    request.topk_prompt_logprobs = topk
            except Exception as error:  # noqa: BLE001 - one request's failure must not stop the others
                request.fail(error, self.stats)
                continue
            sequences += [Sequence(request=request, index=index, params=spec.row, rng=rng, max_tokens=spec.max_tokens,
                                   stop_token_ids=spec.stop_token_ids, stop_strings=spec.stop_strings,
                                   prompt_len=len(prompt))
                          for index, rng in enumerate(request.sample_rngs())]
        if not sequences:
            return
        logits = last_logits.expand(len(sequences), -1)
        selected = select_tokens_per_owner(logits, [s.params for s in sequences], [s.next_uniform() for s in sequences],
                                           [s.request for s in sequences])
        rows = [s for s, result in zip(sequences, selected, strict=True) if not self._settle(s, result)]
        if rows:
            cache.batch_repeat_interleave(len(rows))
            self.cohorts.append(Cohort(rows=rows, cache=cache, rope_delta=images.rope_delta if images else 0))

    def _score(self, hidden: torch.Tensor, prompt: list[int], topk: int
               ) -> tuple[list[float | None], list[list[tuple[int, float]] | None] | None]:
        """Logprob of each prompt token given the ones before (first None), and the top-k at each position."""
        scored: list[float | None] = [None]
        ranked: list[list[tuple[int, float]] | None] | None = [None] if topk else None
        targets = torch.tensor(prompt[1:], device=hidden.device)
        for start in range(0, len(prompt) - 1, _SCORE_CHUNK):
            end = min(start + _SCORE_CHUNK, len(prompt) - 1)
            logprobs = torch.log_softmax(self.model.logits(hidden[start:end]), dim=-1)
            scored += logprobs.gather(1, targets[start:end, None])[:, 0].tolist()
            if ranked is not None:
                values, indices = logprobs.topk(topk, dim=-1)
                ranked += [list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
        if self.model.limits.vision is not None:
            self.model.limits.vision.hide_placeholders(prompt, scored, ranked)
        return scored, ranked

    def _decode(self, cohort: Cohort) -> None:
        """Advance every row of ``cohort`` by one token (one forward)."""
        model = self.model
        try:
            ids = torch.tensor([[row.tokens[-1]] for row in cohort.rows], device=model.device)
            hidden, cohort.cache = model.hidden(ids, cohort.cache, rope_delta=cohort.rope_delta)
            logits = model.logits(hidden[:, -1])
        except Exception as error:  # noqa: BLE001 - the step failed for this cohort; others keep going
            for row in cohort.rows:
                row.request.fail(error, self.stats)
            cohort.rows = []
            return
        rows = cohort.rows
        selected = select_tokens_per_owner(logits, [s.params for s in rows], [s.next_uniform() for s in rows],
                                           [s.request for s in rows])
        self.stats.decode_steps += 1
        self.stats.max_batch_sequences_seen = max(self.stats.max_batch_sequences_seen, len(rows))
        keep = [i for i, (row, result) in enumerate(zip(rows, selected, strict=True)) if not self._settle(row, result)]
        if len(keep) < len(rows):
            cohort.select(keep)

    def _settle(self, sequence: Sequence, result: Any) -> bool:
        """Apply one row's selection; True when the sequence leaves (done, ended or failed)."""
        if isinstance(result, Exception):
            sequence.request.fail(result, self.stats)
            return True
        token, logprob = result
        return sequence.request.done or advance(sequence, token, logprob, self.stats)

