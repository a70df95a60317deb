"""Admitting a decoder batch's waiting requests: one packed prefill forward over their distinct prompts (identical
prompts computed once, several prompts without padding), their prompt logprobs when asked for, and every sample's
first token drawn from its prompt's last logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tinker_cookbook.engine.sampling import decoder_model
from tinker_cookbook.engine.sampling.batch import Sequence, select_tokens_per_owner
from tinker_cookbook.engine.vision import SamplerVision

if TYPE_CHECKING:
    from tinker_cookbook.engine.sampling.steps import DecoderBatch, PendingRequest

# Prompt positions scored per unembedding matmul when prompt logprobs are asked for (bounds [rows, vocab] memory).
_SCORE_CHUNK = 256


def admit(batch: DecoderBatch) -> None:
    """Prefill waiting prompts while their samples fit in the batch (packed, within the token budget)."""
    room = batch.limits.max_batch_sequences - len(batch.active) - len(batch.ready)
    chosen: list[PendingRequest] = []
    tokens = 0
    while batch.waiting and room > 0:
        request = batch.waiting[0]
        if chosen and tokens + len(request.spec.prompt) > batch.limits.prefill_token_budget:
            break
        batch.waiting.popleft()
        if request.done:  # cancelled by its caller
            continue
        chosen.append(request)
        tokens += len(request.spec.prompt)
        room -= request.spec.num_samples
    # One prefill per adapter: a prompt's K/V are its own snapshot's (a shared prefix too).
    by_adapter: dict[int, list[PendingRequest]] = {}
    for request in chosen:
        by_adapter.setdefault(id(request.weights.adapter), []).append(request)
    for group in by_adapter.values():
        _prefill(batch, group)

def _prefill(batch: DecoderBatch, requests: list[PendingRequest]) -> None:
    """One packed forward over the distinct prompts of ``requests`` (identical prompts are computed once), all
    of one snapshot or of snapshots with the same decoder and adapter."""
    decoder = requests[0].weights.model
    batch.use_threads(decoder, None)
    prompts = {r.prompt_key: (r.spec.prompt, r.spec.vision) for r in requests}
    distinct = list(prompts)
    try:
        limits = requests[0].weights.limits
        images = None
        if limits.vision is not None:  # the compact decoder's snapshots are built with the vision tower
            assert isinstance(limits.vision, SamplerVision), "a fast-path snapshot's vision has no tower"
            images = limits.vision.pack([prompts[k] for k in distinct])
        result = decoder_model.prefill(decoder, [prompts[k][0] for k in distinct], batch.pool.dtype, images)
        # The last position's hidden state of each distinct prompt: every sample of every request with that
        # prompt draws its first token from these logits, computed once in one matmul.
        last_hidden = torch.cat([hidden[-1:] for hidden in result.hidden])
        last_logits = decoder_model.logits(decoder, last_hidden)
    except Exception as error:  # noqa: BLE001 - isolate the request that breaks the forward
        if len(requests) == 1:
            requests[0].fail(error, batch.stats)
        else:
            for request in requests:
                _prefill(batch, [request])
        return
    stats = batch.stats
    stats.prefill_forwards += 1
    stats.prompts_prefilled += len(distinct)
    stats.prefill_tokens += sum(len(prompts[k][0]) for k in distinct)
    stats.max_prompts_per_prefill = max(stats.max_prompts_per_prefill, len(distinct))
    row_of = {key: row for row, key in enumerate(distinct)}
    started: list[tuple[PendingRequest, int]] = []
    for request in requests:
        row = row_of[request.prompt_key]
        try:
            _score_prompt(request, result.hidden[row])
        except Exception as error:  # noqa: BLE001 - one request's failure must not stop the others
            request.fail(error, batch.stats)
            continue
        # Requests sharing a prompt share its K/V tensor: it is only ever read (copied into the prompt pool).
        request.kv = result.kv[row]
        started.append((request, row))
    _first_tokens(batch, decoder, started, last_logits, last_hidden)

def _score_prompt(request: PendingRequest, hidden: torch.Tensor) -> None:
    """The prompt logprobs (and top-k) of ``request``, when asked for."""
    spec = request.spec
    if not (spec.include_prompt_logprobs or spec.topk_prompt_logprobs):
        return
    scored, topk = score_prompt(request.weights.model, hidden, spec.prompt, spec.topk_prompt_logprobs)
    if spec.vision is not None and request.weights.limits.vision is not None:
        request.weights.limits.vision.hide_placeholders(spec.prompt, scored, topk)
    request.prompt_logprobs = scored if spec.include_prompt_logprobs else None
    request.topk_prompt_logprobs = topk

def _first_tokens(batch: DecoderBatch, decoder: decoder_model.DecoderWeights,
                 started: list[tuple[PendingRequest, int]], last_logits: torch.Tensor, last_hidden: torch.Tensor) -> None:
    """Draw every sample's first token from its prompt's last logits (row ``row`` of ``last_logits``), all
    requests of a prefill together, and queue the unfinished samples for cache slots."""
    sequences: list[tuple[Sequence, int]] = []
    for request, row in started:
        spec = request.spec
        sequences += [
            (
                Sequence(
                    request=request,
                    index=index,
                    params=spec.row,
                    rng=rng,
                    max_tokens=spec.max_tokens,
                    stop_token_ids=spec.stop_token_ids,
                    stop_strings=spec.stop_strings,
                    prompt_len=len(spec.prompt),
                    rope_delta=spec.vision.rope_delta if spec.vision is not None else 0,
                ),
                row,
            )
            for index, rng in enumerate(request.sample_rngs())
        ]
    # In batch-sized chunks, to bound the [rows, vocab] memory.
    for start in range(0, len(sequences), batch.limits.max_batch_sequences):
        chunk = sequences[start : start + batch.limits.max_batch_sequences]
        rows = torch.tensor([row for _, row in chunk], device=last_logits.device)
        chunk_hidden = last_hidden[rows]
        selected = select_tokens_per_owner(
            last_logits[rows],
            [s.params for s, _ in chunk],
            [s.next_uniform() for s, _ in chunk],
            [s.request for s, _ in chunk],
            lambda subset, chosen: decoder_model.token_logits(decoder, chunk_hidden[subset], chosen),  # noqa: B023
        )
        for (sequence, _), result in zip(chunk, selected, strict=True):
            if isinstance(result, Exception):
                sequence.request.fail(result, batch.stats)  # this request only: its neighbours drew their tokens
                continue
            token, logprob = result
            if not sequence.request.done and not batch.advance(sequence, token, logprob):
                batch.ready.append(sequence)
                sequence.request.unplaced += 1
    for request, _ in started:
        if not request.unplaced:
            request.kv = None


def score_prompt(
    decoder: decoder_model.DecoderWeights, hidden: torch.Tensor, prompt: list[int], topk: int
) -> tuple[list[float | None], list[list[tuple[int, float]] | None] | None]:
    """Logprob of each prompt token given the ones before (first None), and optionally the top-k at each position."""
    scored: list[float | None] = [None]
    ranked: list[list[tuple[int, float]] | None] | None = [None] if topk else None
    targets = torch.tensor(prompt[1:], device=hidden.device)
    for start in range(0, len(prompt) - 1, _SCORE_CHUNK):
        end = min(start + _SCORE_CHUNK, len(prompt) - 1)
        chunk_targets = targets[start:end, None]
        logprobs = torch.log_softmax(
            decoder_model.logits(decoder, hidden[start:end], also=chunk_targets), dim=-1
        )
        scored += logprobs.gather(1, chunk_targets)[:, 0].tolist()
        if ranked is not None:
            values, indices = logprobs.topk(topk, dim=-1)
            ranked += [list(zip(i, v, strict=True)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
    return scored, ranked
