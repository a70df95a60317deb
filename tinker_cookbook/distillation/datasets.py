"""Datasets of on-policy distillation: prompts the student answers, each dataset with the teacher that grades it.

- ``PROMPT_SETS``: named prompt sets (conversations that end in a user turn). ``contact_cards`` (the sl_basic
  task's training prompts; its 48 held-out conversations are left out) and ``instructions`` (short instructions of
  ``example-data/preferences``) work offline; ``deepmath`` and ``tulu3`` need the Hugging Face hub or its cache.
- ``PromptOnlyDatasetBuilder``: an RL dataset of a prompt set whose envs give no reward (the teacher is the only
  signal).
- ``DistillationDatasetConfig`` / ``CompositeDatasetBuilder``: one or more datasets, each carrying its teacher;
  a batch holds ``groups_per_batch`` groups of each, and every group builder is wrapped in a ``TeacherGroupBuilder``
  that tells ``train_on_policy.TeacherKLShaper`` which teacher grades it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import chz
import numpy as np

from tinker_cookbook import renderers, tinker
from tinker_cookbook.base.example_data import example_data_path
from tinker_cookbook.completers import StopCondition
from tinker_cookbook.exceptions import ConfigurationError, DataError
from tinker_cookbook.rl.problem_env import message_text
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
from tinker_cookbook.tokenizer_utils import get_tokenizer

Conversation = list[renderers.Message]

CONTACT_CARDS_TEST_SIZE = 48
"""The conversations ``recipes.sl_basic`` holds out (its ``test_size``, shuffle seed 0): never used as prompts."""


# ---------------------------------------------------------------------------------------------------------
# Prompt sets
# ---------------------------------------------------------------------------------------------------------


def prompt_of(messages: Sequence[renderers.Message]) -> Conversation:
    """The conversation up to its last user turn (what the student is asked to continue)."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise DataError(f"a conversation of roles {[m['role'] for m in messages]} has no user turn to prompt with")
    return list(messages[: users[-1] + 1])


def contact_card_split() -> tuple[list[Conversation], list[Conversation]]:
    """(train, held-out) conversations of ``example-data/conversations.jsonl``, split as ``recipes.sl_basic`` does:
    a permutation with seed 0, the first 48 held out."""
    lines = [line for line in example_data_path("conversations.jsonl").read_text().splitlines() if line.strip()]
    rows: list[Conversation] = [json.loads(line)["messages"] for line in lines]
    order = np.random.default_rng(0).permutation(len(rows))
    shuffled = [rows[i] for i in order]
    return shuffled[CONTACT_CARDS_TEST_SIZE:], shuffled[:CONTACT_CARDS_TEST_SIZE]


def _contact_cards() -> list[Conversation]:
    return [prompt_of(c) for c in contact_card_split()[0]]


def _instructions() -> list[Conversation]:
    rows = [json.loads(line) for line in example_data_path("preferences", "train.jsonl").read_text().splitlines()
            if line.strip()]
    return [[{"role": "user", "content": row["prompt"]}] for row in rows]


_HUB_INSTEAD = "Use dataset=contact_cards or dataset=instructions (offline prompt sets)"


def _deepmath() -> list[Conversation]:
    from tinker_cookbook.supervised.chat_datasets import load_hub_dataset

    rows = load_hub_dataset("zwhe99/DeepMath-103K", "train", instead=_HUB_INSTEAD)
    return [[{"role": "user", "content": row["question"]}] for row in rows]


def _tulu3() -> list[Conversation]:
    from tinker_cookbook.supervised.chat_datasets import load_hub_dataset

    rows = load_hub_dataset("allenai/tulu-3-sft-mixture", "train", instead=_HUB_INSTEAD)
    prompts: list[Conversation] = []
    for row in rows:
        first_user = next((m["content"] for m in row["messages"] if m["role"] == "user"), None)
        if first_user:
            prompts.append([{"role": "user", "content": first_user}])
    return prompts


PROMPT_SETS: dict[str, Callable[[], list[Conversation]]] = {
    "contact_cards": _contact_cards,
    "instructions": _instructions,
    "deepmath": _deepmath,
    "tulu3": _tulu3,
}
"""Prompt set name -> its training prompts (conversations ending in a user turn)."""


def load_prompts(name: str) -> list[Conversation]:
    """The prompts of ``PROMPT_SETS[name]``; an unknown name is a ConfigurationError listing the known ones."""
    if name not in PROMPT_SETS:
        raise ConfigurationError(f"dataset={name!r} is not a prompt set; use one of {list(PROMPT_SETS)}")
    return PROMPT_SETS[name]()


# ---------------------------------------------------------------------------------------------------------
# Prompt-only RL dataset
# ---------------------------------------------------------------------------------------------------------


class PromptOnlyEnv(Env):
    """One reply to a conversation, reward 0: in distillation the teacher's per-token term is the only signal."""

    def __init__(self, messages: Conversation, renderer: renderers.Renderer) -> None:
        self.messages = messages
        self.renderer = renderer

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        return self.renderer.build_generation_prompt(self.messages), self.renderer.get_stop_sequences()

    async def step(self, action: Action) -> StepResult:
        message, _ = self.renderer.parse_response(action)
        return StepResult(reward=0.0, episode_done=True, next_observation=tinker.ModelInput.empty(),
                          next_stop_condition=self.renderer.get_stop_sequences(),
                          logs={"prompt": message_text(self.messages[-1]), "response": message_text(message)})


@dataclass
class PromptGroupBuilder(EnvGroupBuilder):
    """``group_size`` replies to one prompt."""

    messages: Conversation
    renderer: renderers.Renderer
    group_size: int
    dataset_name: str

    async def make_envs(self) -> Sequence[Env]:
        return [PromptOnlyEnv(self.messages, self.renderer) for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return [self.dataset_name]


class PromptOnlyDataset(RLDataset):
    """Batches of ``batch_size`` prompts (in the given order), each rolled out ``group_size`` times."""

    def __init__(self, prompts: list[Conversation], batch_size: int, group_size: int, renderer: renderers.Renderer,
                 dataset_name: str) -> None:
        self.prompts = prompts
        self.batch_size = batch_size
        self.group_size = group_size
        self.renderer = renderer
        self.dataset_name = dataset_name

    def __len__(self) -> int:
        return math.ceil(len(self.prompts) / self.batch_size)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of a {len(self)}-batch prompt dataset")
        chunk = self.prompts[index * self.batch_size : (index + 1) * self.batch_size]
        return [PromptGroupBuilder(p, self.renderer, self.group_size, self.dataset_name) for p in chunk]


@chz.chz
class PromptOnlyDatasetBuilder(RLDatasetBuilder):
    """A prompt set of ``PROMPT_SETS`` (shuffled with ``seed``) as a reward-free RL dataset."""

    dataset_name: str
    """The prompt set: contact_cards, instructions (offline), deepmath, tulu3 (hub)."""
    groups_per_batch: int
    """Prompts per batch."""
    group_size: int
    """Student replies per prompt."""
    model_name_for_tokenizer: str
    """The student model (its tokenizer renders the prompts)."""
    renderer_name: str
    """The student's renderer."""
    max_prompts: int | None = None
    """Use only the first this many prompts after shuffling (None: all)."""
    seed: int = 0
    """Seed of the prompts' shuffle."""

    @chz.validate
    def _check(self) -> None:
        if self.groups_per_batch < 1 or self.group_size < 1:
            raise ConfigurationError(f"groups_per_batch={self.groups_per_batch} and group_size={self.group_size} "
                                     "must be at least 1")

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        prompts = load_prompts(self.dataset_name)
        order = np.random.default_rng(self.seed).permutation(len(prompts))
        prompts = [prompts[i] for i in order][: self.max_prompts]
        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name_for_tokenizer),
                                          model_name=self.model_name_for_tokenizer)
        return PromptOnlyDataset(prompts, self.groups_per_batch, self.group_size, renderer, self.dataset_name), None


# ---------------------------------------------------------------------------------------------------------
# Datasets with their teachers
# ---------------------------------------------------------------------------------------------------------


@chz.chz
class TeacherConfig:
    """The teacher: a base model, or a ``sampler_weights/`` checkpoint trained on it."""

    base_model: str
    """The teacher's base model; it must share the student's tokenizer (its logprobs are of the student's tokens)."""
    load_checkpoint_path: str | None = None
    """A ``tinker://.../sampler_weights/...`` checkpoint of ``base_model`` (None: the base weights)."""

    def sampling_client(self, service_client: tinker.ServiceClient) -> tinker.SamplingClient:
        if self.load_checkpoint_path is not None:
            return service_client.create_sampling_client(model_path=self.load_checkpoint_path)
        return service_client.create_sampling_client(base_model=self.base_model)


@chz.chz
class DistillationDatasetConfig:
    """One dataset of a distillation run and the teacher that grades the student's replies to it."""

    dataset_builder: RLDatasetBuilder
    """The dataset (its batch size is its groups per batch)."""
    teacher_config: TeacherConfig
    """The teacher of this dataset."""


@dataclass
class TeacherGroupBuilder(EnvGroupBuilder):
    """A group builder of dataset ``dataset_index``, tagged with that dataset's teacher."""

    inner: EnvGroupBuilder
    teacher: TeacherConfig
    dataset_index: int

    async def make_envs(self) -> Sequence[Env]:
        return await self.inner.make_envs()

    async def compute_group_rewards(self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
                                    ) -> list[tuple[float, Metrics]]:
        return await self.inner.compute_group_rewards(trajectory_group, env_group)

    def logging_tags(self) -> list[str]:
        return self.inner.logging_tags()


class CompositeDataset(RLDataset):
    """Batch ``i`` = batch ``i`` of every dataset, each group tagged with its dataset's teacher and index; as many
    batches as the shortest dataset has."""

    def __init__(self, datasets: list[RLDataset], teachers: list[TeacherConfig], indices: list[int] | None = None
                 ) -> None:
        self.datasets = datasets
        self.teachers = teachers
        self.indices = indices if indices is not None else list(range(len(datasets)))

    def __len__(self) -> int:
        return min(len(d) for d in self.datasets)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [TeacherGroupBuilder(builder, teacher, k)
                for dataset, teacher, k in zip(self.datasets, self.teachers, self.indices, strict=True)
                for builder in dataset.get_batch(index)]


@chz.chz
class CompositeDatasetBuilder(RLDatasetBuilder):
    """The datasets of a distillation run, each with its teacher (``teacher_kl/dataset_<k>`` is dataset k's).

    The test sets of those datasets that have one are combined the same way (evaluated by the loop's test-set
    evaluator, without the teacher).
    """

    dataset_configs: list[DistillationDatasetConfig]
    """One entry per dataset, in the order of their metrics' indices."""

    @chz.validate
    def _check(self) -> None:
        if not self.dataset_configs:
            raise ConfigurationError("dataset_configs is empty; give at least one dataset and its teacher")

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        built = [await c.dataset_builder() for c in self.dataset_configs]
        teachers = [c.teacher_config for c in self.dataset_configs]
        train = CompositeDataset([train for train, _ in built], teachers)
        with_test = [(test, teachers[k], k) for k, (_, test) in enumerate(built) if test is not None]
        if not with_test:
            return train, None
        return train, CompositeDataset([t for t, _, _ in with_test], [tc for _, tc, _ in with_test],
                                       [k for _, _, k in with_test])
