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
from typing import Any

import chz

from tinker_cookbook import renderers, tinker
from tinker_cookbook.completers import MessageCompleter, TinkerMessageCompleter
from tinker_cookbook.eval.evaluators import SamplingClientEvaluator
from tinker_cookbook.exceptions import DataFormatError
from tinker_cookbook.tokenizer_utils import get_tokenizer


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
        self.renderer = renderers.get_renderer(renderer_name, get_tokenizer(model_name), model_name=model_name)
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
        self.renderer = renderers.get_renderer(renderer_name, get_tokenizer(model_name), model_name=model_name)
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
