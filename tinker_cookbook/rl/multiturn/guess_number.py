"""Guess the number: find a hidden integer in ``[low, high]`` from "Too low" / "Too high" feedback.

Each turn the player replies ``Guess: <number>``. A right guess ends the episode with reward 1. A wrong one is
answered "Too low." or "Too high.". A reply with no ``Guess: <integer>`` line (or one cut off at the token limit)
is a format error: it costs ``format_penalty`` and is answered with a message that restates the format. Every
reply uses one of the ``max_turns`` turns; when they run out the episode ends. Binary search needs
ceil(log2(high - low + 1)) guesses, so a policy that uses the feedback can always win.

Batch ``i`` draws its numbers from a generator seeded by ``(seed, i)``, so resumed runs replay the same games.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import chz

from tinker_cookbook.rl.multiturn.message_env import (
    EnvFromMessageEnv,
    MessageEnv,
    MessageStepResult,
    renderer_for,
)
from tinker_cookbook.rl.problem_env import message_text
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, Logs, Metrics, RLDataset, RLDatasetBuilder

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Message, Renderer

TAG = "guess_number"
RULES = (
    "Let's play a game. I am thinking of a whole number from {low} to {high}. Find it in at most {max_turns} "
    "guesses. Reply with one line: Guess: <number>. After each guess I say Too low, Too high or Correct."
)
FIRST_USER_MESSAGE = "Make your first guess."
NEW_GAME_MESSAGE = "Correct! Let's play again with a new number. Make your first guess."
FORMAT_HINT = "I could not read a guess. Reply with one line: Guess: <number>."

_GUESS = re.compile(r"^\s*\**guess\**\s*:\s*\**\s*(-?\d+)\b", re.IGNORECASE | re.MULTILINE)


def parse_number_guess(text: str) -> int | None:
    """The integer of the first ``Guess: <integer>`` line of ``text``, or None."""
    match = _GUESS.search(text)
    return int(match.group(1)) if match else None


def example_game(low: int, high: int) -> list[Message]:
    """A short finished game shown before the real one: a binary search that goes up, then down, then wins.

    Small models learn the reply format from it, and that both kinds of feedback are to be used.
    """
    first = (low + high) // 2
    second = max((first + 1 + high) // 2, first + 1)
    third = (first + second) // 2 if second - first > 1 else second
    after_second = "Too high." if third < second else "Correct!"
    games: list[Message] = [
        {"role": "user", "content": FIRST_USER_MESSAGE}, {"role": "assistant", "content": f"Guess: {first}"},
        {"role": "user", "content": "Too low."}, {"role": "assistant", "content": f"Guess: {second}"},
        {"role": "user", "content": after_second},
    ]
    if third < second:
        games += [{"role": "assistant", "content": f"Guess: {third}"}, {"role": "user", "content": "Correct!"}]
    games[-1] = {"role": "user", "content": NEW_GAME_MESSAGE}
    return games


class GuessNumberEnv(MessageEnv):
    """One game with a hidden ``target`` (see the module docstring)."""

    def __init__(self, target: int, low: int, high: int, max_turns: int = 10, format_penalty: float = 1.0,
                 include_example: bool = False) -> None:
        if not low <= target <= high:
            raise ValueError(f"target={target} is outside [low={low}, high={high}]")
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be at least 1")
        self.target, self.low, self.high = target, low, high
        self.max_turns = max_turns
        self.format_penalty = format_penalty
        self.include_example = include_example
        self.turns = 0
        self.success = False
        self.format_errors = 0

    async def initial_messages(self) -> list[Message]:
        rules: Message = {"role": "system", "content": RULES.format(low=self.low, high=self.high,
                                                                    max_turns=self.max_turns)}
        if self.include_example:
            return [rules, *example_game(self.low, self.high)]
        return [rules, {"role": "user", "content": FIRST_USER_MESSAGE}]

    async def step(self, reply: Message, ended_cleanly: bool) -> MessageStepResult:
        self.turns += 1
        text = message_text(reply)
        guess = parse_number_guess(text) if ended_cleanly else None
        self.success = guess == self.target
        self.format_errors += int(guess is None)
        reward = 1.0 if self.success else (-self.format_penalty if guess is None else 0.0)
        metrics: Metrics = {"format": float(guess is not None)}
        logs: Logs = {"target": self.target, "player": text.strip()}
        if self.success or self.turns >= self.max_turns:
            return MessageStepResult(reward, True, metrics=metrics, logs=logs)
        if guess is None:
            feedback = FORMAT_HINT
        else:
            feedback = "Too low." if guess < self.target else "Too high."
        logs["feedback"] = feedback
        return MessageStepResult(reward, False, [{"role": "user", "content": feedback}], metrics, logs)

    def episode_metrics(self) -> Metrics:
        return {"episode/success": float(self.success), "episode/guesses_used": self.turns,
                "episode/format_errors": self.format_errors}


class GuessNumberGroupBuilder(EnvGroupBuilder):
    """``group_size`` games with the same hidden number."""

    def __init__(self, renderer: Renderer, group_size: int, target: int, low: int, high: int, max_turns: int,
                 format_penalty: float, include_example: bool = False) -> None:
        self.renderer = renderer
        self.group_size = group_size
        self.make_game = partial(GuessNumberEnv, target, low, high, max_turns, format_penalty, include_example)

    async def make_envs(self) -> Sequence[Env]:
        return [EnvFromMessageEnv(self.renderer, self.make_game()) for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return [TAG]


class GuessNumberDataset(RLDataset):
    """``n_batches`` batches of ``batch_size`` hidden numbers, each played ``group_size`` times."""

    def __init__(self, renderer: Renderer, batch_size: int, group_size: int, n_batches: int, low: int, high: int,
                 max_turns: int, format_penalty: float, seed: int, include_example: bool = False) -> None:
        self.batch_size, self.n_batches = batch_size, n_batches
        self.low, self.high = low, high
        self.group = partial(GuessNumberGroupBuilder, renderer, group_size, low=low, high=high,
                             max_turns=max_turns, format_penalty=format_penalty, include_example=include_example)
        self.seed = seed

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.n_batches:
            raise IndexError(f"batch index {index} is outside [0, {self.n_batches})")
        rng = random.Random(f"{self.seed}-{index}")
        return [self.group(target=rng.randint(self.low, self.high)) for _ in range(self.batch_size)]

    def __len__(self) -> int:
        return self.n_batches


@chz.chz
class GuessNumberDatasetBuilder(RLDatasetBuilder):
    """Random hidden numbers for training; a fixed test set of ``n_test_games`` numbers (another seed)."""

    batch_size: int
    group_size: int
    model_name_for_tokenizer: str
    renderer_name: str | None = None
    """None: the model's recommended renderer."""

    n_batches: int = 100
    low: int = 0
    high: int = 1024
    max_turns: int = 10
    format_penalty: float = 1.0
    include_example: bool = True
    """Show a short finished example game before each game (small models learn the format from it)."""

    seed: int = 0
    n_test_games: int = 0
    test_group_size: int = 4

    @chz.validate
    def _check(self) -> None:
        for name in ("batch_size", "group_size", "n_batches", "max_turns", "test_group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.low > self.high:
            raise ValueError(f"low={self.low} is above high={self.high}; the range must hold at least one number")
        if self.n_test_games < 0:
            raise ValueError(f"n_test_games={self.n_test_games} must be >= 0")

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = renderer_for(self.model_name_for_tokenizer, self.renderer_name)
        dataset = partial(GuessNumberDataset, renderer, low=self.low, high=self.high, max_turns=self.max_turns,
                          format_penalty=self.format_penalty, include_example=self.include_example)
        train = dataset(self.batch_size, self.group_size, self.n_batches, seed=self.seed)
        test = None
        if self.n_test_games > 0:
            test = dataset(self.n_test_games, self.test_group_size, 1, seed=self.seed + 1_000_003)
        return train, test


# The official cookbook's name of the group builder.
GuessNumberEnvGroupBuilder = GuessNumberGroupBuilder
