"""Rubric-graded RL: a grader model scores each reply against the prompt's own criteria.

A datapoint (``RubricBasedDatapoint``) is a conversation prefix the policy replies to and its rubric: a list of
criteria (``Rubric``: the criterion's text, how a free-text grader is told to answer and how its score is read,
and the criterion's weight). After the policy's reply, each criterion is graded on its own, by one of two graders:

- ``"probability"`` (the default, ``ProbabilityGrader``): the grader model is asked a yes/no question (does the
  reply meet this criterion?) and the score is ``P(Yes) / (P(Yes) + P(No))`` of its next token, read from the
  sampling client's ``compute_logprobs``. There is nothing to parse, so even a small grader that never follows an
  answer format gives a graded score.
- ``"text"`` (``TextGrader``, the official cookbook's grader): the grader writes an answer and the criterion's
  ``extraction_regex`` reads the score from it (``<score>...</score>`` by default), a number in [0, 1]. A
  malformed answer (no match, not a number, out of range) scores 0; the reason is logged (the transition's
  ``grade_error`` log, the ``logtree`` transcript and a warning) and counted in the ``grade_malformed`` metric.

The reward is the weighted mean of the criteria's scores, ``Σ weight_i · score_i / Σ weight_i`` (the official
cookbook's plain mean when every weight is 1), minus ``format_coef`` for a reply cut off before its stop sequence;
the metric ``rubric_score`` is that mean.

Data files are JSON lines ``{"convo": [messages], "rubric_items": [{"rubric_str": ..., "weight": ...}]}`` with the
official cookbook's keys (``extraction_regex``, ``grader_output_format_instruction`` and ``weight`` may be left
out; ``check`` is this project's addition, see ``rubric_checks``). ``example-data/rubric/`` holds an offline set
written for this project: short instructions with two to four criteria each, those about form checked by rule.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chz

from tinker_cookbook import tinker
from tinker_cookbook.completers import MessageCompleter, StopCondition
from tinker_cookbook.exceptions import ConfigurationError, DataError
from tinker_cookbook.renderers import Message, Renderer
from tinker_cookbook.rl.multiturn.message_env import renderer_for
from tinker_cookbook.rl.problem_env import is_stop_sequence_termination, message_text
from tinker_cookbook.rl.rubric_checks import run_check, validate_check
from tinker_cookbook.rl.types import Action, Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.utils import logtree
from tinker_cookbook.utils.logtree_formatters import ConversationFormatter

logger = logging.getLogger(__name__)

EXAMPLE_DATA = Path(__file__).resolve().parents[2] / "example-data" / "rubric"
Conversation = list[Message]

DEFAULT_EXTRACTION_REGEX = r"<score>(.*?)</score>"
DEFAULT_FORMAT_INSTRUCTION = "Please output your score between 0 and 1 wrapped in <score> ... </score>"
YES_NO_INSTRUCTION = "Does the chatbot's completion meet the criterion? Answer with Yes or No only."


@dataclass(frozen=True)
class Grade:
    """One criterion's score in [0, 1], or why the grader's answer could not be read (``score`` is then 0)."""

    score: float
    error: str | None = None
    detail: str = ""
    """What the grader said: its answer, or the yes/no probabilities."""


@dataclass(frozen=True)
class Rubric:
    """One criterion: what a good reply does (``rubric_str``), how a free-text grader answers
    (``grader_output_format_instruction``) and how its score is read (``extraction_regex``, group 1), and how much
    the criterion counts (``weight``). A criterion with a ``check`` (rules such as ``{"max_words": 10}``, see
    ``rubric_checks``) is scored by those rules instead of by the grader model."""

    rubric_str: str
    extraction_regex: str = DEFAULT_EXTRACTION_REGEX
    grader_output_format_instruction: str = DEFAULT_FORMAT_INSTRUCTION
    weight: float = 1.0
    check: dict[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if not self.rubric_str.strip():
            raise DataError("a rubric criterion's rubric_str is empty; write what a good reply does")
        if self.check is not None:
            try:
                object.__setattr__(self, "check", validate_check(self.check))
            except DataError as exc:
                raise DataError(f"criterion {self.rubric_str!r}: {exc}") from exc
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise DataError(f"criterion {self.rubric_str!r} has weight={self.weight}; weights must be positive")
        try:
            groups = re.compile(self.extraction_regex).groups
        except re.error as exc:
            raise DataError(f"criterion {self.rubric_str!r}: extraction_regex {self.extraction_regex!r} "
                            f"does not compile ({exc})") from exc
        if groups < 1:
            raise DataError(f"criterion {self.rubric_str!r}: extraction_regex {self.extraction_regex!r} needs a "
                            "group around the score, e.g. <score>(.*?)</score>")

    def _context_lines(self, convo: Conversation) -> list[str]:
        """The conversation (all but its last message), the completion to grade (its last) and the criterion."""
        context = "\n\n".join(f"{'Chatbot' if m['role'] == 'assistant' else 'Human'}: {message_text(m)}"
                              for m in convo[:-1])
        return ["I will show you a conversation context, a chatbot completion to grade, and a rubric.", "",
                "<context>", context or "(No prior context)", "</context>", "",
                "<completion_to_grade>", f"Chatbot: {message_text(convo[-1])}", "</completion_to_grade>", "",
                "<rubric>", self.rubric_str, "</rubric>", ""]

    def get_grader_prompt(self, convo: Conversation) -> Conversation:
        """The free-text grader's one user message; ``convo`` ends with the completion to grade."""
        lines = [*self._context_lines(convo), f"Please grade the chatbot's completion based on the rubric. {self.grader_output_format_instruction}"]
        return [{"role": "user", "content": "\n".join(lines)}]

    def get_yes_no_prompt(self, convo: Conversation) -> Conversation:
        """The probability grader's one user message: the same material and a yes/no question."""
        return [{"role": "user", "content": "\n".join([*self._context_lines(convo), YES_NO_INSTRUCTION])}]

    def parse_score(self, response: str) -> Grade:
        """The score ``extraction_regex`` finds in ``response``: a number in [0, 1], or 0 and the reason."""
        match = re.search(self.extraction_regex, response, re.DOTALL)
        if match is None:
            return Grade(0.0, f"no match for {self.extraction_regex!r}", response)
        try:
            score = float(match.group(1))
        except ValueError:
            return Grade(0.0, f"the score {match.group(1)!r} is not a number", response)
        if not 0.0 <= score <= 1.0:  # also rejects NaN
            return Grade(0.0, f"the score {score} is outside [0, 1]", response)
        return Grade(score, None, response)

    def extract_score(self, response: str) -> float:
        """The official cookbook's reader: the score, 0 (with a warning) when the answer is malformed."""
        grade = self.parse_score(response)
        if grade.error is not None:
            logger.warning("malformed grade, scored 0: %s; grader answered %r", grade.error, response[:200])
        return grade.score

    def to_dict(self) -> dict[str, Any]:
        d = {"rubric_str": self.rubric_str, "extraction_regex": self.extraction_regex,
             "grader_output_format_instruction": self.grader_output_format_instruction, "weight": self.weight}
        return d if self.check is None else {**d, "check": self.check}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Rubric:
        if "rubric_str" not in d:
            raise DataError(f"a rubric item needs 'rubric_str'; got keys {sorted(d)}")
        return Rubric(str(d["rubric_str"]), str(d.get("extraction_regex", DEFAULT_EXTRACTION_REGEX)),
                      str(d.get("grader_output_format_instruction", DEFAULT_FORMAT_INSTRUCTION)),
                      float(d.get("weight", 1.0)), d.get("check"))

    @staticmethod
    def from_json(line: str) -> Rubric:
        return Rubric.from_dict(json.loads(line))


@dataclass(frozen=True)
class RubricBasedDatapoint:
    """A conversation prefix the policy replies to, and the criteria its reply is graded on."""

    convo: Conversation
    rubric_items: Sequence[Rubric]

    def __post_init__(self) -> None:
        if not self.convo or self.convo[-1]["role"] != "user":
            raise DataError("a rubric datapoint's convo must end with a user message (the policy replies to it)")
        if not self.rubric_items:
            raise DataError(f"the datapoint ending {message_text(self.convo[-1])[:60]!r} has no rubric items")

    @property
    def total_weight(self) -> float:
        return sum(r.weight for r in self.rubric_items)

    def to_json(self) -> str:
        return json.dumps({"convo": self.convo, "rubric_items": [r.to_dict() for r in self.rubric_items]})

    @staticmethod
    def from_json(line: str) -> RubricBasedDatapoint:
        d = json.loads(line)
        missing = {"convo", "rubric_items"} - set(d)
        if missing:
            raise DataError(f"a rubric datapoint needs 'convo' and 'rubric_items'; missing {sorted(missing)}")
        return RubricBasedDatapoint(d["convo"], [Rubric.from_dict(r) for r in d["rubric_items"]])


def load_datapoints(path: str | Path) -> list[RubricBasedDatapoint]:
    """The datapoints of a JSON-lines file; a bad line is a DataError naming the file and line."""
    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(RubricBasedDatapoint.from_json(line))
        except (DataError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{path}:{i}: {exc}") from exc
    if not out:
        raise DataError(f"{path} holds no rubric datapoints")
    return out


def weighted_mean(rubric_items: Sequence[Rubric], scores: Sequence[float]) -> float:
    total = sum(r.weight for r in rubric_items)
    return sum(r.weight * s for r, s in zip(rubric_items, scores, strict=True)) / total


def yes_probability(logprob_yes: float, logprob_no: float) -> float:
    """``P(Yes) / (P(Yes) + P(No))`` from the two log-probabilities: a logistic of their difference, its
    exponent kept non-positive so that it cannot overflow."""
    diff = logprob_yes - logprob_no
    if diff >= 0:
        return 1.0 / (1.0 + math.exp(-diff))
    return math.exp(diff) / (1.0 + math.exp(diff))


# -- graders ----------------------------------------------------------------------------------------------------


class CriterionGrader(ABC):
    """Grades one criterion of a conversation that ends with the completion to grade."""

    @abstractmethod
    async def __call__(self, convo: Conversation, rubric: Rubric) -> Grade: ...


class TextGrader(CriterionGrader):
    """The grader model writes an answer; the criterion's ``extraction_regex`` reads the score from it."""

    def __init__(self, completer: MessageCompleter) -> None:
        self.completer = completer

    async def __call__(self, convo: Conversation, rubric: Rubric) -> Grade:
        answer = message_text(await self.completer(rubric.get_grader_prompt(convo)))
        grade = rubric.parse_score(answer)
        if grade.error is not None:
            logger.warning("malformed grade, scored 0: %s; grader answered %r", grade.error, answer[:200])
        return grade


class ProbabilityGrader(CriterionGrader):
    """The score is ``P(yes) / (P(yes) + P(no))`` for the grader's first answer token(s) after the yes/no question.

    A candidate's log-probability is the sum over its tokens. When both words are one token each (as "Yes" and "No"
    are in common tokenizers) one prefill gives both: the prompt followed by the yes token, with that position's
    ``topk`` most likely tokens; where the no token is not among them, or a word is several tokens, each candidate
    is read with its own ``compute_logprobs`` call."""

    def __init__(self, sampling_client: tinker.SamplingClient, renderer: Renderer, yes: str = "Yes",
                 no: str = "No", topk: int = 20) -> None:
        self.sampling_client, self.renderer, self.yes, self.no, self.topk = sampling_client, renderer, yes, no, topk
        self.yes_tokens = renderer.tokenizer.encode(yes, add_special_tokens=False)
        self.no_tokens = renderer.tokenizer.encode(no, add_special_tokens=False)
        for word, tokens in ((yes, self.yes_tokens), (no, self.no_tokens)):
            if not tokens:
                raise ConfigurationError(f"the grader's answer word {word!r} encodes to no tokens; pick a word")

    async def _logprob(self, prompt: list[int], answer: list[int]) -> float:
        logprobs = await self.sampling_client.compute_logprobs_async(tinker.ModelInput.from_ints(prompt + answer))
        return sum(lp for lp in logprobs[-len(answer):] if lp is not None)

    async def _one_prefill(self, prompt: list[int]) -> tuple[float, float] | None:
        """Both log-probabilities from one call, or None where the no token is outside the top k."""
        response = await self.sampling_client.sample_async(
            tinker.ModelInput.from_ints(prompt + self.yes_tokens), 1, tinker.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True, topk_prompt_logprobs=self.topk)
        lp_yes = (response.prompt_logprobs or [None])[-1]
        top = dict((response.topk_prompt_logprobs or [None])[-1] or [])
        if lp_yes is None or self.no_tokens[0] not in top:
            return None
        return lp_yes, top[self.no_tokens[0]]

    async def __call__(self, convo: Conversation, rubric: Rubric) -> Grade:
        prompt = self.renderer.build_generation_prompt(rubric.get_yes_no_prompt(convo)).to_ints()
        pair = None
        if len(self.yes_tokens) == 1 and len(self.no_tokens) == 1:
            pair = await self._one_prefill(prompt)
        if pair is None:
            pair = (await self._logprob(prompt, self.yes_tokens), await self._logprob(prompt, self.no_tokens))
        lp_yes, lp_no = pair
        score = yes_probability(lp_yes, lp_no)
        return Grade(score, None, f"P({self.yes})={math.exp(lp_yes):.4f} P({self.no})={math.exp(lp_no):.4f} "
                                  f"-> {score:.3f}")


def as_criterion_grader(grader: CriterionGrader | MessageCompleter) -> CriterionGrader:
    """A ``MessageCompleter`` (the official env's ``grader_llm``) grades as a ``TextGrader``."""
    return grader if isinstance(grader, CriterionGrader) else TextGrader(grader)


async def grade_criterion(grader: CriterionGrader, convo: Conversation, rubric: Rubric) -> Grade:
    """A checked criterion by its rules (the grader is not asked), any other by ``grader``."""
    if rubric.check is not None:
        score, detail = run_check(rubric.check, message_text(convo[-1]))
        return Grade(score, None, detail)
    return await grader(convo, rubric)


# -- the env ----------------------------------------------------------------------------------------------------


class RubricGradedEnv(Env):
    """One reply to ``datapoint.convo``, each criterion graded by ``grader``."""

    def __init__(self, renderer: Renderer, datapoint: RubricBasedDatapoint,
                 grader: CriterionGrader | MessageCompleter, format_coef: float = 0.1) -> None:
        self.renderer, self.datapoint, self.format_coef = renderer, datapoint, format_coef
        self.grader = as_criterion_grader(grader)

    @property
    def stop_condition(self) -> StopCondition:
        return self.renderer.get_stop_sequences()

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        return self.renderer.build_generation_prompt(self.datapoint.convo), self.stop_condition

    async def step(self, action: Action) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        well_formed = is_stop_sequence_termination(termination)
        items = self.datapoint.rubric_items
        convo = [*self.datapoint.convo, message]
        grades = await asyncio.gather(*(grade_criterion(self.grader, convo, r) for r in items))
        score = weighted_mean(items, [g.score for g in grades])
        errors = [f"criterion {i}: {g.error}" for i, g in enumerate(grades, start=1) if g.error is not None]
        reward = score + self.format_coef * (float(well_formed) - 1.0)
        with logtree.scope_header("Prompt"):
            logtree.log_formatter(ConversationFormatter(messages=self.datapoint.convo))
        with logtree.scope_header("Policy Response"):
            logtree.log_formatter(ConversationFormatter(messages=[message]))
        with logtree.scope_header("Rubric Grades"):
            logtree.table([{"#": i, "weight": r.weight, "score": f"{g.score:.3f}", "criterion": r.rubric_str,
                            "grader": g.detail[:200]} for i, (r, g) in enumerate(zip(items, grades, strict=True), start=1)])
            for error in errors:
                logtree.log_text(f"malformed grade, scored 0: {error}")
        logs: dict[str, str | int | float] = {"grades": "; ".join(g.detail[:200] for g in grades)[:500]}
        if errors:
            logs["grade_error"] = "; ".join(errors)
        return StepResult(reward, True, tinker.ModelInput.empty(), self.stop_condition,
                          metrics={"rubric_score": score, "format": float(well_formed),
                                   "grade_malformed": len(errors) / len(items)},
                          logs=logs)


class RubricGradedEnvGroupBuilder(EnvGroupBuilder):
    """``group_size`` replies to one datapoint."""

    def __init__(self, renderer: Renderer, datapoint: RubricBasedDatapoint,
                 grader: CriterionGrader | MessageCompleter, group_size: int, format_coef: float = 0.1) -> None:
        self.renderer, self.datapoint, self.grader = renderer, datapoint, as_criterion_grader(grader)
        self.group_size, self.format_coef = group_size, format_coef

    async def make_envs(self) -> Sequence[Env]:
        return [RubricGradedEnv(self.renderer, self.datapoint, self.grader, self.format_coef)
                for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return ["rubric"]


class RubricGradedDataset(RLDataset):
    """Batches of ``batch_size`` datapoints (the last may be shorter), each a group of ``group_size`` replies."""

    def __init__(self, datapoints: Sequence[RubricBasedDatapoint], batch_size: int, group_size: int,
                 renderer: Renderer, grader: CriterionGrader | MessageCompleter, format_coef: float = 0.1) -> None:
        if batch_size < 1 or group_size < 1:
            raise ValueError(f"batch_size={batch_size} and group_size={group_size} must be at least 1")
        self.datapoints, self.batch_size, self.group_size = list(datapoints), batch_size, group_size
        self.renderer, self.grader, self.format_coef = renderer, as_criterion_grader(grader), format_coef

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} is outside [0, {len(self)})")
        chunk = self.datapoints[index * self.batch_size : (index + 1) * self.batch_size]
        return [RubricGradedEnvGroupBuilder(self.renderer, d, self.grader, self.group_size, self.format_coef)
                for d in chunk]

    def __len__(self) -> int:
        return -(-len(self.datapoints) // self.batch_size)


def _probability_grader(builder: RubricGradedDatasetBuilder, client: tinker.SamplingClient,
                        renderer: Renderer) -> CriterionGrader:
    return ProbabilityGrader(client, renderer)


def _text_grader(builder: RubricGradedDatasetBuilder, client: tinker.SamplingClient,
                 renderer: Renderer) -> CriterionGrader:
    from tinker_cookbook.completers import TinkerMessageCompleter

    return TextGrader(TinkerMessageCompleter(client, renderer, builder.grader_max_tokens,
                                             temperature=builder.grader_temperature))


GRADERS: dict[str, Callable[[RubricGradedDatasetBuilder, tinker.SamplingClient, Renderer], CriterionGrader]] = {
    "probability": _probability_grader,
    "text": _text_grader,
}
"""The graders ``RubricGradedDatasetBuilder.grader`` can name."""


@chz.chz
class RubricGradedDatasetBuilder(RLDatasetBuilder):
    """Train on ``train_file`` (repeated ``num_epochs`` times, reshuffled), test on ``test_file``."""

    model_name_for_tokenizer: str
    renderer_name: str | None = None
    """None: the model's recommended renderer."""
    train_file: str = str(EXAMPLE_DATA / "train.jsonl")
    test_file: str | None = str(EXAMPLE_DATA / "test.jsonl")
    """None: no test set."""
    batch_size: int = 4
    group_size: int = 4
    num_epochs: int = 4
    seed: int = 0
    format_coef: float = 0.1
    grader: str = "probability"
    """"probability": P(Yes)/(P(Yes)+P(No)) after a yes/no question; "text": a written score read by the
    criterion's extraction_regex."""
    grader_model: str | None = None
    """None: the policy's base model (the local engine serves it from the weights already loaded)."""
    grader_renderer_name: str | None = None
    grader_max_tokens: int = 24
    """The text grader's answer budget."""
    grader_temperature: float = 0.0
    """The text grader's temperature; 0: greedy, so a reply always gets the same grade."""

    def make_grader(self) -> CriterionGrader:
        if self.grader not in GRADERS:
            raise ConfigurationError(f"dataset_builder.grader={self.grader!r} is not a grader; "
                                     f"choose one of {sorted(GRADERS)}")
        model = self.grader_model or self.model_name_for_tokenizer
        client = tinker.ServiceClient().create_sampling_client(base_model=model)
        return GRADERS[self.grader](self, client, renderer_for(model, self.grader_renderer_name))

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = renderer_for(self.model_name_for_tokenizer, self.renderer_name)
        grader = self.make_grader()
        train_points = load_datapoints(self.train_file)
        epochs: list[RubricBasedDatapoint] = []
        for epoch in range(self.num_epochs):
            order = list(train_points)
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
            epochs += order
        train = RubricGradedDataset(epochs, self.batch_size, self.group_size, renderer, grader, self.format_coef)
        if self.test_file is None:
            return train, None
        test_points = load_datapoints(self.test_file)
        return train, RubricGradedDataset(test_points, len(test_points), 1, renderer, grader, self.format_coef)
