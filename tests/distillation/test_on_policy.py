"""On-policy distillation's advantage term, against hand computations, and its routing to each dataset's teacher."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tinker_cookbook import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.distillation.datasets import CompositeDataset, TeacherConfig, TeacherGroupBuilder
from tinker_cookbook.distillation.train_on_policy import (
    TeacherKLShaper,
    TeacherKLShaperBuilder,
    teacher_kl_advantages,
)
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.rl.data_processing import DatumSource
from tinker_cookbook.rl.train_step import TrainSettings, prepare_data
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, Trajectory, TrajectoryGroup, Transition

# float32 advantages (the datum's dtype) of values of a few units: 1e-6 is far below any term and above rounding.
TOL = 1e-6


def test_advantage_is_minus_coef_times_reverse_kl_on_sampled_tokens():
    sampled = np.array([0.0, -1.0, -2.0, -0.5])
    teacher = np.array([-3.0, -1.5, -1.0, -1.0])
    mask = np.array([0.0, 1.0, 1.0, 1.0])  # position 0 is a prompt token
    term, reverse_kl = teacher_kl_advantages(sampled, teacher, mask, kl_penalty_coef=2.0, kl_discount_factor=0.0)
    # reverse KL per sampled token: (-1 + 1.5, -2 + 1, -0.5 + 1) = (0.5, -1, 0.5); term = -2 * that.
    assert reverse_kl.tolist() == [0.0, 0.5, -1.0, 0.5]
    assert term.tolist() == [0.0, -1.0, 2.0, -1.0]


def test_discount_sums_later_terms_and_keeps_prompt_tokens_at_zero():
    sampled = np.array([0.0, -1.0, -2.0, -0.5])
    teacher = np.array([-3.0, -1.5, -1.0, -1.0])
    mask = np.array([0.0, 1.0, 1.0, 1.0])
    term, _ = teacher_kl_advantages(sampled, teacher, mask, kl_penalty_coef=2.0, kl_discount_factor=0.5)
    # Undiscounted terms (0, -1, 2, -1); A_3 = -1, A_2 = 2 + 0.5·(-1) = 1.5, A_1 = -1 + 0.5·1.5 = -0.25,
    # A_0 would be 0.5·(-0.25) but is a prompt token: 0.
    assert term.tolist() == pytest.approx([0.0, -0.25, 1.5, -1.0], abs=1e-12)


class _Builder(EnvGroupBuilder):
    async def make_envs(self) -> list[Env]:
        return []


class _Teacher:
    """A teacher's sampling client: logprob ``value`` for every token; counts the requests in flight."""

    def __init__(self, value: float, expected: int) -> None:
        self.value = value
        self.expected = expected
        self.started = 0
        self.all_started = asyncio.Event()

    async def compute_logprobs_async(self, model_input: tinker.ModelInput) -> list[float | None]:
        self.started += 1
        if self.started == self.expected:
            self.all_started.set()
        # Every request waits until all of this teacher's requests have been sent: sent one after another, the
        # first would never return (the test's timeout fails it).
        await self.all_started.wait()
        return [None] + [self.value] * (model_input.length - 1)


class _Service:
    def __init__(self, clients: dict[str | None, _Teacher]) -> None:
        self.clients = clients
        self.made: list[str | None] = []

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None) -> _Teacher:
        self.made.append(model_path or base_model)
        return self.clients[model_path or base_model]


def _datum(prompt: list[int], action: list[int], logprobs: list[float], advantage: float) -> tinker.Datum:
    tokens = prompt + action
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={
        "target_tokens": tokens[1:], "logprobs": ([0.0] * len(prompt) + logprobs)[1:],
        "advantages": ([0.0] * len(prompt) + [advantage] * len(action))[1:],
        "mask": ([0.0] * len(prompt) + [1.0] * len(action))[1:]})


def test_shaper_asks_each_datums_own_teacher_concurrently_and_logs_teacher_kl():
    math_teacher = TeacherConfig(base_model="m", load_checkpoint_path="tinker://t/sampler_weights/final")
    chat_teacher = TeacherConfig(base_model="m")
    service = _Service({"tinker://t/sampler_weights/final": _Teacher(-1.0, expected=2), "m": _Teacher(-3.0, 1)})
    shaper = TeacherKLShaper(service, kl_penalty_coef=0.5, kl_discount_factor=0.0)  # type: ignore[arg-type]
    builders = [TeacherGroupBuilder(_Builder(), math_teacher, 0), TeacherGroupBuilder(_Builder(), chat_teacher, 1)]
    data = [_datum([1, 2], [3, 4], [-2.0, -2.0], advantage=0.25),   # group 0: teacher at -1
            _datum([1, 2], [5], [-1.0], advantage=0.0),              # group 0
            _datum([7], [8, 9], [-2.0, -1.0], advantage=0.0)]        # group 1: teacher at -3
    sources = [DatumSource(0, 0), DatumSource(0, 1), DatumSource(1, 0)]

    shaped, metrics = asyncio.run(asyncio.wait_for(shaper(data, sources, builders), timeout=10))

    # Datum 0: reverse KL per sampled token = -2 - (-1) = -1, term = -0.5·-1 = +0.5 on top of the advantage 0.25.
    assert shaped[0].loss_fn_inputs["advantages"].to_numpy().tolist() == pytest.approx([0.0, 0.75, 0.75], abs=TOL)
    # Datum 1: reverse KL 0, term 0. Datum 2: reverse KL (1, 2), term (-0.5, -1).
    assert shaped[1].loss_fn_inputs["advantages"].to_numpy().tolist() == pytest.approx([0.0, 0.0], abs=TOL)
    assert shaped[2].loss_fn_inputs["advantages"].to_numpy().tolist() == pytest.approx([-0.5, -1.0], abs=TOL)
    # teacher_kl: token-weighted mean over all 5 sampled tokens: (-1 - 1 + 0 + 1 + 2) / 5; per dataset: -2/3, 3/2.
    assert metrics == pytest.approx({"teacher_kl": 0.2, "teacher_kl/dataset_0": -2 / 3, "teacher_kl/dataset_1": 1.5})
    assert sorted(service.made) == ["m", "tinker://t/sampler_weights/final"]  # one client per teacher


def test_shaper_refuses_groups_without_a_teacher():
    shaper = TeacherKLShaper(_Service({}), 1.0, 0.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="CompositeDatasetBuilder"):
        asyncio.run(shaper([_datum([1], [2], [-1.0], 0.0)], [DatumSource(0, 0)], [_Builder()]))


def test_shaper_builder_checks_its_settings():
    with pytest.raises(ConfigurationError, match="kl_discount_factor=1.0"):
        TeacherKLShaperBuilder(kl_discount_factor=1.0)
    with pytest.raises(ConfigurationError, match="kl_penalty_coef=0"):
        TeacherKLShaperBuilder(kl_penalty_coef=0)


def _group(reward: float) -> TrajectoryGroup:
    transition = Transition(ob=tinker.ModelInput.from_ints([1, 2]), ac=TokensWithLogprobs([3], [-0.5]),
                            reward=reward, episode_done=True)
    return TrajectoryGroup([Trajectory([transition], tinker.ModelInput.empty())], [0.0], [{}])


def test_prepare_data_hands_the_shaper_the_builders_of_the_groups_it_kept():
    seen: list[tuple[list[DatumSource], list[EnvGroupBuilder]]] = []

    async def shaper(data_D, sources_D, builders_P):
        seen.append((sources_D, list(builders_P)))
        return data_D, {"shaped": 1.0}

    # Groups of one trajectory have constant rewards: with removal on, nothing is left and the shaper is not called.
    groups, builders = [_group(0.0), _group(1.0)], [_Builder(), _Builder()]
    settings = TrainSettings(1e-4, "importance_sampling", None, False, 0.0, 0.0)
    data, metrics = asyncio.run(prepare_data(groups, settings, None, builders, shaper))
    assert len(data) == 2 and metrics["shaped"] == 1.0
    assert seen[0][0] == [DatumSource(0, 0), DatumSource(1, 0)] and seen[0][1] == builders
    removing = TrainSettings(1e-4, "importance_sampling", None, True, 0.0, 0.0)
    data, _ = asyncio.run(prepare_data(groups, removing, None, builders, shaper))
    assert data == [] and len(seen) == 1


class _Batches(RLDataset):
    def __init__(self, n_batches: int, per_batch: int) -> None:
        self.n, self.per_batch = n_batches, per_batch

    def __len__(self) -> int:
        return self.n

    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        return [_Builder() for _ in range(self.per_batch)]


def test_composite_batches_tag_each_group_with_its_datasets_teacher():
    a, b = TeacherConfig(base_model="a"), TeacherConfig(base_model="b")
    composite = CompositeDataset([_Batches(3, 2), _Batches(5, 1)], [a, b])
    assert len(composite) == 3  # the shortest dataset
    batch = composite.get_batch(0)
    assert [(g.teacher, g.dataset_index) for g in batch] == [(a, 0), (a, 0), (b, 1)]  # type: ignore[attr-defined]
