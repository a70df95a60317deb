"""The RLHF pieces: preference-model data and judging, the pairwise self-play env group, the win-rate evaluator."""

from __future__ import annotations

import asyncio
import math

import pytest
from pref_helpers import TINY_MODEL

from tinker_cookbook import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.eval.custom_evaluators import ComparisonEvaluator, PreferenceAccuracyEvaluator
from tinker_cookbook.preference.comparison_env import (
    PairwisePreferenceGroupBuilder,
    TournamentPattern,
    matchups,
    play_matchups,
)
from tinker_cookbook.preference.preference_datasets import RLHFExampleComparisonBuilder
from tinker_cookbook.preference.preference_model import (
    LabelLogprobPreferenceModel,
    PreferenceModel,
    PreferenceModelBuilder,
    comparison_to_datum,
)
from tinker_cookbook.preference.types import Comparison, LabeledComparison, completion_text
from tinker_cookbook.rl.types import Trajectory, Transition

PROMPT = [{"role": "user", "content": "What is the capital of Peru?"}]


def reply(text: str) -> list:
    return [{"role": "assistant", "content": text}]


class LongerIsBetter(PreferenceModel):
    """A rule-based judge (like the docs' "shorter" recipe, reversed), with an optional bias towards slot A."""

    def __init__(self, bias_a: float = 0.0) -> None:
        self.bias_a = bias_a
        self.calls = 0

    async def prob_a_better(self, comparison: Comparison) -> float:
        self.calls += 1
        a, b = (len(completion_text(c)) for c in (comparison.completion_A, comparison.completion_B))
        base = 0.9 if a > b else 0.1 if a < b else 0.5
        return min(1.0, base + self.bias_a)


@pytest.fixture(scope="module")
def renderer():
    return PreferenceModelBuilder(model_name=TINY_MODEL, renderer_name="chatml").renderer()


@pytest.fixture(scope="module")
def tiny_client():
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(TINY_MODEL, rank=4, seed=0)
    return training.save_weights_and_get_sampling_client()


# -- tournaments and rewards ---------------------------------------------------------------------------------


def test_tournament_patterns():
    assert matchups(4, TournamentPattern.ALL_PAIRS) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    cycle = matchups(5, TournamentPattern.ROUND_ROBIN)
    assert len(cycle) == 5 and all(sum(k in pair for pair in cycle) == 2 for k in range(5))
    assert matchups(2, TournamentPattern.ROUND_ROBIN) == [(0, 1)]
    with pytest.raises(ValueError, match="at least 2"):
        matchups(1, TournamentPattern.ALL_PAIRS)


def test_position_bias_cancels_when_both_orders_are_averaged():
    judge = LongerIsBetter(bias_a=0.1)
    comparison = Comparison(PROMPT, reply("The capital of Peru is Lima."), reply("lima"))
    one_order = asyncio.run(judge.prob_a_better(comparison))
    both = asyncio.run(judge(comparison))
    assert one_order == pytest.approx(1.0) and both == pytest.approx(0.9)  # (1.0 + 1 - 0.2) / 2
    assert asyncio.run(judge(Comparison(PROMPT, reply("x"), reply("y")))) == pytest.approx(0.5)


def test_win_fractions_invalid_replies_lose_without_being_judged():
    judge = LongerIsBetter()
    replies = [reply("The capital of Peru is Lima.")[0], reply("lima")[0], reply("")[0]]
    wins = asyncio.run(play_matchups(judge, PROMPT, replies, [True, True, False],
                                     matchups(3, TournamentPattern.ALL_PAIRS)))
    # 0 beats 1 with 0.9 and the invalid 2 with 1; 1 loses 0.9 to 0 and beats 2; 2 loses both.
    assert wins == pytest.approx([0.95, 0.55, 0.0])
    assert judge.calls == 2  # only the valid pair, in both orders


def _trajectory(tokens: list[int]) -> Trajectory:
    ac = TokensWithLogprobs(tokens=tokens, maybe_logprobs=[0.0] * len(tokens))
    return Trajectory([Transition(ob=tinker.ModelInput.empty(), ac=ac, reward=0.0, episode_done=True)],
                      tinker.ModelInput.empty())


@pytest.mark.parametrize("reward_type", ["win_fraction", "win_minus_loss"])
def test_group_rewards_and_format_penalty(renderer, reward_type):
    end = renderer.tokenizer.encode("<|im_end|>", add_special_tokens=False)
    texts = ["The capital of Peru is Lima.", "lima"]
    tokens = [renderer.tokenizer.encode(t, add_special_tokens=False) + end for t in texts]
    tokens.append(renderer.tokenizer.encode("The capital of Peru is", add_special_tokens=False))  # cut off
    builder = PairwisePreferenceGroupBuilder(PROMPT, renderer, LongerIsBetter(), group_size=3,
                                             reward_type=reward_type, format_penalty=1.0)
    envs = asyncio.run(builder.make_envs())
    results = asyncio.run(builder.compute_group_rewards([_trajectory(t) for t in tokens], envs))
    wins = [0.95, 0.55, 0.0]
    expected = [w if reward_type == "win_fraction" else 2 * w - 1 for w in wins]
    expected[2] -= 1.0
    assert [r for r, _ in results] == pytest.approx(expected)
    assert [m["format"] for _, m in results] == [1.0, 1.0, 0.0]


# -- the preference model ------------------------------------------------------------------------------------


def test_comparison_datum_trains_only_the_label_token(renderer):
    labeled = LabeledComparison.from_pair(PROMPT, reply("The capital of Peru is Lima."), reply("lima"))
    datums = [comparison_to_datum(c, renderer, 512) for c in (labeled, labeled.swap())]
    for datum, label in zip(datums, ("A", "B"), strict=True):
        weights = datum.loss_fn_inputs["weights"].tolist()
        targets = datum.loss_fn_inputs["target_tokens"].tolist()
        assert sum(weights) == 1.0 and weights[-1] == 1.0  # the last target, and only it
        assert renderer.tokenizer.decode([targets[-1]]) == label
    with pytest.raises(ValueError, match="max_length"):
        comparison_to_datum(labeled, renderer, 16)
    with pytest.raises(ValueError, match="tie"):
        comparison_to_datum(LabeledComparison(labeled.comparison, "Tie"), renderer, 512)


def test_label_probability_matches_the_two_label_logprobs(renderer, tiny_client):
    model = LabelLogprobPreferenceModel(tiny_client, renderer)
    comparison = Comparison(PROMPT, reply("The capital of Peru is Lima."), reply("lima"))
    p = asyncio.run(model.prob_a_better(comparison))
    prefix = comparison_to_datum(LabeledComparison(comparison, "A"), renderer, None).model_input.to_ints()
    lp = {label: tiny_client.compute_logprobs(tinker.ModelInput.from_ints([*prefix, token])).result()[-1]
          for label, token in (("A", model.token_a), ("B", model.token_b))}
    expected = 1.0 / (1.0 + math.exp(lp["B"] - lp["A"]))
    # The same weights score the same prefix; only float32 rounding of differently shaped batches differs.
    assert p == pytest.approx(expected, abs=1e-4)
    both = asyncio.run(model(comparison))
    assert 0.0 < both < 1.0


def test_preference_accuracy_evaluator_reports_both_orders(renderer, tiny_client):
    _, test = RLHFExampleComparisonBuilder()()
    assert test is not None
    evaluator = PreferenceAccuracyEvaluator([test.get(i) for i in range(6)], renderer, name="pm")
    metrics = asyncio.run(evaluator(tiny_client))
    assert metrics["pm/num_pairs"] == 6
    for key in ("pm/accuracy", "pm/accuracy_as_shown", "pm/accuracy_swapped"):
        assert 0.0 <= metrics[key] <= 1.0
    # accuracy counts 1 per pair when both orders are right, 0.5 when one is: the mean of the two single orders
    assert metrics["pm/accuracy"] == pytest.approx(0.5 * (metrics["pm/accuracy_as_shown"]
                                                          + metrics["pm/accuracy_swapped"]))


def test_win_rate_of_a_policy_against_itself_is_one_half(renderer, tiny_client):
    prompts = [PROMPT, [{"role": "user", "content": "What is 3 plus 4?"}]]
    evaluator = ComparisonEvaluator(prompts, tiny_client, LongerIsBetter(), renderer, max_tokens=8,
                                    samples_per_prompt=2, seed=7)
    metrics = asyncio.run(evaluator(tiny_client))  # same weights, same seeds: the same replies on both sides
    assert metrics["win_rate/win_rate"] == 0.5 and metrics["win_rate/num_matchups"] == 4
    assert metrics["win_rate/stderr"] == 0.0
    # Same replies: the same mean length, at most the budget of 8 tokens.
    assert metrics["win_rate/reply_tokens"] == metrics["win_rate/reference_reply_tokens"]
    assert 0 < metrics["win_rate/reply_tokens"] <= 8


def test_win_rate_builder_renders_the_policies_with_their_own_renderer():
    """The judge may read another format than the policies write: the policies' prompts use the policies'
    renderer (``model_name``/``renderer_name``), the judge keeps its own."""
    from tinker_cookbook.eval.custom_evaluators import ComparisonEvaluatorBuilder
    from tinker_cookbook.renderers import ChatMLRenderer, RoleColonRenderer

    training = tinker.ServiceClient().create_lora_training_client(TINY_MODEL, rank=4, seed=0)
    path = training.save_weights_for_sampler("win-rate-reference").result().path
    judge = PreferenceModelBuilder(model_name=TINY_MODEL, renderer_name="role_colon", model_path=path)
    evaluator = ComparisonEvaluatorBuilder(
        comparison_builder=RLHFExampleComparisonBuilder(), preference_model_builder=judge, reference_model_path=path,
        model_name=TINY_MODEL, renderer_name="chatml", max_prompts=2)()
    assert isinstance(evaluator.renderer, ChatMLRenderer)
    assert isinstance(evaluator.preference_model.renderer, RoleColonRenderer)


# -- data ------------------------------------------------------------------------------------------------------


def _labels(datums, renderer) -> list[str]:
    return [renderer.tokenizer.decode([d.loss_fn_inputs["target_tokens"].tolist()[-1]]) for d in datums]


@pytest.mark.parametrize("both_orders", [True, False])
def test_preference_model_data_puts_the_preferred_reply_in_either_slot(renderer, both_orders):
    from tinker_cookbook.preference.preference_model import PreferenceModelDatasetBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=TINY_MODEL, renderer_name="chatml",
                                            max_length=512, batch_size=4)
    train, test = PreferenceModelDatasetBuilder(common_config=common, comparison_builder=RLHFExampleComparisonBuilder(),
                                                both_orders=both_orders)()
    batch = train.get_batch(0)
    labels = _labels(batch, renderer)
    assert len(batch) == (8 if both_orders else 4) and set(labels) == {"A", "B"}
    if both_orders:  # each comparison as given (the chosen reply is A) and swapped, next to each other
        assert labels == ["A", "B"] * 4
    assert test is not None and len(test.get_batch(0)) == 64 * (2 if both_orders else 1)


def test_prompt_list_skips_malformed_hub_rows_and_stops_on_bad_file_rows():
    from tinker_cookbook.preference.comparison_env import distinct_prompts
    from tinker_cookbook.preference.preference_datasets import Comparisons, parse_pair_row

    rows = [{"prompt": "Q1", "chosen": "a", "rejected": "b"}, {"prompt": "Q1", "chosen": "c", "rejected": "d"},
            {"prompt": "Q2"}, {"prompt": "Q3", "chosen": "e", "rejected": "f"}]
    hub = Comparisons(rows, parse_pair_row, str, on_invalid="skip", check_up_front=False)
    assert distinct_prompts(hub) == [[{"role": "user", "content": "Q1"}], [{"role": "user", "content": "Q3"}]]
    assert distinct_prompts(hub, limit=1) == [[{"role": "user", "content": "Q1"}]]
    with pytest.raises(ValueError, match="missing"):
        distinct_prompts(Comparisons(rows, parse_pair_row, str))
