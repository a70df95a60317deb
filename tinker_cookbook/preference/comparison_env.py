"""Pairwise self-play RL against a preference model (RLHF stage 3), for the unchanged RL loop (``rl/train.py``).

For each prompt, the policy samples a group of ``group_size`` completions (one ``PairwisePreferenceEnv`` each, one
step, no reward of its own). ``PairwisePreferenceGroupBuilder.compute_group_rewards`` then plays matchups between
the group's completions (``TournamentPattern``):

- ``all_pairs``: every unordered pair once, ``n(n-1)/2`` matchups (each judged in both orders by the model);
- ``round_robin``: completion ``i`` against ``i + 1`` (cyclically), ``n`` matchups: cheaper for large groups,
  every completion still plays twice.

A matchup gives each side its probability of being better (``PreferenceModel.__call__``, both orders averaged).
The reward is a completion's **win fraction** (mean over its matchups, in [0, 1]), or with
``reward_type="win_minus_loss"`` the win fraction minus the loss fraction (in [-1, 1]). A completion that is empty
or was cut off at ``max_tokens`` (no stop sequence) is not shown to the model: it loses its matchups against
valid completions (two invalid ones tie), and its reward is lowered by ``format_penalty``.

Metrics per completion: ``win_fraction``, ``format`` (1 = valid). ``PairwisePreferenceRLDatasetBuilder`` takes the
prompts of a comparison builder's train split (distinct prompts, shuffled with ``seed``, ``num_epochs`` passes).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Literal

import chz

from tinker_cookbook import tinker
from tinker_cookbook.completers import StopCondition
from tinker_cookbook.exceptions import ConfigurationError, DataError, RendererError
from tinker_cookbook.preference.preference_datasets import ComparisonDatasetBuilder, Comparisons
from tinker_cookbook.preference.preference_model import PreferenceModel, PreferenceModelBuilder
from tinker_cookbook.preference.types import Comparison
from tinker_cookbook.renderers import Message, Renderer
from tinker_cookbook.rl.problem_env import is_stop_sequence_termination, message_text
from tinker_cookbook.rl.types import (
    Action,
    Env,
    EnvGroupBuilder,
    Metrics,
    RLDataset,
    RLDatasetBuilder,
    StepResult,
    Trajectory,
)

RewardType = Literal["win_fraction", "win_minus_loss"]


class TournamentPattern(StrEnum):
    ALL_PAIRS = "all_pairs"
    ROUND_ROBIN = "round_robin"


def matchups(n: int, pattern: TournamentPattern) -> list[tuple[int, int]]:
    """The pairs ``(i, j)`` of group members that play each other."""
    if n < 2:
        raise ConfigurationError(f"group_size={n}: pairwise self-play needs at least 2 completions per prompt")
    if pattern == TournamentPattern.ALL_PAIRS:
        return [(i, j) for i in range(n) for j in range(i + 1, n)]
    if n == 2:  # the cycle 0-1-0 would play the same pair twice
        return [(0, 1)]
    return [(i, (i + 1) % n) for i in range(n)]


class PairwisePreferenceEnv(Env):
    """One reply to a prompt; scored later, against the rest of its group."""

    def __init__(self, prompt: list[Message], renderer: Renderer) -> None:
        self.prompt = prompt
        self.renderer = renderer

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        return self.renderer.build_generation_prompt(self.prompt), self.renderer.get_stop_sequences()

    async def step(self, action: Action) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        return StepResult(reward=0.0, episode_done=True, next_observation=tinker.ModelInput.empty(),
                          next_stop_condition=self.renderer.get_stop_sequences(),
                          logs={"response": message_text(message),
                                "stopped": int(is_stop_sequence_termination(termination))})


def parse_reply(renderer: Renderer, tokens: Sequence[int]) -> tuple[Message, bool]:
    """The reply as an assistant message, and whether it is valid: non-empty and ended by the stop sequence."""
    message, termination = renderer.parse_response(list(tokens))
    text = message_text(message)
    return {"role": "assistant", "content": text}, bool(text.strip()) and is_stop_sequence_termination(termination)


def unjudged_score(valid: bool, other_valid: bool) -> float:
    """A reply's score in a matchup the judge does not see (one reply or both invalid): an invalid reply loses to
    a valid one, and two invalid ones tie. Only two valid replies go to the judge."""
    return 0.5 if valid == other_valid else float(valid)


async def play_matchups(preference_model: PreferenceModel, prompt: list[Message], replies: Sequence[Message],
                        valid: Sequence[bool], pairs: Sequence[tuple[int, int]]) -> list[float]:
    """Each reply's win fraction over its matchups (an invalid reply loses to a valid one; two invalid ones tie)."""

    async def p_first_wins(i: int, j: int) -> float:
        if valid[i] and valid[j]:
            return await preference_model(Comparison(prompt, [replies[i]], [replies[j]]))
        return unjudged_score(valid[i], valid[j])

    outcomes = await asyncio.gather(*(p_first_wins(i, j) for i, j in pairs))
    wins = [0.0] * len(replies)
    played = [0] * len(replies)
    for (i, j), p in zip(pairs, outcomes, strict=True):
        wins[i] += p
        wins[j] += 1.0 - p
        played[i] += 1
        played[j] += 1
    return [w / max(k, 1) for w, k in zip(wins, played, strict=True)]


class PairwisePreferenceGroupBuilder(EnvGroupBuilder):
    """``group_size`` replies to one prompt, rewarded by their matchups under ``preference_model``."""

    def __init__(self, prompt: list[Message], renderer: Renderer, preference_model: PreferenceModel,
                 group_size: int, tournament: TournamentPattern = TournamentPattern.ALL_PAIRS,
                 reward_type: RewardType = "win_fraction", format_penalty: float = 1.0,
                 tag: str = "pairwise_preference") -> None:
        self.pairs = matchups(group_size, tournament)  # validates group_size
        self.prompt = prompt
        self.renderer = renderer
        self.preference_model = preference_model
        self.group_size = group_size
        self.reward_type = reward_type
        self.format_penalty = format_penalty
        self.tag = tag

    async def make_envs(self) -> Sequence[Env]:
        return [PairwisePreferenceEnv(self.prompt, self.renderer) for _ in range(self.group_size)]

    async def compute_group_rewards(self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
                                    ) -> list[tuple[float, Metrics]]:
        parsed = [parse_reply(self.renderer, t.transitions[-1].ac.tokens) for t in trajectory_group]
        replies, valid = [m for m, _ in parsed], [v for _, v in parsed]
        win = await play_matchups(self.preference_model, self.prompt, replies, valid, self.pairs)
        results: list[tuple[float, Metrics]] = []
        for w, ok in zip(win, valid, strict=True):
            reward = w if self.reward_type == "win_fraction" else 2.0 * w - 1.0
            reward -= self.format_penalty * (0.0 if ok else 1.0)
            results.append((reward, {"win_fraction": w, "format": float(ok)}))
        return results

    def logging_tags(self) -> list[str]:
        return [self.tag]


def distinct_prompts(comparisons: Comparisons, limit: int | None = None) -> list[list[Message]]:
    """The prompt conversations of the comparisons, each once, in order of first appearance (the first ``limit``)."""
    seen: set[str] = set()
    prompts: list[list[Message]] = []
    for index in range(len(comparisons)):
        if limit is not None and len(prompts) >= limit:
            break
        try:
            prompt = comparisons.get(index).comparison.prompt_conversation
        except (DataError, RendererError):
            if comparisons.on_invalid == "raise":
                raise
            continue  # hub data: a malformed row is skipped, as in training
        key = repr(prompt)
        if key not in seen:
            seen.add(key)
            prompts.append(prompt)
    return prompts


class PairwisePreferenceRLDataset(RLDataset):
    """Batch ``i``: ``batch_size`` prompts (of a fixed shuffled order, repeated ``num_epochs`` times)."""

    def __init__(self, prompts: list[list[Message]], batch_size: int, make_group: Callable[[list[Message]], EnvGroupBuilder],
                 num_epochs: int, seed: int) -> None:
        order: list[list[Message]] = []
        for epoch in range(num_epochs):
            shuffled = list(prompts)
            random.Random(f"{seed}-{epoch}").shuffle(shuffled)
            order += shuffled
        self.order = order
        self.batch_size = batch_size
        self.make_group = make_group

    def __len__(self) -> int:
        return len(self.order) // self.batch_size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of a dataset of {len(self)} batches")
        return [self.make_group(p) for p in self.order[index * self.batch_size:(index + 1) * self.batch_size]]


@chz.chz
class PairwisePreferenceRLDatasetBuilder(RLDatasetBuilder):
    """Self-play RL on the prompts of ``comparison_builder``'s train split, judged by a trained preference model."""

    comparison_builder: ComparisonDatasetBuilder
    """Where the prompts come from (the train split's distinct prompt conversations)."""
    preference_model_builder: PreferenceModelBuilder
    """The judge (stage 2's sampler checkpoint)."""
    model_name: str
    """The policy's base model (tokenizer and renderer)."""
    renderer_name: str | None = None
    """The policy's renderer (None: the model's recommended one)."""
    batch_size: int = 8
    """Prompts per batch."""
    group_size: int = 4
    """Completions per prompt, played against each other."""
    tournament: TournamentPattern = TournamentPattern.ALL_PAIRS
    """``all_pairs`` or ``round_robin``."""
    reward_type: RewardType = "win_fraction"
    """``win_fraction`` (0..1) or ``win_minus_loss`` (-1..1)."""
    format_penalty: float = 1.0
    """Subtracted from the reward of an empty or cut-off completion."""
    num_epochs: int = 1
    """Passes over the prompts."""
    max_prompts: int | None = None
    """Use only the first this many distinct prompts (None: all; hub datasets have 100k+)."""
    seed: int = 0
    """Seed of the prompt order."""

    @chz.validate
    def _check(self) -> None:
        if self.batch_size < 1 or self.group_size < 2 or self.num_epochs < 1:
            raise ConfigurationError(f"batch_size={self.batch_size} and num_epochs={self.num_epochs} must be >= 1 and "
                                     f"group_size={self.group_size} >= 2 (completions play each other)")
        if self.reward_type not in ("win_fraction", "win_minus_loss"):
            raise ConfigurationError(f"reward_type={self.reward_type!r} must be 'win_fraction' or 'win_minus_loss'")

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        from tinker_cookbook.renderers import renderer_for

        train, _ = self.comparison_builder()
        prompts = distinct_prompts(train, self.max_prompts)
        if len(prompts) < self.batch_size:
            raise ConfigurationError(f"{len(prompts)} distinct prompts make no batch of batch_size={self.batch_size}")
        renderer = renderer_for(self.model_name, self.renderer_name)
        judge = self.preference_model_builder()

        def make_group(prompt: list[Message]) -> EnvGroupBuilder:
            return PairwisePreferenceGroupBuilder(prompt, renderer, judge, self.group_size,
                                                  TournamentPattern(self.tournament), self.reward_type,
                                                  self.format_penalty)

        return PairwisePreferenceRLDataset(prompts, self.batch_size, make_group, self.num_epochs, self.seed), None
