"""Rubric grading with scripted graders (no model): score extraction, yes/no probabilities, weighted rewards,
malformed grades, data files."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from types import SimpleNamespace

import pytest

from recipes.rubric import generate_data
from tinker_cookbook.completers import MessageCompleter
from tinker_cookbook.exceptions import ConfigurationError, DataError
from tinker_cookbook.rl.rubric import (
    EXAMPLE_DATA,
    CriterionGrader,
    Grade,
    ProbabilityGrader,
    Rubric,
    RubricBasedDatapoint,
    RubricGradedDatasetBuilder,
    RubricGradedEnv,
    load_datapoints,
    weighted_mean,
    yes_probability,
)
from tinker_cookbook.rl.rubric_checks import run_check, validate_check

POINT = RubricBasedDatapoint(
    convo=[{"role": "user", "content": "List three facts about tea."}],
    rubric_items=[Rubric("Gives exactly three items.", weight=0.5), Rubric("Every item is about tea.", weight=0.3),
                  Rubric("Items are on separate lines.", weight=0.2)],
)
CONVO = [*POINT.convo, {"role": "assistant", "content": "Green tea.\nBlack tea.\nTea has caffeine."}]


def run(coro):
    return asyncio.run(coro)


class ScriptedCompleter(MessageCompleter):
    """A free-text grader that answers in turn from ``answers``."""

    def __init__(self, *answers: str) -> None:
        self.answers, self.seen = list(answers), list[str]()

    async def __call__(self, messages):
        self.seen.append(messages[-1]["content"])
        return {"role": "assistant", "content": self.answers[len(self.seen) - 1]}


class ScriptedScores(CriterionGrader):
    """Grades criterion ``rubric_str`` with ``scores[rubric_str]``."""

    def __init__(self, scores: dict[str, float]) -> None:
        self.scores = scores

    async def __call__(self, convo, rubric):
        return Grade(self.scores[rubric.rubric_str], None, "scripted")


# -- the free-text grader's score -------------------------------------------------------------------------------


def test_the_score_is_read_with_the_criterions_regex():
    assert Rubric("x").parse_score("Fine reply. <score>0.75</score>") == Grade(0.75, None, "Fine reply. <score>0.75</score>")
    custom = Rubric("x", extraction_regex=r"Score: (\S+)")
    assert custom.parse_score("Score: 1").score == 1.0


@pytest.mark.parametrize(("answer", "reason"), [
    ("All good, 10/10!", "no match for '<score>(.*?)</score>'"),
    ("<score>high</score>", "the score 'high' is not a number"),
    ("<score>1.5</score>", "the score 1.5 is outside [0, 1]"),
    ("<score>-0.1</score>", "outside [0, 1]"),
    ("<score>nan</score>", "outside [0, 1]"),
])
def test_a_malformed_written_grade_scores_zero_and_says_why(answer, reason, caplog):
    grade = Rubric("x").parse_score(answer)
    assert grade.score == 0.0 and reason in grade.error
    with caplog.at_level(logging.WARNING):
        assert Rubric("x").extract_score(answer) == 0.0  # the official reader: 0 and a warning
    assert "malformed grade, scored 0" in caplog.text


def test_the_grader_prompts_show_context_completion_and_criterion():
    text = Rubric("Gives exactly three items.").get_grader_prompt(CONVO)[0]["content"]
    assert "Human: List three facts about tea." in text
    assert "<completion_to_grade>\nChatbot: Green tea.\nBlack tea.\nTea has caffeine.\n</completion_to_grade>" in text
    assert "<rubric>\nGives exactly three items.\n</rubric>" in text and "<score> ... </score>" in text
    question = Rubric("Gives exactly three items.").get_yes_no_prompt(CONVO)[0]["content"]
    assert "<rubric>\nGives exactly three items.\n</rubric>" in question and question.endswith("Yes or No only.")


# -- the probability grader -------------------------------------------------------------------------------------


def test_yes_probability_is_the_normalised_yes_mass():
    # P(Yes)=0.3, P(No)=0.1: 0.3 / 0.4 = 0.75; equal masses give 0.5; far-apart logprobs do not overflow.
    assert yes_probability(math.log(0.3), math.log(0.1)) == pytest.approx(0.75)
    assert yes_probability(-2.0, -2.0) == pytest.approx(0.5)
    assert yes_probability(-1000.0, 0.0) == pytest.approx(0.0) and yes_probability(0.0, -1000.0) == pytest.approx(1.0)


class ScriptedSampler:
    """Stands in for a SamplingClient: the next-token distribution after any prompt is ``probs`` (token id ->
    probability); ``topk`` of them are listed by ``sample``."""

    def __init__(self, probs: dict[int, float], topk: int) -> None:
        self.probs, self.topk = probs, topk
        self.calls: list[tuple[str, list[int]]] = []

    async def sample_async(self, prompt, num_samples, params, include_prompt_logprobs=False, topk_prompt_logprobs=0):
        tokens = prompt.to_ints()
        self.calls.append(("sample", tokens))
        ranked = sorted(self.probs.items(), key=lambda kv: -kv[1])[: min(self.topk, topk_prompt_logprobs)]
        return SimpleNamespace(prompt_logprobs=[None] * (len(tokens) - 1) + [math.log(self.probs[tokens[-1]])],
                               topk_prompt_logprobs=[None] * (len(tokens) - 1) + [[(t, math.log(p)) for t, p in ranked]])

    async def compute_logprobs_async(self, prompt):
        tokens = prompt.to_ints()
        self.calls.append(("logprobs", tokens))
        return [None] * (len(tokens) - 1) + [math.log(self.probs[tokens[-1]])]


def _word(chatml, word: str) -> int:
    (token,) = chatml.tokenizer.encode(word, add_special_tokens=False)
    return token


@pytest.mark.parametrize("topk", [3, 2])
def test_the_probability_grader_scores_p_yes_over_p_yes_plus_no(chatml, topk):
    yes, no = _word(chatml, "Yes"), _word(chatml, "No")
    sampler = ScriptedSampler({yes: 0.3, no: 0.1, 42: 0.6}, topk=topk)  # "No" is third: outside a top 2
    grade = run(ProbabilityGrader(sampler, chatml, topk=3)(CONVO, Rubric("Gives exactly three items.")))
    assert grade.score == pytest.approx(0.75) and grade.error is None  # 0.3 / (0.3 + 0.1)
    assert grade.detail == "P(Yes)=0.3000 P(No)=0.1000 -> 0.750"
    # One prefill when "No" is in the listed top k; otherwise each word is scored on its own.
    assert [kind for kind, _ in sampler.calls] == (["sample"] if topk == 3 else ["sample", "logprobs", "logprobs"])
    question = chatml.build_generation_prompt(Rubric("Gives exactly three items.").get_yes_no_prompt(CONVO)).to_ints()
    assert sampler.calls[0][1] == question + [yes]  # the rendered question, then the candidate answer


# -- the env ----------------------------------------------------------------------------------------------------


def _reply(chatml, text: str) -> list[int]:
    return chatml.tokenizer.encode(text, add_special_tokens=False) + [chatml.get_stop_sequences()[0]]


def test_the_reward_is_the_weighted_mean_of_the_criteria(chatml):
    grader = ScriptedScores({"Gives exactly three items.": 1.0, "Every item is about tea.": 0.5,
                             "Items are on separate lines.": 0.0})
    env = RubricGradedEnv(chatml, POINT, grader, format_coef=0.1)
    run(env.initial_observation())
    result = run(env.step(_reply(chatml, "Green tea. Black tea. Tea has caffeine.")))
    # (0.5·1 + 0.3·0.5 + 0.2·0) / (0.5 + 0.3 + 0.2) = 0.65
    assert result.episode_done and result.reward == pytest.approx(0.65)
    assert result.metrics["rubric_score"] == pytest.approx(0.65) and result.metrics["grade_malformed"] == 0.0
    two = RubricBasedDatapoint(POINT.convo, [Rubric("a", weight=2.0), Rubric("b", weight=2.0)])
    result = run(RubricGradedEnv(chatml, two, ScriptedScores({"a": 1.0, "b": 0.5})).step(_reply(chatml, "x")))
    assert result.reward == pytest.approx(0.75)  # (2·1 + 2·0.5) / 4


def test_a_message_completer_grades_in_writing_and_a_malformed_grade_scores_zero(chatml, caplog):
    completer = ScriptedCompleter("<score>1</score>", "no idea", "<score>0.5</score>")
    env = RubricGradedEnv(chatml, POINT, completer)  # the official env's grader_llm: a MessageCompleter
    with caplog.at_level(logging.WARNING):
        result = run(env.step(_reply(chatml, "Tea.")))
    # criterion 2 (weight 0.3) is malformed and scores 0: 0.5·1 + 0.2·0.5 = 0.6
    assert result.reward == pytest.approx(0.6) and result.metrics["grade_malformed"] == pytest.approx(1 / 3)
    assert result.logs["grade_error"] == "criterion 2: no match for '<score>(.*?)</score>'"
    assert "malformed grade, scored 0" in caplog.text
    assert all("Chatbot: Tea." in seen for seen in completer.seen) and len(completer.seen) == 3


def test_a_cut_off_reply_loses_the_format_coefficient(chatml):
    env = RubricGradedEnv(chatml, POINT, ScriptedScores(dict.fromkeys([r.rubric_str for r in POINT.rubric_items], 1.0)))
    tokens = chatml.tokenizer.encode("Tea", add_special_tokens=False)  # no stop token: ran out of tokens
    result = run(env.step(tokens))
    assert result.reward == pytest.approx(0.9) and result.metrics["format"] == 0.0


def test_an_unknown_grader_names_the_field_and_the_choices():
    builder = RubricGradedDatasetBuilder(model_name_for_tokenizer="tinker-cookbook/tiny-smollm2", grader="judge")
    with pytest.raises(ConfigurationError, match=r"dataset_builder.grader='judge'.*\['probability', 'text'\]"):
        builder.make_grader()


# -- data -------------------------------------------------------------------------------------------------------


def test_data_round_trips_and_bad_lines_name_file_and_line(tmp_path):
    assert RubricBasedDatapoint.from_json(POINT.to_json()) == POINT
    # The official cookbook's files (no weights) load with weight 1 and keep their grader format.
    official = {"convo": POINT.convo, "rubric_items": [{"rubric_str": "Is correct?", "extraction_regex": "S: (.)",
                                                        "grader_output_format_instruction": "Write S: <0 or 1>"}]}
    (item,) = RubricBasedDatapoint.from_json(json.dumps(official)).rubric_items
    assert item == Rubric("Is correct?", "S: (.)", "Write S: <0 or 1>", 1.0)
    path = tmp_path / "bad.jsonl"
    path.write_text(POINT.to_json() + "\n" + json.dumps({"convo": POINT.convo, "rubric_items": []}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: .*no rubric items"):
        load_datapoints(path)
    with pytest.raises(DataError, match="weight=0"):
        Rubric("x", weight=0.0)
    with pytest.raises(DataError, match="needs a group around the score"):
        Rubric("x", extraction_regex="<score>")
    with pytest.raises(DataError, match="must end with a user message"):
        RubricBasedDatapoint([{"role": "assistant", "content": "hi"}], [Rubric("x")])


def test_the_shipped_set_is_what_the_generator_writes():
    train, test = generate_data.generate(seed=0, num_test_topics=3)
    assert load_datapoints(EXAMPLE_DATA / "train.jsonl") == train
    assert load_datapoints(EXAMPLE_DATA / "test.jsonl") == test
    train_topics = {p.convo[0]["content"] for p in train}
    assert not train_topics & {p.convo[0]["content"] for p in test}  # test instructions are never trained on
    assert all(abs(p.total_weight - 1.0) < 1e-9 for p in train + test)
    assert weighted_mean(train[0].rubric_items, [1.0] * len(train[0].rubric_items)) == pytest.approx(1.0)


# -- criteria checked by rule -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("check", "text", "passes"), [
    ({"max_words": 3}, "Tea is hot.", True),
    ({"max_words": 2}, "Tea is hot.", False),
    ({"min_words": 4}, "Tea is hot.", False),
    ({"sentences": 1}, "Tea is hot. It is green.", False),
    ({"sentences": 2}, "Tea is hot. It is green!", True),
    ({"sentences": 2}, "Tea is hot\nit is green", True),  # a line counts as a sentence
    ({"sentences": 1}, "Tea... ", True),  # runs of dots end one sentence, no empty ones counted
    ({"lines": 3}, "Green tea.\n\nBlack tea.\nTea has caffeine.\n", True),  # blank lines do not count
    ({"lines": 3}, "Green tea. Black tea. Tea has caffeine.", False),
    ({"starts_with": ["yes", "no"]}, "No, it is a liquid.", True),
    ({"starts_with": ["yes", "no"]}, "Nope.", False),
    ({"mentions": ["librar"]}, "Libraries lend books.", True),
    ({"mentions": ["tea"]}, "Instead, coffee.", False),  # inside a word ("instead") is not a mention
    ({"min_words": 4, "starts_with": ["yes"]}, "Yes.", False),  # every rule must hold
])
def test_a_check_passes_only_when_every_rule_holds(check, text, passes):
    score, detail = run_check(validate_check(check), text)
    assert score == (1.0 if passes else 0.0)
    assert detail.startswith("check passed" if passes else "check failed")


def test_a_failed_check_says_what_was_found():
    _, detail = run_check(validate_check({"sentences": 1, "min_words": 5}), "Yes. Maybe.")
    assert detail == "check failed: 2 sentences, wanted 1; 2 words, wanted at least 5"


def test_checked_criteria_skip_the_grader_and_a_one_word_reply_fails_them(chatml):
    point = RubricBasedDatapoint(POINT.convo, [
        Rubric("Every item is about tea.", weight=0.4),
        Rubric("Three items, one per line.", weight=0.4, check={"lines": 3}),
        Rubric("Names tea.", weight=0.2, check={"mentions": ["tea"]})])
    grader = ScriptedScores({"Every item is about tea.": 0.5})  # a KeyError if a checked criterion reached it
    result = run(RubricGradedEnv(chatml, point, grader).step(_reply(chatml, "Yes")))
    assert result.reward == pytest.approx(0.2)  # 0.4·0.5 + 0.4·0 + 0.2·0
    result = run(RubricGradedEnv(chatml, point, grader).step(_reply(chatml, "Green tea.\nBlack tea.\nOolong tea.")))
    assert result.reward == pytest.approx(0.8)  # 0.4·0.5 + 0.4·1 + 0.2·1
    assert "check passed: lines=3" in result.logs["grades"]


def test_checks_round_trip_and_bad_checks_name_the_rule():
    item = Rubric("Short.", weight=0.5, check={"max_words": 10, "mentions": "tea"})
    assert item.check == {"max_words": 10, "mentions": ["tea"]}
    assert Rubric.from_json(item.to_json()) == item
    assert "check" not in Rubric("Plain.").to_dict()  # the official format stays as it was
    with pytest.raises(DataError, match=r"criterion 'x': unknown check rule\(s\) \['max_chars'\]; the rules are"):
        Rubric("x", check={"max_chars": 10})
    with pytest.raises(DataError, match=r"check rule max_words=-1 must be a non-negative integer"):
        Rubric("x", check={"max_words": -1})
    with pytest.raises(DataError, match=r"starts_with=\[\] must be a non-empty list of words"):
        Rubric("x", check={"starts_with": []})
    with pytest.raises(DataError, match="non-empty mapping of rules"):
        Rubric("x", check={})


def test_the_shipped_set_checks_form_and_leaves_content_to_the_grader():
    train, _ = generate_data.generate(seed=0, num_test_topics=3)
    items = [r for p in train for r in p.rubric_items]
    checked = [r for r in items if r.check is not None]
    assert 0 < len(checked) < len(items)
    # A one-word reply loses at least 0.3 of every datapoint's weight (of 1) on checks alone, whatever the grader
    # says of the rest: a grader's indecision (0.5 on every criterion) can no longer make it the best reply.
    for p in train:
        lost = sum(r.weight for r in p.rubric_items if r.check is not None and run_check(r.check, "Yes")[0] == 0.0)
        assert lost >= 0.3 - 1e-9, p.convo
