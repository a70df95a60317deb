"""Rubric grading with scripted graders (no model): parsing, weighted rewards, malformed grades, data files."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from recipes.rubric import generate_data
from tinker_cookbook.completers import MessageCompleter
from tinker_cookbook.exceptions import DataError
from tinker_cookbook.rl.rubric import (
    EXAMPLE_DATA,
    Rubric,
    RubricBasedDatapoint,
    RubricGradedEnv,
    grader_prompt,
    load_datapoints,
    parse_grade,
    weighted_sum,
)

POINT = RubricBasedDatapoint(
    convo=[{"role": "user", "content": "List three facts about tea."}],
    rubric_items=[Rubric("Gives exactly three items.", 0.5), Rubric("Every item is about tea.", 0.3),
                  Rubric("Items are on separate lines.", 0.2)],
)


def run(coro):
    return asyncio.run(coro)


class ScriptedGrader(MessageCompleter):
    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.seen: list[str] = []

    async def __call__(self, messages):
        self.seen.append(messages[-1]["content"])
        return {"role": "assistant", "content": self.answer}


# -- parsing ----------------------------------------------------------------------------------------------


def test_a_well_formed_grade_is_read_in_rubric_order():
    assert parse_grade("2: 0.5\n1: 1\n3: 0", 3).scores == [1.0, 0.5, 0.0]
    # Prose around the lines, "Criterion k" labels and "=" or ")" separators are tolerated.
    assert parse_grade("Here are my scores.\nCriterion 1: 1\n2) 0.25\n3 = 1.0\nThanks!", 3).scores == [1.0, 0.25, 1.0]


@pytest.mark.parametrize(("text", "reason"), [
    ("1: 1\n2: 0", "no score for criterion 3"),
    ("", "no score for criterion 1, 2, 3"),
    ("1: 1\n1: 0\n2: 1\n3: 1", "criterion 1 is scored twice"),
    ("1: 1\n2: high\n3: 0", "criterion 2's score 'high' is not a number"),
    ("1: 1\n2: 1.5\n3: 0", "criterion 2's score 1.5 is outside [0, 1]"),
    ("1: 1\n2: -0.1\n3: 0", "outside [0, 1]"),
    ("1: 1\n2: nan\n3: 0", "outside [0, 1]"),
    ("1: 1\n2: 1\n3: 1\n4: 1", "criterion 4 does not exist (the rubric has 3)"),
])
def test_a_malformed_grade_has_no_scores_and_says_why(text, reason):
    grade = parse_grade(text, 3)
    assert grade.scores is None and reason in grade.error


def test_the_reward_is_the_weighted_sum():
    # 0.5·1 + 0.3·0.5 + 0.2·0 = 0.65
    assert weighted_sum(POINT.rubric_items, [1.0, 0.5, 0.0]) == pytest.approx(0.65)


def test_the_grader_sees_conversation_reply_and_numbered_criteria():
    text = grader_prompt(POINT.convo, "1. Green\n2. Black", POINT.rubric_items)[0]["content"]
    assert "user: List three facts about tea." in text and "<reply>\n1. Green\n2. Black\n</reply>" in text
    assert "1. Gives exactly three items.\n2. Every item is about tea.\n3. Items are on separate lines." in text
    assert "<number>: <score>" in text


# -- the env ------------------------------------------------------------------------------------------------



def _reply(chatml, text: str) -> list[int]:
    return chatml.tokenizer.encode(text, add_special_tokens=False) + [chatml.get_stop_sequences()[0]]


def test_env_rewards_the_weighted_sum_of_the_grade(chatml):
    grader = ScriptedGrader("1: 1\n2: 0.5\n3: 0")
    env = RubricGradedEnv(chatml, POINT, grader, format_coef=0.1)
    run(env.initial_observation())
    result = run(env.step(_reply(chatml, "Green tea. Black tea. Tea has caffeine.")))
    assert result.episode_done and result.reward == pytest.approx(0.65)
    assert result.metrics["rubric_score"] == pytest.approx(0.65) and result.metrics["grade_malformed"] == 0.0
    assert "Green tea. Black tea." in grader.seen[0]


def test_rubric_score_is_normalised_by_the_total_weight(chatml):
    point = RubricBasedDatapoint(POINT.convo, [Rubric("a", 2.0), Rubric("b", 2.0)])
    result = run(RubricGradedEnv(chatml, point, ScriptedGrader("1: 1\n2: 0.5")).step(_reply(chatml, "x")))
    assert result.reward == pytest.approx(3.0) and result.metrics["rubric_score"] == pytest.approx(0.75)


def test_a_malformed_grade_scores_zero_and_logs_the_reason(chatml, caplog):
    env = RubricGradedEnv(chatml, POINT, ScriptedGrader("All good, 10/10!"), format_coef=0.1)
    with caplog.at_level(logging.WARNING):
        result = run(env.step(_reply(chatml, "Tea.")))
    assert result.reward == 0.0 and result.metrics["grade_malformed"] == 1.0
    assert result.logs["grade_error"] == "no score for criterion 1, 2, 3"
    assert "malformed grade, scored 0: no score for criterion 1, 2, 3" in caplog.text


def test_a_cut_off_reply_loses_the_format_coefficient(chatml):
    env = RubricGradedEnv(chatml, POINT, ScriptedGrader("1: 1\n2: 1\n3: 1"), format_coef=0.1)
    tokens = chatml.tokenizer.encode("Tea", add_special_tokens=False)  # no stop token: ran out of tokens
    result = run(env.step(tokens))
    assert result.reward == pytest.approx(0.9) and result.metrics["format"] == 0.0


# -- data ---------------------------------------------------------------------------------------------------


def test_data_round_trips_and_bad_lines_name_file_and_line(tmp_path):
    assert RubricBasedDatapoint.from_json(POINT.to_json()) == POINT
    # The official cookbook's files (no weights, extra grader-format keys) load with weight 1.
    official = {"convo": POINT.convo, "rubric_items": [{"rubric_str": "Is correct?", "extraction_regex": "x",
                                                        "grader_output_format_instruction": "y"}]}
    assert RubricBasedDatapoint.from_json(json.dumps(official)).rubric_items == [Rubric("Is correct?", 1.0)]
    path = tmp_path / "bad.jsonl"
    path.write_text(POINT.to_json() + "\n" + json.dumps({"convo": POINT.convo, "rubric_items": []}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: .*no rubric items"):
        load_datapoints(path)
    with pytest.raises(DataError, match="weight=0"):
        Rubric("x", 0.0)
    with pytest.raises(DataError, match="must end with a user message"):
        RubricBasedDatapoint([{"role": "assistant", "content": "hi"}], [Rubric("x")])


def test_the_shipped_set_is_what_the_generator_writes():
    train, test = generate_data.generate(seed=0, num_test_topics=3)
    assert load_datapoints(EXAMPLE_DATA / "train.jsonl") == train
    assert load_datapoints(EXAMPLE_DATA / "test.jsonl") == test
    train_topics = {p.convo[0]["content"] for p in train}
    assert not train_topics & {p.convo[0]["content"] for p in test}  # test instructions are never trained on
    assert all(abs(p.total_weight - 1.0) < 1e-9 for p in train + test)
