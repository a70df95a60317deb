"""Contact cards: the held-out conversations of the sl_basic data, scored on the card's format and fields.

    inspect eval example-data/evals/contact_cards.py --model tinker-cookbook/HuggingFaceTB/SmolLM2-135M-Instruct
    python -m tinker_cookbook.eval.run_inspect_evals model_path=tinker://RUN/sampler_weights/final \\
        tasks=example-data/evals/contact_cards.py

The samples are the 48 conversations that ``python -m recipes.sl_basic`` holds out as its test set (the same
shuffle of ``example-data/conversations.jsonl``), so a model fine-tuned by that recipe has never seen them. Each
sample is a conversation up to its last assistant turn; the target is that turn, a four-line card::

    Name: Maria Lopez
    Age: 34
    City: Lisbon
    Job: nurse

Scorers: ``card_format`` (accuracy: the answer is exactly the four ``Field: value`` lines in this order) and
``card_fields`` (mean: the fraction of the four values equal to the target's, wherever the lines are).
Generation is greedy with at most 64 new tokens, so scores are reproducible.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageUser,
    GenerateConfig,
)
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Scorer, Target, accuracy, mean, scorer, stderr
from inspect_ai.solver import TaskState, generate

CONVERSATIONS = Path(__file__).resolve().parent.parent / "conversations.jsonl"
FIELDS = ("Name", "Age", "City", "Job")

# The recipe's split (FromConversationFileBuilder): a numpy permutation with shuffle seed 0 of every line of the
# file, the first 48 of which are the test set. tests/eval checks that both pick the same conversations.
SL_BASIC_TEST_SIZE = 48
SL_BASIC_SHUFFLE_SEED = 0

_MESSAGE_TYPES: dict[str, type[ChatMessage]] = {
    "system": ChatMessageSystem, "user": ChatMessageUser, "assistant": ChatMessageAssistant,  # type: ignore[dict-item]
}


def held_out_conversations(path: Path = CONVERSATIONS, test_size: int = SL_BASIC_TEST_SIZE,
                           shuffle_seed: int = SL_BASIC_SHUFFLE_SEED) -> list[tuple[int, list[dict]]]:
    """``(line number, messages)`` of the conversations the sl_basic recipe holds out, in its order."""
    rows = [(number, json.loads(line)["messages"])
            for number, line in enumerate(path.read_text().splitlines(), start=1) if line.strip()]
    order = np.random.default_rng(shuffle_seed).permutation(len(rows))
    return [rows[i] for i in order[:test_size]]


def _sample(number: int, messages: list[dict]) -> Sample:
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    history = [_MESSAGE_TYPES[m["role"]](content=m["content"]) for m in messages[:last]]
    return Sample(input=history, target=messages[last]["content"], id=number)


def parse_card(text: str) -> dict[str, str]:
    """The first value of each card field found on a ``Field: value`` line (case-insensitive field names)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"\s*(\w+)\s*:\s*(.*?)\s*$", line)
        if match:
            field = match[1].capitalize()
            if field in FIELDS and field not in values:
                values[field] = match[2]
    return values


def is_well_formed(text: str) -> bool:
    """Exactly four non-empty ``Field: value`` lines in the order Name, Age, City, Job, and nothing else."""
    lines = text.strip().splitlines()
    return len(lines) == len(FIELDS) and all(
        re.fullmatch(rf"{field}: \S.*", line.strip()) is not None for field, line in zip(FIELDS, lines, strict=True)
    )


@scorer(metrics=[accuracy(), stderr()])
def card_format() -> Scorer:
    async def score(state: TaskState, target: Target) -> Score:
        answer = state.output.completion
        return Score(value=CORRECT if is_well_formed(answer) else INCORRECT, answer=answer)

    return score


@scorer(metrics=[mean(), stderr()])
def card_fields() -> Scorer:
    async def score(state: TaskState, target: Target) -> Score:
        answer = state.output.completion
        got, want = parse_card(answer), parse_card(target.text)
        wrong = [f for f in FIELDS if got.get(f, "").strip().lower() != want[f].strip().lower()]
        explanation = "all fields match" if not wrong else "wrong or missing: " + ", ".join(wrong)
        return Score(value=1.0 - len(wrong) / len(FIELDS), answer=answer, explanation=explanation)

    return score


@task
def contact_cards(test_size: int = SL_BASIC_TEST_SIZE) -> Task:
    samples = [_sample(number, messages) for number, messages in held_out_conversations(test_size=test_size)]
    return Task(
        dataset=MemoryDataset(samples, name="contact_cards"),
        solver=generate(),
        scorer=[card_format(), card_fields()],
        config=GenerateConfig(temperature=0.0, max_tokens=64),
    )
