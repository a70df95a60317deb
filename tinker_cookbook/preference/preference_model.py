"""A pairwise preference model: a policy trained to answer ``A`` or ``B`` after a comparison prompt (RLHF stage 2).

A comparison (a prompt conversation and two completions) is shown to the model as a system message with the
instruction (``INSTRUCTION``: which reply is better, A or B?) and a user message with the case::

    Conversation:
    User: What is the capital of Peru?

    Reply A:
    lima

    Reply B:
    The capital of Peru is Lima.

and the model is trained by supervised learning to reply with the preferred letter. Only the label's first token
is trained (``comparison_to_datum`` cuts the sequence right after it), so the model learns the choice, not the
end-of-turn tokens. ``PreferenceModelDatasetBuilder`` renders each comparison in both orders (or, cheaper, swaps
every other one), so that the letters carry no position bias in the data.

``LabelLogprobPreferenceModel`` judges with the trained weights through a sampling client: the probability that
A is better is ``softmax(logprob(A), logprob(B))`` of the two label tokens after the prompt (one forward pass:
the label ``A`` is appended to the prompt and the prompt logprobs give it, with ``B`` among the top-k of the same
position). ``__call__`` averages the comparison and its swap, ``(P_A(a, b) + 1 - P_A(b, a)) / 2``, which cancels a
preference for a position. ``PreferenceModelBuilder`` (chz) makes one from a saved sampler checkpoint.
"""

from __future__ import annotations

import asyncio
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import chz

from tinker_cookbook import tinker
from tinker_cookbook.exceptions import ConfigurationError, DataError
from tinker_cookbook.preference.preference_datasets import Comparisons, DPODatasetBuilder
from tinker_cookbook.preference.types import Comparison, LabeledComparison, completion_text
from tinker_cookbook.renderers import Message, Renderer, TrainOnWhat, get_text_content
from tinker_cookbook.supervised.common import datum_from_model_input_weights
from tinker_cookbook.tinker import types

INSTRUCTION = "Compare two replies to the conversation. Answer A or B: which reply is better?"
# The label tokens are looked up among this many most likely tokens of the label position (one forward pass);
# a label outside them is scored with a second pass.
TOP_K = 20


def conversation_text(messages: Sequence[Message]) -> str:
    """``Role: text`` lines of a conversation (what the preference model reads)."""
    return "\n".join(f"{m['role'].capitalize()}: {get_text_content(m)}" for m in messages)


def comparison_messages(comparison: Comparison) -> list[Message]:
    """The comparison as the preference model's conversation: the instruction, then the case (kept short: the
    model reads one of these for every matchup of stage 3)."""
    case = "\n\n".join([f"Conversation:\n{conversation_text(comparison.prompt_conversation)}",
                         f"Reply A:\n{completion_text(comparison.completion_A)}",
                         f"Reply B:\n{completion_text(comparison.completion_B)}"])
    return [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": case}]


def _label_prefix(comparison: Comparison, label: str, renderer: Renderer) -> tuple[list[int], int]:
    """The tokens of the comparison prompt followed by the first token of the reply ``label``, and the index of
    that token (the only one trained)."""
    answer: Message = {"role": "assistant", "content": label}
    messages = [*comparison_messages(comparison), answer]
    model_input, weights = renderer.build_supervised_example(messages, TrainOnWhat.LAST_ASSISTANT_MESSAGE)
    trained = [i for i, w in enumerate(weights.tolist()) if i > 0 and w > 0]
    if not trained:
        raise DataError(f"rendering the label {label!r} gave no trainable token")
    first = trained[0]
    return model_input.to_ints()[: first + 1], first


def comparison_to_datum(labeled: LabeledComparison, renderer: Renderer, max_length: int | None) -> types.Datum:
    """A datum that trains the label's first token (only) after the comparison prompt. Ties cannot train."""
    if labeled.label == "Tie":
        raise DataError("a tie has no preferred completion, so it cannot train a pairwise preference model; drop it")
    tokens, first = _label_prefix(labeled.comparison, labeled.label, renderer)
    if max_length is not None and len(tokens) > max_length:
        raise DataError(f"the comparison prompt is {len(tokens) - 1} tokens, longer than max_length={max_length}; "
                        "raise max_length or shorten the completions")
    weights = [0.0] * first + [1.0]
    return datum_from_model_input_weights(tinker.ModelInput.from_ints(tokens), weights, reduction="mean")


@chz.chz
class PreferenceModelDatasetBuilder(DPODatasetBuilder):
    """Supervised data for the preference model from labelled comparisons.

    ``both_orders=True``: each comparison gives two datums in the same batch, as given and swapped: the only way
    to fit both is to judge the replies, not their positions (a 135M model fitted to one order per comparison
    mostly learns to answer A). ``False`` (half the cost): one datum, comparison ``i`` swapped when ``i`` is odd,
    so that either letter is the answer about half the time even when the data always lists the chosen
    completion first. ``common_config.batch_size`` counts comparisons. The test
    set is one batch.
    """

    both_orders: bool = True

    def _render(self, comparisons: Comparisons, index: int) -> list[types.Datum]:
        labeled = comparisons.get(index)
        max_length = self.common_config.max_length
        if self.both_orders:
            return [comparison_to_datum(labeled, self.renderer, max_length),
                    comparison_to_datum(labeled.swap(), self.renderer, max_length)]
        return [comparison_to_datum(labeled.swap() if index % 2 else labeled, self.renderer, max_length)]


# ---------------------------------------------------------------------------------------------------------
# Judging with a trained preference model
# ---------------------------------------------------------------------------------------------------------


class PreferenceModel(ABC):
    """Judges a comparison: the probability that completion A is better than completion B."""

    @abstractmethod
    async def prob_a_better(self, comparison: Comparison) -> float:
        """P(A better) for the comparison as shown (may depend on the order)."""

    async def __call__(self, comparison: Comparison) -> float:
        """P(A better), averaged over both orders so that a preference for a position cancels."""
        forward, swapped = await asyncio.gather(self.prob_a_better(comparison),
                                                self.prob_a_better(comparison.swap()))
        return 0.5 * (forward + 1.0 - swapped)


def _label_token(renderer: Renderer, label: str) -> int:
    probe = Comparison([{"role": "user", "content": "?"}], [{"role": "assistant", "content": "x"}],
                       [{"role": "assistant", "content": "y"}])
    tokens, _ = _label_prefix(probe, label, renderer)
    return tokens[-1]


class LabelLogprobPreferenceModel(PreferenceModel):
    """The trained model's own odds of the two label tokens after the comparison prompt."""

    def __init__(self, sampling_client: tinker.SamplingClient, renderer: Renderer) -> None:
        self.sampling_client = sampling_client
        self.renderer = renderer
        self.token_a, self.token_b = _label_token(renderer, "A"), _label_token(renderer, "B")
        if self.token_a == self.token_b:
            raise ConfigurationError("the labels A and B start with the same token under this renderer")

    async def prob_a_better(self, comparison: Comparison) -> float:
        tokens, _ = _label_prefix(comparison, "A", self.renderer)  # prompt + the label token A
        response = await self.sampling_client.sample_async(
            tinker.ModelInput.from_ints(tokens), 1, types.SamplingParams(max_tokens=1, temperature=1.0),
            include_prompt_logprobs=True, topk_prompt_logprobs=TOP_K)
        logprob_a = _last(response.prompt_logprobs)
        top = dict((response.topk_prompt_logprobs or [None])[-1] or [])
        if self.token_b in top:
            logprob_b = top[self.token_b]
        else:  # B is unlikely here: score it exactly with a second pass
            logprob_b = _last(await self.sampling_client.compute_logprobs_async(
                tinker.ModelInput.from_ints([*tokens[:-1], self.token_b])))
        # softmax over the two labels, written to stay finite for very unequal logprobs
        return 1.0 / (1.0 + math.exp(max(-50.0, min(50.0, logprob_b - logprob_a))))


def _last(logprobs: Sequence[float | None] | None) -> float:
    if not logprobs or logprobs[-1] is None:
        raise DataError("the sampler returned no logprob for the label token")
    value = logprobs[-1]
    assert value is not None
    return float(value)


@chz.chz
class PreferenceModelBuilder:
    """A ``LabelLogprobPreferenceModel`` on saved weights (``model_path``, a ``sampler_weights/`` path)."""

    model_name: str
    """The base model the preference model was trained on (tokenizer and renderer)."""
    renderer_name: str | None = None
    """None: the model's recommended renderer."""
    model_path: str | None = None
    """The preference model's sampler checkpoint; None only until a pipeline fills it in."""

    def __call__(self) -> PreferenceModel:
        if self.model_path is None:
            raise ConfigurationError("preference_model_builder.model_path is not set; pass the sampler_path of the "
                                     "trained preference model (stage 2's final checkpoint)")
        client = tinker.ServiceClient().create_sampling_client(model_path=self.model_path)
        return LabelLogprobPreferenceModel(client, self.renderer())

    def renderer(self) -> Renderer:
        from tinker_cookbook.renderers import get_renderer
        from tinker_cookbook.supervised.types import resolve_renderer_name
        from tinker_cookbook.tokenizer_utils import get_tokenizer

        return get_renderer(resolve_renderer_name(self.model_name, self.renderer_name), get_tokenizer(self.model_name),
                            model_name=self.model_name)


@dataclass(frozen=True)
class Verdicts:
    """Per comparison: P(A better) with A shown first and with A shown second (as 1 - P(B better))."""

    forward: list[float]
    swapped: list[float]

    def decided(self, index: int) -> float:
        """1 if both orders prefer A, 0 if both prefer B, 0.5 if the orders disagree (an exact 0.5 is half)."""
        return 0.5 * (_vote(self.forward[index]) + _vote(self.swapped[index]))


def _vote(p: float) -> float:
    return 1.0 if p > 0.5 else 0.0 if p < 0.5 else 0.5


async def judge_both_orders(model: PreferenceModel, comparisons: Sequence[Comparison]) -> Verdicts:
    """The model's P(A better) for every comparison in both orders (all queued at once: the sampler batches)."""
    probs = await asyncio.gather(*(model.prob_a_better(c) for c in comparisons),
                                 *(model.prob_a_better(c.swap()) for c in comparisons))
    n = len(comparisons)
    return Verdicts(list(probs[:n]), [1.0 - p for p in probs[n:]])


def preference_accuracy_metrics(verdicts: Verdicts, labels: Sequence[str], prefix: str) -> dict[str, Any]:
    """Accuracy of the verdicts against labels ``A``/``B``: a comparison counts 1 when both orders pick the
    labelled side, 0.5 when the orders disagree. Also the accuracy of each order alone."""
    n = len(labels)
    target = [1.0 if label == "A" else 0.0 for label in labels]
    both = sum(1.0 - abs(verdicts.decided(i) - target[i]) for i in range(n)) / n
    first = sum(1.0 - abs(_vote(verdicts.forward[i]) - target[i]) for i in range(n)) / n
    second = sum(1.0 - abs(_vote(verdicts.swapped[i]) - target[i]) for i in range(n)) / n
    return {f"{prefix}/accuracy": both, f"{prefix}/accuracy_as_shown": first, f"{prefix}/accuracy_swapped": second,
            f"{prefix}/num_pairs": float(n)}
