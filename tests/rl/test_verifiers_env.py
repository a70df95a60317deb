"""The verifiers adapter with scripted policies (no model): requests become observations, sampled tokens become
the environment's chat completions, and the environment's rubric gives the rewards."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

vf = pytest.importorskip("verifiers")

from datasets import Dataset  # noqa: E402

from recipes.verifiers_rl.example_env import correct_sum, load_environment  # noqa: E402
from tinker_cookbook import tinker  # noqa: E402
from tinker_cookbook.completers import StopCondition, TokenCompleter, TokensWithLogprobs  # noqa: E402
from tinker_cookbook.rl.rollouts import do_group_rollout  # noqa: E402
from tinker_cookbook.rl.verifiers_env import (  # noqa: E402
    VerifiersEnvGroupBuilder,
    VerifiersRLDatasetBuilder,
    rollout_inputs,
)

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"  # only its (packaged) tokenizer is used here



def run(coro):
    return asyncio.run(coro)



class Replies(TokenCompleter):
    """Replies with fixed texts in turn (ending in the stop token) and records the prompts it was shown."""

    def __init__(self, renderer, replies: Sequence[str]) -> None:
        self.renderer, self.replies, self.prompts = renderer, list(replies), []

    async def __call__(self, model_input: tinker.ModelInput, stop: StopCondition, *,
                       max_tokens: int | None = None) -> TokensWithLogprobs:
        self.prompts.append(self.renderer.tokenizer.decode(model_input.to_ints()))
        tokens = self.renderer.tokenizer.encode(self.replies.pop(0), add_special_tokens=False)
        tokens.append(self.renderer.get_stop_sequences()[0])
        return TokensWithLogprobs(tokens, [-0.5] * len(tokens), "stop")


def test_single_turn_rollouts_are_scored_by_the_rubric(chatml):
    env = load_environment(num_train=4, num_eval=2, seed=0)
    row = rollout_inputs(env.get_dataset())[0]
    answer = row["answer"]
    policy = Replies(chatml, [answer, "no idea"])
    group = run(do_group_rollout(VerifiersEnvGroupBuilder(env, row, chatml, group_size=2), policy))
    assert group.get_total_rewards() == [1.0, 0.0]
    assert [m["correct_sum"] for m in group.metrics_G] == [1.0, 0.0]
    # The policy saw the environment's system prompt and question, rendered by its own renderer.
    assert "Answer with the number only." in policy.prompts[0] and row["prompt"][-1]["content"] in policy.prompts[0]


class Countdown(vf.MultiTurnEnv):
    """Two turns: the env answers the first reply with "Now say done.", and the rubric checks the last reply."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "Now say done."}]


def _said_done(completion, **kwargs) -> float:
    return float("done" in completion[-1]["content"].lower())


def test_multi_turn_rollouts_pass_env_responses_both_ways(chatml):
    dataset = Dataset.from_list([{"question": "Say hello.", "answer": ""}])
    env = Countdown(dataset=dataset, rubric=vf.Rubric(funcs=[_said_done]), max_turns=2)
    policy = Replies(chatml, ["hello", "done"])
    group = run(do_group_rollout(VerifiersEnvGroupBuilder(env, rollout_inputs(env.get_dataset())[0], chatml, 1),
                                 policy))
    traj = group.trajectories_G[0]
    assert len(traj.transitions) == 2 and [t.episode_done for t in traj.transitions] == [False, True]
    assert "Now say done." in policy.prompts[1] and "hello" in policy.prompts[1]
    assert group.get_total_rewards() == [1.0]


def test_the_dataset_builder_loads_an_env_by_module_function(chatml):
    builder = VerifiersRLDatasetBuilder(vf_env_id="recipes.verifiers_rl.example_env:load_environment",
                                        vf_env_args={"num_train": 6, "num_eval": 3}, model_name_for_tokenizer=SMOLLM2,
                                        batch_size=4, group_size=2)
    train, test = run(builder())
    assert len(train) == 2 and len(train.get_batch(1)) == 2 and test is not None and len(test.get_batch(0)) == 3
    assert correct_sum([{"role": "assistant", "content": "It is 12"}], "12") == 1.0
