"""The custom SamplingClientEvaluators: a grader function, and an LLM judge (here with a scripted grader)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tinker_cookbook import renderers, tinker
from tinker_cookbook.completers import MessageCompleter
from tinker_cookbook.eval.custom_evaluators import (
    CustomEvaluator,
    LLMJudgeEvaluator,
    LLMJudgeEvaluatorBuilder,
    parse_grade,
)
from tinker_cookbook.exceptions import DataFormatError

TINY = "tinker-cookbook/tiny-smollm2"
QA = [
    {"input": "What is the capital of France?", "output": "Paris"},
    {"input": "What is the capital of Italy?", "output": "Rome"},
    {"input": "What is the capital of Japan?", "output": "Tokyo"},
]


@pytest.fixture(scope="module")
def sampling_client() -> tinker.SamplingClient:
    return tinker.ServiceClient().create_sampling_client(base_model=TINY)


class ScriptedGrader(MessageCompleter):
    """Replies with a fixed verdict per question, and records what it was shown."""

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies
        self.seen: list[list[renderers.Message]] = []

    async def __call__(self, messages: list[renderers.Message]) -> renderers.Message:
        self.seen.append(messages)
        case = renderers.get_text_content(messages[-1])
        question = next(q for q in self.replies if q in case)
        return {"role": "assistant", "content": self.replies[question]}


def test_llm_judge_scores_by_the_graders_verdicts(sampling_client):
    grader = ScriptedGrader({
        QA[0]["input"]: "It names Paris.\nGRADE: C",
        QA[1]["input"]: "GRADE: C ... on reflection it is wrong.\nGRADE: I",  # the last grade counts
        QA[2]["input"]: "I cannot tell.",                                       # no grade: incorrect, ungraded
    })
    evaluator = LLMJudgeEvaluator(QA, grader, model_name=TINY, renderer_name="chatml", max_tokens=5, name="capitals")
    metrics = asyncio.run(evaluator(sampling_client))
    assert metrics == {"capitals/accuracy": pytest.approx(1 / 3), "capitals/ungraded": pytest.approx(1 / 3)}
    # the grader saw the rubric, the question, the reference and the policy's sampled answer
    assert len(grader.seen) == 3
    for transcript in evaluator.last_transcripts:
        [case] = [m for m in grader.seen if transcript["input"] in renderers.get_text_content(m[-1])]
        assert case[0]["role"] == "system" and "grade" in renderers.get_text_content(case[0]).lower()
        text = renderers.get_text_content(case[-1])
        reference = next(d["output"] for d in QA if d["input"] == transcript["input"])
        assert f"Reference answer:\n{reference}" in text and f"Answer to grade:\n{transcript['answer']}" in text


@pytest.mark.parametrize("reply, grade", [
    ("GRADE: C", True), ("blah\nGRADE: I", False), ("GRADE:C", True), ("GRADE: I then GRADE: C", True),
    ("grade: c", None), ("", None),
])
def test_parse_grade(reply, grade):
    assert parse_grade(reply) is grade


def test_custom_evaluator_grades_sampled_answers(sampling_client):
    answers: list[str] = []

    def grader_fn(response: str, target: str) -> bool:
        answers.append(response)
        return target in QA[0]["output"]   # "Paris" only: one of three

    evaluator = CustomEvaluator(QA, grader_fn, model_name=TINY, renderer_name="chatml", max_tokens=4)
    assert asyncio.run(evaluator(sampling_client)) == {"custom/accuracy": pytest.approx(1 / 3)}
    assert len(answers) == 3 and all(isinstance(a, str) for a in answers)


def test_datasets_without_input_and_output_are_rejected():
    with pytest.raises(DataFormatError, match=r"dataset\[1\] has no string field\(s\) \['output'\]"):
        CustomEvaluator([QA[0], {"input": "q"}], lambda r, t: True, model_name=TINY, renderer_name="chatml")
    with pytest.raises(DataFormatError, match="empty"):
        LLMJudgeEvaluator([], ScriptedGrader({}), model_name=TINY, renderer_name="chatml")


def test_judge_builder_samples_the_grader_from_a_tinker_model(tmp_path, sampling_client):
    examples = tmp_path / "qa.jsonl"
    examples.write_text("".join(json.dumps(d) + "\n" for d in QA))
    builder = LLMJudgeEvaluatorBuilder(examples_path=str(examples), model_name=TINY, renderer_name="chatml",
                                       grader_model=TINY, grader_max_tokens=4, max_tokens=4)
    evaluator = builder()
    metrics = asyncio.run(evaluator(sampling_client))
    # a random tiny grader writes no grade: every answer is ungraded, none correct
    assert metrics == {"judge/accuracy": 0.0, "judge/ungraded": 1.0}
    assert all(t["grader"] is not None for t in evaluator.last_transcripts)
