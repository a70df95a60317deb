"""Rollouts with scripted policies (no model): problem/arithmetic/math envs, multi-step envs, failure handling."""

import asyncio
import math

import pytest
from rl_helpers import FakeRenderer, ScriptedPolicy

from tinker_cookbook import tinker
from tinker_cookbook.exceptions import AllTrajectoriesFailedError
from tinker_cookbook.rl.arithmetic_env import ArithmeticDataset, ArithmeticEnv, last_integer
from tinker_cookbook.rl.math_env import (
    MathEnv,
    extract_boxed,
    generate_word_problems,
    grade_answer,
    gsm8k_final_answer,
)
from tinker_cookbook.rl.metric_util import compute_trajectory_metrics
from tinker_cookbook.rl.problem_env import problem_group
from tinker_cookbook.rl.rollouts import do_batch_rollouts, do_group_rollout
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, StepResult


def run(coro):
    return asyncio.run(coro)


def test_arithmetic_rewards_and_metrics():
    group = problem_group(ArithmeticEnv, 4, "arithmetic", x=3, y=4, renderer=FakeRenderer())
    policy = ScriptedPolicy(["7", "The answer is 8", "7", "seven"])
    traj_group = run(do_group_rollout(group, policy))
    assert traj_group.get_total_rewards() == [1.0, 0.0, 1.0, 0.0]
    metrics = compute_trajectory_metrics([traj_group], [group.logging_tags()])
    assert metrics["env/all/correct"] == 0.5
    assert metrics["env/all/format"] == 1.0
    assert metrics["env/all/reward/total"] == 0.5
    assert metrics["env/all/by_group/frac_mixed"] == 1.0
    assert metrics["env/all/ac_tokens_per_turn"] == (2 + 16 + 2 + 6) / 4
    assert "env/arithmetic/correct" not in metrics  # the tag selects the whole batch


def test_math_env_format_and_reward():
    env = MathEnv("What is 2 + 2?", "4", FakeRenderer())
    policy = ScriptedPolicy(["so \\boxed{4}", "4", "\\boxed{5}"])
    group = problem_group(MathEnv, 3, "gsm8k", problem="What is 2 + 2?", answer="4", renderer=FakeRenderer())
    rewards = run(do_group_rollout(group, policy)).get_total_rewards()
    # correct+formatted = 1; unboxed "4" is neither formatted nor graded correct = -0.1; boxed wrong = 0.
    assert rewards == pytest.approx([1.0, -0.1, 0.0])
    assert env.get_question().endswith("Write your answer in \\boxed{} format.")


def test_reply_without_stop_sequence_is_not_well_formed():
    class NoStop(ScriptedPolicy):
        async def __call__(self, model_input, stop, *, max_tokens=None):
            out = await super().__call__(model_input, stop)
            out.tokens, out.maybe_logprobs, out.stop_reason = out.tokens[:-1], out.maybe_logprobs[:-1], "length"
            return out

    group = problem_group(MathEnv, 1, "gsm8k", problem="q", answer="4", renderer=FakeRenderer())
    [traj] = run(do_group_rollout(group, NoStop(["\\boxed{4}"]))).trajectories_G
    assert traj.transitions[0].metrics == {"format": 0.0, "correct": 1.0}
    assert traj.transitions[0].reward == pytest.approx(0.9)


def test_grading_helpers():
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("no box") is None and extract_boxed("\\boxed{open") is None
    assert grade_answer("$1,200.00", "1200") and grade_answer(" 7. ", "7") and not grade_answer("8", "7")
    assert gsm8k_final_answer("work\n#### 1,234") == "1234"
    assert last_integer("3 + 4 = 7.") == 7 and last_integer("none") is None and last_integer("-2") == -2


def test_offline_word_problems_are_deterministic_and_consistent():
    problems = generate_word_problems(50, seed=3)
    assert problems == generate_word_problems(50, seed=3)
    for p in problems:
        answer = int(gsm8k_final_answer(p.solution))
        assert answer >= 0 and f"= {answer}" in p.solution


def test_arithmetic_dataset_is_seeded_by_batch_index():
    ds = ArithmeticDataset(batch_size=3, group_size=2, renderer=FakeRenderer(), n_batches=5, max_operand=9)
    first = [b.env_thunk().get_question() for b in ds.get_batch(2)]
    again = [b.env_thunk().get_question() for b in ds.get_batch(2)]
    other = [b.env_thunk().get_question() for b in ds.get_batch(3)]
    assert first == again and first != other
    with pytest.raises(IndexError):
        ds.get_batch(5)


class CountdownEnv(Env):
    """A multi-step env: the observation grows by the action and one new token each turn; 3 turns."""

    def __init__(self, fail_at: int | None = None, reward: float = 1.0):
        self.turn = 0
        self.context = [5, 6]
        self.fail_at = fail_at
        self.reward = reward

    async def initial_observation(self):
        return tinker.ModelInput.from_ints(self.context), [0]

    async def step(self, action):
        self.turn += 1
        if self.turn == self.fail_at:
            raise RuntimeError("env exploded")
        self.context = self.context + list(action) + [7]
        done = self.turn == 3
        return StepResult(self.reward if done else 0.0, done, tinker.ModelInput.from_ints(self.context), [0],
                          metrics={"turn_metric": float(self.turn)})


class CountdownGroup(EnvGroupBuilder):
    def __init__(self, n=2, **env_kwargs):
        self.n, self.env_kwargs = n, env_kwargs

    async def make_envs(self):
        return [CountdownEnv(**self.env_kwargs) for _ in range(self.n)]

    def logging_tags(self):
        return ["countdown"]


def test_multi_step_rollout():
    group = run(do_group_rollout(CountdownGroup(), ScriptedPolicy(["a"])))
    traj = group.trajectories_G[0]
    assert len(traj.transitions) == 3 and traj.transitions[-1].episode_done
    assert traj.transitions[1].ob.to_ints() == [5, 6, ord("a"), 0, 7]
    assert group.get_total_rewards() == [1.0, 1.0]
    metrics = compute_trajectory_metrics([group], [["countdown"]])
    assert metrics["env/all/turns_per_episode"] == 3.0 and metrics["env/all/turn_metric"] == 2.0


def test_failing_env_raises_by_default_and_is_skipped_when_tolerated():
    builders = [CountdownGroup(), CountdownGroup(fail_at=2), CountdownGroup()]
    with pytest.raises(RuntimeError, match="env exploded"):
        run(do_batch_rollouts(builders, ScriptedPolicy(["a"])))
    result = run(do_batch_rollouts(builders, ScriptedPolicy(["a"]), skip_failed_groups=True))
    assert len(result.groups_P) == 2 and result.num_failed_groups == 1
    assert result.metrics == {"rollout/failed_groups": 1.0}
    with pytest.raises(AllTrajectoriesFailedError):
        run(do_batch_rollouts([CountdownGroup(fail_at=1)], ScriptedPolicy(["a"]), skip_failed_groups=True))


@pytest.mark.parametrize("bad", [math.nan, math.inf, "x"])
def test_non_finite_reward_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="CountdownEnv.step returned reward"):
        run(do_batch_rollouts([CountdownGroup(reward=bad)], ScriptedPolicy(["a"])))


@pytest.mark.parametrize("stop", ["\n", [""], [1, "x"], [-1]])
def test_bad_stop_condition_is_a_clear_error(stop):
    class BadStop(CountdownEnv):
        async def initial_observation(self):
            return tinker.ModelInput.from_ints([1]), stop

    class Builder(CountdownGroup):
        async def make_envs(self):
            return [BadStop()]

    with pytest.raises((TypeError, ValueError), match="BadStop stop condition"):
        run(do_batch_rollouts([Builder()], ScriptedPolicy(["a"])))


def test_dataset_shorter_than_batch_size_is_a_clear_error():
    from tinker_cookbook.rl.math_env import MathDataset

    with pytest.raises(ValueError, match="fewer than batch_size=8"):
        MathDataset(generate_word_problems(5, seed=0), batch_size=8, group_size=2, renderer=FakeRenderer(),
                    convo_prefix=None)


def test_arithmetic_format_coef_zero_makes_reward_equal_correct():
    group = problem_group(ArithmeticEnv, 1, "arithmetic", x=1, y=1, renderer=FakeRenderer(), format_coef=0.0)

    class Cut(ScriptedPolicy):
        async def __call__(self, model_input, stop, *, max_tokens=None):
            out = await super().__call__(model_input, stop)
            out.tokens, out.maybe_logprobs = out.tokens[:-1], out.maybe_logprobs[:-1]
            return out

    [traj] = run(do_group_rollout(group, Cut(["2"]))).trajectories_G
    assert traj.transitions[0].reward == 1.0 and traj.transitions[0].metrics["format"] == 0.0
