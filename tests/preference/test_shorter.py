"""The "shorter" judge with scripted quality judges: length decides among equally good replies, and in the
pairwise self-play rewards the shorter replies of a group win."""

from __future__ import annotations

import asyncio

import pytest

from recipes.preference.shorter.env import (
    PreferenceModelShorter,
    ShorterPreferenceModelBuilder,
    length_preference,
)
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.preference.comparison_env import play_matchups
from tinker_cookbook.preference.preference_model import PreferenceModel
from tinker_cookbook.preference.types import Comparison, completion_text
from tinker_cookbook.renderers import Message

PROMPT: list[Message] = [{"role": "user", "content": "Why is the sky blue?"}]


def _cmp(a: str, b: str) -> Comparison:
    return Comparison(PROMPT, [{"role": "assistant", "content": a}], [{"role": "assistant", "content": b}])


def run(coro):
    return asyncio.run(coro)


class FixedQuality(PreferenceModel):
    """P(A better) from a table of reply texts' quality: the higher quality wins with probability ``p``."""

    def __init__(self, quality: dict[str, float], p: float = 0.9) -> None:
        self.quality, self.p = quality, p

    async def prob_a_better(self, comparison: Comparison) -> float:
        qa = self.quality[completion_text(comparison.completion_A)]
        qb = self.quality[completion_text(comparison.completion_B)]
        return 0.5 if qa == qb else self.p if qa > qb else 1.0 - self.p


def test_length_alone_prefers_the_shorter_reply():
    assert length_preference(_cmp("short", "much longer")) == 1.0
    assert length_preference(_cmp("much longer", "short")) == 0.0
    assert length_preference(_cmp("same", "size")) == 0.5
    judge = ShorterPreferenceModelBuilder(model_name="unused")()  # no model_path: length alone
    assert run(judge(_cmp("a", "bb"))) == 1.0


def test_quality_wins_where_clear_and_length_breaks_ties():
    quality = FixedQuality({"Light scatters.": 1.0, "Rayleigh scattering of sunlight.": 1.0, "Dunno.": 0.0})
    judge = PreferenceModelShorter(quality, tie_margin=0.1)
    # Equally good: the shorter wins outright.
    assert run(judge(_cmp("Light scatters.", "Rayleigh scattering of sunlight."))) == 1.0
    # A clear quality difference stands even against a shorter reply (0.9 in both orders, averaged: 0.9).
    assert run(judge(_cmp("Dunno.", "Light scatters."))) == pytest.approx(0.1)
    # A quality verdict within the margin of 0.5 counts as a tie, decided by length.
    assert run(PreferenceModelShorter(FixedQuality({"x": 1.0, "yy": 0.0}, p=0.55), 0.1)(_cmp("x", "yy"))) == 1.0
    with pytest.raises(ConfigurationError, match="tie_margin=0.7"):
        PreferenceModelShorter(None, 0.7)


def test_in_a_group_the_shorter_replies_earn_more():
    replies = [{"role": "assistant", "content": text} for text in ("aaaa", "a", "aa", "aaa")]
    wins = run(play_matchups(PreferenceModelShorter(), PROMPT, replies, [True] * 4, [(i, j) for i in range(4)
                                                                                      for j in range(i + 1, 4)]))
    # All pairs among 4 replies: each plays 3 matchups and wins those against longer replies.
    assert wins == pytest.approx([0.0, 1.0, 2 / 3, 1 / 3])


def test_with_a_preference_model_the_recipe_measures_it_against_the_initial_policy(tmp_path):
    """The recipe end to end on a tiny model whose untrained LoRA weights stand in for stage 2's model: the
    held-out win rate against the initial policy under that model alone, and both policies' reply lengths."""
    import json

    from recipes.preference.shorter import train as recipe
    from tinker_cookbook import tinker
    from tinker_cookbook.eval.custom_evaluators import ComparisonEvaluatorBuilder

    tiny = "tinker-cookbook/tiny-smollm2"
    client = tinker.ServiceClient().create_lora_training_client(tiny, rank=4, seed=0)
    pm_path = client.save_weights_for_sampler("stand-in-preference-model").result().path
    argv = [f"model_name={tiny}", "max_steps=1", "lora_rank=4", "eval_every=1", f"log_path={tmp_path / 'run'}",
            "behavior_if_log_dir_exists=delete", "dataset_builder.batch_size=1", "dataset_builder.group_size=2",
            "max_tokens=4", f"dataset_builder.preference_model_builder.model_path={pm_path}"]
    config = recipe.with_quality_evaluation(recipe.blueprint().make_from_argv(argv))
    (evaluator,) = [e for e in config.evaluator_builders if isinstance(e, ComparisonEvaluatorBuilder)]
    assert evaluator.reference_base_model == tiny and evaluator.reference_model_path is None
    assert evaluator.preference_model_builder.model_path == pm_path and evaluator.name == "pm_score"
    # Length alone: no preference model to measure with, the config is unchanged.
    plain = recipe.blueprint().make_from_argv(argv[:-1])
    assert recipe.with_quality_evaluation(plain) is plain
    recipe.main(recipe.blueprint().make_from_argv(argv))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if "pm_score/win_rate" in r)
    assert first["pm_score/win_rate"] == 0.5  # step 0: the initial policy against itself, same seeds
    assert first["pm_score/reply_tokens"] == first["pm_score/reference_reply_tokens"] > 0
