"""Hand-made trajectories and fake policies/renderers for RL unit tests (no model needed)."""

from __future__ import annotations

from collections.abc import Sequence

from tinker_cookbook import tinker
from tinker_cookbook.completers import StopCondition, TokenCompleter, TokensWithLogprobs
from tinker_cookbook.rl.types import Trajectory, TrajectoryGroup, Transition


def ob(*tokens: int) -> tinker.ModelInput:
    return tinker.ModelInput.from_ints(list(tokens))


def ac(tokens: Sequence[int], logprobs: Sequence[float]) -> TokensWithLogprobs:
    return TokensWithLogprobs(tokens=list(tokens), maybe_logprobs=list(logprobs))


def transition(observation: tinker.ModelInput, action: TokensWithLogprobs, reward: float = 0.0,
               done: bool = False, **metrics: float) -> Transition:
    return Transition(ob=observation, ac=action, reward=reward, episode_done=done, metrics=dict(metrics))


def single_turn_group(rewards: Sequence[float]) -> TrajectoryGroup:
    trajs = [Trajectory([transition(ob(1, 2), ac([3], [-0.5]), r, True)], ob()) for r in rewards]
    return TrajectoryGroup(trajs, [0.0] * len(rewards), [{} for _ in rewards])


class FakeRenderer:
    """Text 'renderer': tokens are character codes; the stop sequence is token 0 ("\\0")."""

    def build_generation_prompt(self, messages: list[dict]) -> tinker.ModelInput:
        text = "".join(f"{m['role']}:{m['content']}\n" for m in messages) + "assistant:"
        return tinker.ModelInput.from_ints([ord(c) for c in text])

    def get_stop_sequences(self) -> list[int]:
        return [0]

    def parse_response(self, tokens: list[int]) -> tuple[dict, bool]:
        if 0 in tokens:
            return {"role": "assistant", "content": "".join(chr(t) for t in tokens[: tokens.index(0)])}, True
        return {"role": "assistant", "content": "".join(chr(t) for t in tokens)}, False


class ScriptedPolicy(TokenCompleter):
    """Replies with fixed texts in turn (character tokens, ending in the stop token 0), logprob -1 per token."""

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies)
        self.calls = 0

    async def __call__(self, model_input: tinker.ModelInput, stop: StopCondition, *,
                       max_tokens: int | None = None) -> TokensWithLogprobs:
        text = self.replies[self.calls % len(self.replies)]
        self.calls += 1
        tokens = [ord(c) for c in text] + [0]
        return TokensWithLogprobs(tokens, [-1.0] * len(tokens))
