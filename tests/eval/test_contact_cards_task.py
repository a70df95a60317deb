"""The shipped contact-card task: its samples are sl_basic's held-out set, and its scorers grade the card."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
from inspect_ai.model import ChatMessageUser, ModelOutput
from inspect_ai.scorer import CORRECT, INCORRECT, Target
from inspect_ai.solver import TaskState

from tinker_cookbook.supervised.chat_datasets import EXAMPLE_DATA_NAME, get_chat_dataset_builder
from tinker_cookbook.supervised.data import conversation_to_datum
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

REPO = Path(__file__).resolve().parents[2]
CARD = "Name: Maria Lopez\nAge: 34\nCity: Lisbon\nJob: nurse"


@pytest.fixture(scope="module")
def task_module():
    spec = importlib.util.spec_from_file_location("contact_cards", REPO / "example-data" / "evals" / "contact_cards.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_samples_are_the_sl_basic_test_split(task_module):
    # the recipe's builder for its default data (example-data/conversations.jsonl, 48 held out)
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer="tinker-cookbook/tiny-smollm2",
                                            renderer_name="chatml", max_length=256, batch_size=16)
    builder = get_chat_dataset_builder(EXAMPLE_DATA_NAME, common)
    _train, test = builder()
    held_out = task_module.held_out_conversations()
    assert len(held_out) == len(test.rows) == 48
    rendered = [conversation_to_datum(messages, builder.renderer, 256).model_input.to_ints()
                for _number, messages in held_out]
    assert rendered == [datum.model_input.to_ints() for datum in test.rows]


def test_task_samples_end_before_the_last_assistant_turn(task_module):
    task = task_module.contact_cards()
    assert len(task.dataset) == 48
    sample = task.dataset[0]
    assert sample.input[-1].role == "user" and task_module.is_well_formed(sample.target)


def _score(scorer, answer: str, target: str = CARD):
    state = TaskState(model="m", sample_id=1, epoch=1, input=[ChatMessageUser(content="x")], messages=[],
                      output=ModelOutput.from_content("m", answer))
    return asyncio.run(scorer(state, Target(target)))


@pytest.mark.parametrize("answer, well_formed, fields", [
    (CARD, True, 1.0),
    ("Name: maria lopez\nAge: 34\nCity: Lisbon\nJob: Nurse", True, 1.0),   # values compare case-insensitively
    ("Name: Maria Lopez\nAge: 35\nCity: unknown\nJob: nurse", True, 0.5),
    ("Sure! Here is the card:\n" + CARD, False, 1.0),                      # right fields, extra text
    ("Name: Maria Lopez\nCity: Lisbon\nAge: 34\nJob: nurse", False, 1.0),  # wrong order
    ("Maria Lopez, 34, nurse in Lisbon.", False, 0.0),
    ("", False, 0.0),
])
def test_scorers(task_module, answer, well_formed, fields):
    assert _score(task_module.card_format(), answer).value == (CORRECT if well_formed else INCORRECT)
    assert _score(task_module.card_fields(), answer).value == fields
