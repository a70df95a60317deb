"""Sequence ids and the provenance spans that name them.

Every sampled sequence gets a ``sequence_id``; a training datum may then say, run by run, which sampled sequence
each of its positions came from (``Datum.with_provenance``). A ``SequenceRegistry`` remembers the ids handed out,
with the prompt length and the number of sampled tokens of each, and checks a request's spans against them: a span
must name a known id and stay inside that sequence's prompt or sampled tokens, and the runs must tile the field
they annotate. The in-process clients share one registry per process; the protocol server keeps its own.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

MAX_REMEMBERED_SEQUENCES = 1 << 16
"""Sequence ids remembered (a few hundred bytes each); the least recently used are forgotten beyond this. An RL
step of 128 groups of 16 samples uses 2,048, so this covers the 32 most recent steps."""


@dataclass(frozen=True)
class _Sequence:
    prompt_length: int | None  # None: an image chunk left its token count to the model (see prompt_length)
    sampled_length: int


def prompt_length(prompt: types.ModelInput) -> int | None:
    """The prompt's length in tokens, or None where an image chunk has no ``expected_tokens`` (only the model knows
    how many tokens the image becomes; a prompt span naming such a sequence is then not bounded by its length)."""
    try:
        return prompt.length
    except ValueError:
        return None


def new_sequence_ids(count: int) -> list[str]:
    """``count`` fresh ids for the sequences of one sampling request."""
    request = secrets.token_hex(8)
    return [f"seq-{request}-{i}" for i in range(count)]


class SequenceRegistry:
    """The sequence ids handed out, and the checks of the provenance spans that name them."""

    def __init__(self, capacity: int = MAX_REMEMBERED_SEQUENCES) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._sequences: OrderedDict[str, _Sequence] = OrderedDict()

    def record(self, sequence_ids: Sequence[str], prompt_length: int | None, response: types.SampleResponse) -> None:
        """Remember the sequences of one sampling request (the ids in the order of ``response.sequences``)."""
        with self._lock:
            for sequence_id, sequence in zip(sequence_ids, response.sequences, strict=True):
                self._sequences[sequence_id] = _Sequence(prompt_length, len(sequence.tokens))
                self._sequences.move_to_end(sequence_id)
            while len(self._sequences) > self._capacity:
                self._sequences.popitem(last=False)

    def attach(self, prompt_length: int | None, response: types.SampleResponse) -> types.SampleResponse:
        """``response`` with a fresh id on every sequence that has none, all of them recorded."""
        fresh = iter(new_sequence_ids(len(response.sequences)))
        sequences = [s if s.sequence_id else s.model_copy(update={"sequence_id": next(fresh)})
                     for s in response.sequences]
        response = response.model_copy(update={"sequences": sequences})
        self.record([s.sequence_id or "" for s in sequences], prompt_length, response)
        return response

    def check(self, data: Any) -> None:
        """BadRequestError naming the first datum field whose spans are malformed or name an unknown sequence."""
        if not isinstance(data, (list, tuple)):
            return  # the engine names what is wrong with data that is not a list
        for index, datum in enumerate(data):
            if isinstance(datum, types.Datum) and datum.model_input_spans is not None:
                self._check_datum(f"data[{index}]", datum)

    def _check_datum(self, where: str, datum: types.Datum) -> None:
        targets = datum.loss_fn_inputs.get("target_tokens")
        rows = (targets.shape[0] if targets.shape else len(targets.data)) if targets is not None else None
        fields = (("model_input_spans", datum.model_input_spans, datum.model_input.length,
                   "the model_input tokens"),
                  ("loss_fn_input_spans", datum.loss_fn_input_spans, rows, "the target_tokens rows"))
        for name, spans, expected, what in fields:
            spans = spans or []
            if expected is not None:
                total = sum(span.length for span in spans)
                if total != expected:
                    raise BadRequestError(
                        f"{where}.{name} covers {total} positions but there are {expected} ({what}); the runs must "
                        "tile the field exactly: build them with Datum.with_provenance")
            for j, span in enumerate(spans):
                self._check_span(f"{where}.{name}[{j}]", span)

    def _check_span(self, where: str, span: types.PromptProvenanceSpan | types.SampledProvenanceSpan) -> None:
        with self._lock:
            known = self._sequences.get(span.sequence_id)
            if known is not None:
                self._sequences.move_to_end(span.sequence_id)
        if known is None:
            raise BadRequestError(
                f"{where}.sequence_id={span.sequence_id!r} is not a sequence sampled here (or it was forgotten: the "
                f"last {self._capacity} are kept); use the sequence_id of a SampledSequence that a sampling request "
                "to this server returned, or send the datum without provenance")
        if isinstance(span, types.PromptProvenanceSpan):
            limit, part = known.prompt_length, "prompt"
        else:
            limit, part = known.sampled_length, "sampled tokens"
        if limit is not None and span.offset + span.length > limit:
            raise BadRequestError(
                f"{where} covers positions [{span.offset}, {span.offset + span.length}) of the {part} of "
                f"{span.sequence_id!r}, which has {limit}; a span must stay inside its sequence")


LOCAL = SequenceRegistry()
"""The registry of the in-process clients: the ids their sampling clients handed out."""
