"""Writing your own ``SamplingClientEvaluator``: a grader-function evaluator and an LLM-as-judge evaluator.

``CustomEvaluator`` has the shape of the docs' example: render each question, sample an answer, parse it, grade
it with a Python function. ``LLMJudgeEvaluator`` grades each answer with another model (any ``MessageCompleter``,
e.g. a ``TinkerMessageCompleter`` on a grader model) against a reference answer and a rubric. Both sample all
questions concurrently (the sampler batches them) and return metrics under their ``name``::

    evaluator = CustomEvaluator(dataset=[{"input": "What is the capital of France?", "output": "Paris"}],
                                grader_fn=lambda response, target: target.lower() in response.lower(),
                                model_name="HuggingFaceTB/SmolLM2-135M-Instruct", renderer_name="chatml")
    metrics = await evaluator(sampling_client)        # {"custom/accuracy": 1.0}

In a training config, pass a builder (a zero-argument callable), e.g. ``LLMJudgeEvaluatorBuilder(...)`` or
``functools.partial(CustomEvaluator, dataset=..., ...)``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import chz

from tinker_cookbook import renderers, tinker
from tinker_cookbook.completers import MessageCompleter, TinkerMessageCompleter
from tinker_cookbook.eval.evaluators import SamplingClientEvaluator
from tinker_cookbook.exceptions import ConfigurationError, DataFormatError
from tinker_cookbook.preference.types import LabeledComparison

if TYPE_CHECKING:
    from tinker_cookbook.preference.preference_datasets import Comparisons


def _check_dataset(dataset: Sequence[dict[str, Any]], keys: tuple[str, ...], parts_ok: tuple[str, ...] = ()) -> None:
    """Every example has a string under each of ``keys`` (or, for ``parts_ok`` keys, a list of content parts)."""
    if not dataset:
        raise DataFormatError("the evaluation dataset is empty; pass at least one example")
    for index, example in enumerate(dataset):
        missing = [key for key in keys if not isinstance(example.get(key), (str, list) if key in parts_ok else str)]
        if missing:
            raise DataFormatError(f"dataset[{index}] has no string field(s) {missing}: {example!r}; every example "
                                  f"needs {list(keys)}")


class CustomEvaluator(SamplingClientEvaluator):
    """Samples an answer to each ``{"input": ..., "output": ...}`` example and grades it with ``grader_fn``.

    ``input`` is the user message's content: a string, or a list of content parts (e.g. an image and a question,
    for a vision-language model's renderer).

    Metrics: ``{name}/accuracy``, the fraction of answers for which ``grader_fn(response, target)`` is true.
    """

    def __init__(self, dataset: Sequence[dict[str, Any]], grader_fn: Callable[[str, str], bool], model_name: str,
                 renderer_name: str, max_tokens: int = 100, temperature: float = 0.7, name: str = "custom") -> None:
        _check_dataset(dataset, ("input", "output"), parts_ok=("input",))
        self.dataset = list(dataset)
        self.grader_fn = grader_fn
        self.renderer = renderers.renderer_for(model_name, renderer_name)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.name = name

    async def _answer(self, sampling_client: tinker.SamplingClient, question: str | list[Any]) -> str:
        params = tinker.SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, top_p=1.0,
                                       stop=self.renderer.get_stop_sequences())
        prompt = self.renderer.build_generation_prompt([renderers.Message(role="user", content=question)])
        response = await sampling_client.sample_async(prompt=prompt, num_samples=1, sampling_params=params)
        message, _termination = self.renderer.parse_response(response.sequences[0].tokens)
        return renderers.get_text_content(message)

    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        answers = await asyncio.gather(*(self._answer(sampling_client, d["input"]) for d in self.dataset))
        correct = sum(self.grader_fn(answer, d["output"]) for answer, d in zip(answers, self.dataset, strict=True))
        return {f"{self.name}/accuracy": correct / len(self.dataset)}


# ---------------------------------------------------------------------------------------------------------
# LLM as a judge
# ---------------------------------------------------------------------------------------------------------

DEFAULT_RUBRIC = (
    "You grade answers to questions. Compare the answer with the reference answer: it is correct when it states "
    "the same fact, even if worded differently or with extra explanation; it is incorrect when it contradicts "
    "the reference, misses it or hedges between several answers."
)

_GRADE = re.compile(r"GRADE:\s*([CI])\b")


def judge_prompt(rubric: str, question: str, reference: str, answer: str) -> list[renderers.Message]:
    """The grader's conversation: the rubric as the system message, the case as the user message."""
    case = (f"Question:\n{question}\n\nReference answer:\n{reference}\n\nAnswer to grade:\n{answer}\n\n"
            "Explain briefly, then end with a line 'GRADE: C' if the answer is correct or 'GRADE: I' if not.")
    return [renderers.Message(role="system", content=rubric), renderers.Message(role="user", content=case)]


def parse_grade(reply: str) -> bool | None:
    """True for ``GRADE: C``, False for ``GRADE: I`` (the last one counts), None when the reply has no grade."""
    grades = _GRADE.findall(reply)
    return None if not grades else grades[-1] == "C"


class LLMJudgeEvaluator(SamplingClientEvaluator):
    """Answers each ``{"input": question, "output": reference}`` example and asks ``grader`` whether it is right.

    Metrics: ``{name}/accuracy`` (answers graded correct; a reply without a grade counts as incorrect) and
    ``{name}/ungraded`` (the fraction of grader replies without a ``GRADE: C|I`` line, a sign of a weak grader).
    """

    def __init__(self, dataset: Sequence[dict[str, Any]], grader: MessageCompleter, model_name: str,
                 renderer_name: str, rubric: str = DEFAULT_RUBRIC, max_tokens: int = 256, temperature: float = 0.0,
                 name: str = "judge") -> None:
        _check_dataset(dataset, ("input", "output"))
        self.dataset = list(dataset)
        self.grader = grader
        self.renderer = renderers.renderer_for(model_name, renderer_name)
        self.rubric = rubric
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.name = name
        self.last_transcripts: list[dict[str, Any]] = []
        """Question, answer, grader reply and grade of every example of the latest call (for inspection)."""

    async def _grade(self, policy: MessageCompleter, example: dict[str, Any]) -> dict[str, Any]:
        reply = await policy([renderers.Message(role="user", content=example["input"])])
        answer = renderers.get_text_content(reply)
        verdict = await self.grader(judge_prompt(self.rubric, example["input"], example["output"], answer))
        grader_text = renderers.get_text_content(verdict)
        return {"input": example["input"], "answer": answer, "grader": grader_text, "grade": parse_grade(grader_text)}

    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        policy = TinkerMessageCompleter(sampling_client, self.renderer, self.max_tokens, temperature=self.temperature)
        self.last_transcripts = list(await asyncio.gather(*(self._grade(policy, d) for d in self.dataset)))
        grades = [t["grade"] for t in self.last_transcripts]
        n = len(grades)
        return {f"{self.name}/accuracy": sum(g is True for g in grades) / n,
                f"{self.name}/ungraded": sum(g is None for g in grades) / n}


def load_examples(path: str) -> list[dict[str, Any]]:
    """``{"input": ..., "output": ...}`` examples from a JSONL file."""
    rows = []
    for number, line in enumerate(Path(path).expanduser().read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{path}:{number}: not JSON: {exc}") from exc
    return rows


@chz.chz
class LLMJudgeEvaluatorBuilder:
    """An ``LLMJudgeEvaluator`` whose grader samples from a Tinker model (a base model or a ``tinker://`` path)."""

    examples_path: str
    """JSONL of ``{"input": question, "output": reference answer}``."""
    model_name: str
    """The evaluated model's base model (tokenizer and renderer)."""
    renderer_name: str
    grader_model: str
    """A base model name or a ``tinker://`` sampler path."""
    grader_renderer_name: str | None = None
    """None: the grader model's recommended renderer (or the one stored with its checkpoint)."""
    grader_max_tokens: int = 256
    rubric: str = DEFAULT_RUBRIC
    max_tokens: int = 256
    temperature: float = 0.0
    name: str = "judge"

    def __call__(self) -> LLMJudgeEvaluator:
        from tinker_cookbook.eval.inspect_utils import resolve_renderer_name

        service_client = tinker.ServiceClient()
        if self.grader_model.startswith("tinker://"):
            sampling_client = service_client.create_sampling_client(model_path=self.grader_model)
            grader_path: str | None = self.grader_model
        else:
            sampling_client = service_client.create_sampling_client(base_model=self.grader_model)
            grader_path = None
        base = sampling_client.get_base_model()
        grader_renderer = renderers.get_renderer(
            resolve_renderer_name(self.grader_renderer_name, base, grader_path, service_client),
            sampling_client.get_tokenizer(), model_name=base,
        )
        grader = TinkerMessageCompleter(sampling_client, grader_renderer, self.grader_max_tokens, temperature=0.0)
        return LLMJudgeEvaluator(load_examples(self.examples_path), grader, self.model_name, self.renderer_name,
                                 rubric=self.rubric, max_tokens=self.max_tokens, temperature=self.temperature,
                                 name=self.name)


# ---------------------------------------------------------------------------------------------------------
# Preference-model judges (RLHF: ``tinker_cookbook.preference.preference_model``)
# ---------------------------------------------------------------------------------------------------------


def _test_split(comparison_builder: Any, purpose: str) -> Comparisons:
    """The test split of a ``preference_datasets.ComparisonDatasetBuilder``; ``purpose`` ends the error message."""
    _, test = comparison_builder()
    if test is None:
        raise DataFormatError(f"{type(comparison_builder).__name__} has no test split {purpose}")
    return test


class PreferenceAccuracyEvaluator(SamplingClientEvaluator):
    """Held-out accuracy of a pairwise preference model while it trains: the evaluated weights are the judge.

    Each labelled comparison is judged in both orders (``judge_both_orders``). Metrics under ``name``:
    ``accuracy`` (1 when both orders pick the labelled side, 0.5 when they disagree), ``accuracy_as_shown``,
    ``accuracy_swapped`` (each order alone) and ``num_pairs``.
    """

    def __init__(self, comparisons: Sequence[LabeledComparison], renderer: renderers.Renderer,
                 name: str = "preference") -> None:
        self.comparisons = [c for c in comparisons if c.label != "Tie"]
        if not self.comparisons:
            raise DataFormatError("no labelled comparison (A or B) to measure the preference model's accuracy on")
        self.renderer = renderer
        self.name = name

    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        from tinker_cookbook.preference.preference_model import (
            LabelLogprobPreferenceModel,
            judge_both_orders,
            preference_accuracy_metrics,
        )

        model = LabelLogprobPreferenceModel(sampling_client, self.renderer)
        verdicts = await judge_both_orders(model, [c.comparison for c in self.comparisons])
        return preference_accuracy_metrics(verdicts, [c.label for c in self.comparisons], self.name)


@chz.chz
class PreferenceAccuracyEvaluatorBuilder:
    """A ``PreferenceAccuracyEvaluator`` on the test split of ``comparison_builder`` (at most ``max_pairs``)."""

    comparison_builder: Any
    """A ``preference_datasets.ComparisonDatasetBuilder`` with a test split."""
    model_name: str
    renderer_name: str | None = None
    max_pairs: int | None = None
    name: str = "preference"

    def __call__(self) -> PreferenceAccuracyEvaluator:
        test = _test_split(self.comparison_builder, "to measure the preference model's accuracy on")
        n = len(test) if self.max_pairs is None else min(self.max_pairs, len(test))
        renderer = renderers.renderer_for(self.model_name, self.renderer_name)  # the preference model's
        return PreferenceAccuracyEvaluator([test.get(i) for i in range(n)], renderer, self.name)


class ComparisonEvaluator(SamplingClientEvaluator):
    """Win rate of the evaluated policy against a fixed reference policy on held-out prompts, judged by a
    preference model in both completion orders.

    For every prompt both policies sample ``samples_per_prompt`` replies (seeded; the reference's are sampled once
    and kept, since its weights never change), paired in order. A matchup counts 1 when the judge prefers the
    policy's reply with it shown first and with it shown second, 0.5 when the two orders disagree, 0 otherwise;
    a reply that is empty or cut off at ``max_tokens`` loses to a valid one (two invalid ones: 0.5).
    Metrics under ``name``: ``win_rate``, ``stderr`` (of the mean over matchups), ``win_prob`` (the judge's mean
    probability, orders averaged), ``format`` (valid policy replies), ``num_matchups``, and the mean reply lengths
    in tokens, ``reply_tokens`` (the policy's) and ``reference_reply_tokens``.
    """

    def __init__(self, prompts: Sequence[list[renderers.Message]], reference_client: tinker.SamplingClient,
                 preference_model: Any, renderer: renderers.Renderer, max_tokens: int, temperature: float = 1.0,
                 samples_per_prompt: int = 1, seed: int = 0, name: str = "win_rate") -> None:
        if not prompts:
            raise DataFormatError("no prompts to measure the win rate on")
        self.prompts = list(prompts)
        self.reference_client = reference_client
        self.preference_model = preference_model
        self.renderer = renderer
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.samples_per_prompt = samples_per_prompt
        self.seed = seed
        self.name = name
        self._reference: list[tuple[renderers.Message, bool, int]] | None = None

    async def _replies(self, client: tinker.SamplingClient) -> list[tuple[renderers.Message, bool, int]]:
        """Each prompt's replies: the message, whether it is valid, and its length in sampled tokens."""
        from tinker_cookbook.preference.comparison_env import parse_reply

        async def sample(index: int, prompt: list[renderers.Message]) -> list[tuple[renderers.Message, bool, int]]:
            params = tinker.SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature,
                                           seed=self.seed + index, stop=self.renderer.get_stop_sequences())
            response = await client.sample_async(self.renderer.build_generation_prompt(prompt),
                                                 self.samples_per_prompt, params)
            return [(*parse_reply(self.renderer, seq.tokens), len(seq.tokens)) for seq in response.sequences]

        per_prompt = await asyncio.gather(*(sample(i, p) for i, p in enumerate(self.prompts)))
        return [reply for replies in per_prompt for reply in replies]

    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        from tinker_cookbook.preference.comparison_env import unjudged_score
        from tinker_cookbook.preference.preference_model import judge_both_orders
        from tinker_cookbook.preference.types import Comparison

        if self._reference is None:
            self._reference = await self._replies(self.reference_client)
        policy = await self._replies(sampling_client)
        prompts = [p for p in self.prompts for _ in range(self.samples_per_prompt)]
        judged = [i for i, ((_, ok, _), (_, ref_ok, _)) in enumerate(zip(policy, self._reference, strict=True))
                  if ok and ref_ok]
        verdicts = await judge_both_orders(self.preference_model, [
            Comparison(prompts[i], [policy[i][0]], [self._reference[i][0]]) for i in judged])
        wins = [unjudged_score(ok, ref_ok) for (_, ok, _), (_, ref_ok, _) in zip(policy, self._reference, strict=True)]
        probs = list(wins)
        for k, i in enumerate(judged):
            wins[i] = verdicts.decided(k)
            probs[i] = 0.5 * (verdicts.forward[k] + verdicts.swapped[k])
        n = len(wins)
        mean = sum(wins) / n
        variance = sum((w - mean) ** 2 for w in wins) / max(n - 1, 1)
        return {f"{self.name}/win_rate": mean, f"{self.name}/stderr": (variance / n) ** 0.5,
                f"{self.name}/win_prob": sum(probs) / n,
                f"{self.name}/format": sum(ok for _, ok, _ in policy) / n, f"{self.name}/num_matchups": float(n),
                f"{self.name}/reply_tokens": sum(length for _, _, length in policy) / n,
                f"{self.name}/reference_reply_tokens": sum(length for _, _, length in self._reference) / n}


@chz.chz
class ComparisonEvaluatorBuilder:
    """A ``ComparisonEvaluator`` on the distinct test prompts of ``comparison_builder`` (at most ``max_prompts``),
    against the reference policy (the checkpoint ``reference_model_path``, or ``reference_base_model``'s base
    weights), judged by ``preference_model_builder``."""

    comparison_builder: Any
    """A ``preference_datasets.ComparisonDatasetBuilder`` whose test split holds the held-out prompts."""
    preference_model_builder: Any
    """A ``preference_model.PreferenceModelBuilder``."""
    reference_model_path: str | None = None
    """The reference policy's sampler checkpoint (in RLHF: the SFT policy)."""
    reference_base_model: str | None = None
    """Or a base model's weights as the reference (e.g. the policy before training); set exactly one."""
    model_name: str
    """The policies' base model (tokenizer and renderer)."""
    renderer_name: str | None = None
    """The policies' renderer (None: the model's recommended one)."""
    max_tokens: int = 32
    temperature: float = 1.0
    samples_per_prompt: int = 2
    max_prompts: int | None = None
    seed: int = 0
    name: str = "win_rate"

    def __call__(self) -> ComparisonEvaluator:
        from tinker_cookbook.preference.comparison_env import distinct_prompts

        test = _test_split(self.comparison_builder, "of held-out prompts")
        prompts = distinct_prompts(test, self.max_prompts)
        if (self.reference_model_path is None) == (self.reference_base_model is None):
            raise ConfigurationError("set exactly one of reference_model_path (a sampler checkpoint) and "
                                     f"reference_base_model; got {self.reference_model_path!r} and "
                                     f"{self.reference_base_model!r}")
        service = tinker.ServiceClient()
        reference = (service.create_sampling_client(model_path=self.reference_model_path)
                     if self.reference_model_path is not None
                     else service.create_sampling_client(base_model=self.reference_base_model))
        renderer = renderers.renderer_for(self.model_name, self.renderer_name)  # the policy's (the judge has its own)
        return ComparisonEvaluator(prompts, reference, self.preference_model_builder(), renderer, self.max_tokens,
                                   self.temperature, self.samples_per_prompt, self.seed, self.name)
