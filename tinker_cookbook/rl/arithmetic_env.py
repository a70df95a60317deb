"""Addition problems ("What is 4 + 5?"): the smallest env on which RL visibly learns.

The answer is the last integer in the reply. A reply is well-formed when it ends with the renderer's stop sequence,
so reward = correct − ``format_coef`` · (reply cut off); ``format_coef=0`` makes reward = correct. Batch ``i``
is drawn from a generator seeded by ``(seed, i)``, which makes resumed runs replay the same problems.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import chz

from tinker_cookbook.rl.problem_env import ProblemEnv, problem_group
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Message, Renderer

_INTEGER = re.compile(r"-?\d+")

FEWSHOT_PREFIX: list[Message] = [
    {"role": "user", "content": "What is 4 + 5?"},
    {"role": "assistant", "content": "9"},
]


def last_integer(text: str) -> int | None:
    """The last integer written in ``text`` (commas inside numbers ignored), or None."""
    matches = _INTEGER.findall(text.replace(",", ""))
    return int(matches[-1]) if matches else None


class ArithmeticEnv(ProblemEnv):
    def __init__(self, x: int, y: int, renderer: Renderer, convo_prefix: list[Message] | None = None,
                 format_coef: float = 0.1) -> None:
        super().__init__(renderer, convo_prefix, format_coef=format_coef)
        self.x, self.y = x, y

    def get_question(self) -> str:
        return f"What is {self.x} + {self.y}?"

    def check_answer(self, sample_str: str) -> bool:
        return last_integer(sample_str) == self.x + self.y

    def check_format(self, sample_str: str) -> bool:
        return True

    def get_reference_answer(self) -> str:
        return str(self.x + self.y)


class ArithmeticDataset(RLDataset):
    """``n_batches`` batches of ``batch_size`` random problems, each rolled out ``group_size`` times."""

    def __init__(self, batch_size: int, group_size: int, renderer: Renderer, n_batches: int, max_operand: int = 100,
                 include_fewshot: bool = True, seed: int = 0, format_coef: float = 0.1) -> None:
        self.batch_size = batch_size
        self.group_size = group_size
        self.renderer = renderer
        self.n_batches = n_batches
        self.max_operand = max_operand
        self.convo_prefix = list(FEWSHOT_PREFIX) if include_fewshot else []
        self.seed = seed
        self.format_coef = format_coef

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.n_batches:
            raise IndexError(f"batch index {index} is outside [0, {self.n_batches})")
        rng = random.Random(f"{self.seed}-{index}")
        return [
            problem_group(ArithmeticEnv, self.group_size, "arithmetic", x=rng.randint(0, self.max_operand),
                          y=rng.randint(0, self.max_operand), renderer=self.renderer, convo_prefix=self.convo_prefix,
                          format_coef=self.format_coef)
            for _ in range(self.batch_size)
        ]

    def __len__(self) -> int:
        return self.n_batches


@chz.chz
class ArithmeticDatasetBuilder(RLDatasetBuilder):
    """Train on random additions; with ``n_test_problems`` > 0 also a fixed test set (a different seed)."""

    batch_size: int
    """Problems per batch (each sampled ``group_size`` times)."""
    model_name_for_tokenizer: str
    """Whose tokenizer renders the prompts."""
    renderer_name: str
    """How prompts are rendered (``renderers.get_renderer``)."""
    n_batches: int
    """Batches in the dataset: the number of training iterations."""
    group_size: int
    """Samples per problem; rewards are centred within each group."""
    include_fewshot: bool = True
    """Start every prompt with one solved example."""
    max_operand: int = 100
    """Operands are drawn from 0..max_operand."""
    seed: int = 0
    """Problem seed: batch ``i`` is drawn from ``(seed, i)``."""
    n_test_problems: int = 0
    """Size of a fixed test set (0: none)."""
    test_group_size: int = 1
    """Samples per test problem."""
    format_coef: float = 0.1
    """Penalty for a reply cut off before its stop token: reward = correct - format_coef * cut_off."""

    @chz.validate
    def _check(self) -> None:
        for name in ("batch_size", "n_batches", "group_size", "test_group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.max_operand < 0:
            raise ValueError(f"max_operand={self.max_operand} must be >= 0")

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        from tinker_cookbook import renderers
        from tinker_cookbook.tokenizer_utils import get_tokenizer

        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name_for_tokenizer))
        train = ArithmeticDataset(self.batch_size, self.group_size, renderer, self.n_batches, self.max_operand,
                                  self.include_fewshot, self.seed, self.format_coef)
        test = None
        if self.n_test_problems > 0:
            test = ArithmeticDataset(self.n_test_problems, self.test_group_size, renderer, 1, self.max_operand,
                                     self.include_fewshot, seed=self.seed + 1_000_003, format_coef=self.format_coef)
        return train, test
