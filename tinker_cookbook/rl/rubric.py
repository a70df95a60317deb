"""Rubric-graded RL: a grader model scores each reply against the prompt's own criteria.

A datapoint (``RubricBasedDatapoint``) is a conversation prefix the policy replies to and its rubric: a list of
criteria (``Rubric``: the criterion's text and its weight). After the policy's reply, one grader call (a
``MessageCompleter``, by default the policy's base model answering greedily) sees the conversation, the reply and
the numbered criteria, and answers one line per criterion, ``<number>: <score>``, each score from 0 to 1.

``parse_grade`` reads that answer strictly: every criterion exactly once, each score a number in [0, 1]. The reward
is the weighted sum ``Σ weight_i · score_i``; the metric ``rubric_score`` is the same sum divided by the total
weight (so it is in [0, 1] whatever the weights). A malformed grade (a criterion missing or repeated, a score that
is not a number or out of range) scores 0; the reason is logged (the transition's ``grade_error`` log, the
``logtree`` transcript and a warning) and counted in the ``grade_malformed`` metric.

Data files are JSON lines ``{"convo": [messages], "rubric_items": [{"rubric_str": ..., "weight": ...}]}`` (the
official cookbook's keys; ``weight`` defaults to 1). ``example-data/rubric/`` holds an offline set written for this
project: short instructions with two to four checkable criteria each.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chz

from tinker_cookbook import tinker
from tinker_cookbook.completers import MessageCompleter, StopCondition
from tinker_cookbook.exceptions import DataError
from tinker_cookbook.renderers import Message, Renderer
from tinker_cookbook.rl.multiturn.message_env import renderer_for
from tinker_cookbook.rl.problem_env import is_stop_sequence_termination, message_text
from tinker_cookbook.rl.types import Action, Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.utils import logtree
from tinker_cookbook.utils.logtree_formatters import ConversationFormatter

logger = logging.getLogger(__name__)

EXAMPLE_DATA = Path(__file__).resolve().parents[2] / "example-data" / "rubric"
Conversation = list[Message]

GRADER_INSTRUCTIONS = (
    "You grade a chatbot's reply against a rubric. Read the conversation, the reply and the numbered criteria. "
    "For each criterion give a score from 0 (not met) to 1 (fully met).\n"
    "Answer with exactly one line per criterion, in order, in the form <number>: <score>, and nothing else. "
    "For example, for three criteria:\n1: 1\n2: 0\n3: 0.5"
)
_SCORE_LINE = re.compile(r"^\s*(?:criterion\s*)?(\d+)\s*[:=)]\s*(\S+?)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Rubric:
    """One criterion of a rubric: what a good reply does (``rubric_str``), and how much it counts (``weight``)."""

    rubric_str: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.rubric_str.strip():
            raise DataError("a rubric criterion's rubric_str is empty; write what a good reply does")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise DataError(f"criterion {self.rubric_str!r} has weight={self.weight}; weights must be positive")

    def to_dict(self) -> dict[str, Any]:
        return {"rubric_str": self.rubric_str, "weight": self.weight}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Rubric:
        if "rubric_str" not in d:
            raise DataError(f"a rubric item needs 'rubric_str'; got keys {sorted(d)}")
        return Rubric(str(d["rubric_str"]), float(d.get("weight", 1.0)))


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


def grader_prompt(convo: Conversation, reply: str, rubric_items: Sequence[Rubric]) -> Conversation:
    """The grader's one user message: the conversation, the reply to grade and the numbered criteria."""
    context = "\n\n".join(f"{m['role']}: {message_text(m)}" for m in convo)
    criteria = "\n".join(f"{i}. {r.rubric_str}" for i, r in enumerate(rubric_items, start=1))
    return [{"role": "user", "content": (
        f"{GRADER_INSTRUCTIONS}\n\n<conversation>\n{context}\n</conversation>\n\n<reply>\n{reply}\n</reply>\n\n"
        f"<criteria>\n{criteria}\n</criteria>")}]


@dataclass(frozen=True)
class Grade:
    """Per-criterion scores (in the rubric's order), or why the grader's answer could not be read."""

    scores: list[float] | None
    error: str | None = None


def parse_grade(text: str, num_criteria: int) -> Grade:
    """Read ``<number>: <score>`` lines for criteria 1..num_criteria (other lines are ignored)."""
    found: dict[int, str] = {}
    for number_text, value in _SCORE_LINE.findall(text):
        number = int(number_text)
        if not 1 <= number <= num_criteria:
            return Grade(None, f"criterion {number} does not exist (the rubric has {num_criteria})")
        if number in found:
            return Grade(None, f"criterion {number} is scored twice")
        found[number] = value
    missing = [n for n in range(1, num_criteria + 1) if n not in found]
    if missing:
        return Grade(None, f"no score for criterion {', '.join(map(str, missing))}")
    scores = []
    for number in range(1, num_criteria + 1):
        try:
            score = float(found[number])
        except ValueError:
            return Grade(None, f"criterion {number}'s score {found[number]!r} is not a number")
        if not 0.0 <= score <= 1.0:  # also rejects NaN
            return Grade(None, f"criterion {number}'s score {score} is outside [0, 1]")
        scores.append(score)
    return Grade(scores)


def weighted_sum(rubric_items: Sequence[Rubric], scores: Sequence[float]) -> float:
    return sum(r.weight * s for r, s in zip(rubric_items, scores, strict=True))


class RubricGradedEnv(Env):
    """One reply to ``datapoint.convo``, graded by ``grader`` on the datapoint's criteria."""

    def __init__(self, renderer: Renderer, datapoint: RubricBasedDatapoint, grader: MessageCompleter,
                 format_coef: float = 0.1) -> None:
        self.renderer, self.datapoint, self.grader, self.format_coef = renderer, datapoint, grader, format_coef

    @property
    def stop_condition(self) -> StopCondition:
        return self.renderer.get_stop_sequences()

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        return self.renderer.build_generation_prompt(self.datapoint.convo), self.stop_condition

    async def step(self, action: Action) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        reply = message_text(message)
        well_formed = is_stop_sequence_termination(termination)
        items = self.datapoint.rubric_items
        answer = message_text(await self.grader(grader_prompt(self.datapoint.convo, reply, items)))
        grade = parse_grade(answer, len(items))
        score = weighted_sum(items, grade.scores) if grade.scores is not None else 0.0
        if grade.error is not None:
            logger.warning("malformed grade, scored 0: %s; grader answered %r", grade.error, answer[:200])
        reward = score + self.format_coef * (float(well_formed) - 1.0)
        with logtree.scope_header("Prompt"):
            logtree.log_formatter(ConversationFormatter(messages=self.datapoint.convo))
        with logtree.scope_header("Policy Response"):
            logtree.log_formatter(ConversationFormatter(messages=[message]))
        with logtree.scope_header("Rubric Grades"):
            logtree.table([{"#": i, "weight": r.weight, "score": "-" if grade.scores is None else grade.scores[i - 1],
                            "criterion": r.rubric_str} for i, r in enumerate(items, start=1)])
            logtree.details(answer, summary="grader's answer")
            if grade.error is not None:
                logtree.log_text(f"malformed grade, scored 0: {grade.error}")
        logs: dict[str, str | int | float] = {"grader_answer": answer[:500]}
        if grade.error is not None:
            logs["grade_error"] = grade.error
        return StepResult(reward, True, tinker.ModelInput.empty(), self.stop_condition,
                          metrics={"rubric_score": score / self.datapoint.total_weight, "format": float(well_formed),
                                   "grade_malformed": float(grade.error is not None)},
                          logs=logs)


class RubricGradedEnvGroupBuilder(EnvGroupBuilder):
    """``group_size`` replies to one datapoint."""

    def __init__(self, renderer: Renderer, datapoint: RubricBasedDatapoint, grader: MessageCompleter,
                 group_size: int, format_coef: float = 0.1) -> None:
        self.renderer, self.datapoint, self.grader = renderer, datapoint, grader
        self.group_size, self.format_coef = group_size, format_coef

    async def make_envs(self) -> Sequence[Env]:
        return [RubricGradedEnv(self.renderer, self.datapoint, self.grader, self.format_coef)
                for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return ["rubric"]


class RubricGradedDataset(RLDataset):
    """Batches of ``batch_size`` datapoints (the last may be shorter), each a group of ``group_size`` replies."""

    def __init__(self, datapoints: Sequence[RubricBasedDatapoint], batch_size: int, group_size: int,
                 renderer: Renderer, grader: MessageCompleter, format_coef: float = 0.1) -> None:
        if batch_size < 1 or group_size < 1:
            raise ValueError(f"batch_size={batch_size} and group_size={group_size} must be at least 1")
        self.datapoints, self.batch_size, self.group_size = list(datapoints), batch_size, group_size
        self.renderer, self.grader, self.format_coef = renderer, grader, format_coef

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} is outside [0, {len(self)})")
        chunk = self.datapoints[index * self.batch_size : (index + 1) * self.batch_size]
        return [RubricGradedEnvGroupBuilder(self.renderer, d, self.grader, self.group_size, self.format_coef)
                for d in chunk]

    def __len__(self) -> int:
        return -(-len(self.datapoints) // self.batch_size)


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
    grader_model: str | None = None
    """None: the policy's base model (the local engine serves it from the weights already loaded)."""
    grader_renderer_name: str | None = None
    grader_max_tokens: int = 24
    grader_temperature: float = 0.0
    """0: greedy, so a reply always gets the same grade."""

    def make_grader(self) -> MessageCompleter:
        from tinker_cookbook.completers import TinkerMessageCompleter

        model = self.grader_model or self.model_name_for_tokenizer
        client = tinker.ServiceClient().create_sampling_client(base_model=model)
        return TinkerMessageCompleter(client, renderer_for(model, self.grader_renderer_name), self.grader_max_tokens,
                                      temperature=self.grader_temperature)

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
