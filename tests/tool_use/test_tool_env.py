"""``ToolUseEnv`` driven by scripted replies through the token ``Env`` (chatml_tools on SmolLM2's tokenizer): tool
results fed back, limits, malformed and bad calls, prefills, stop reasons in the transcripts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from tinker_cookbook import tinker
from tinker_cookbook.completers import StopCondition, TokenCompleter, TokensWithLogprobs
from tinker_cookbook.renderers import Renderer, renderer_for
from tinker_cookbook.rl.data_processing import trajectory_to_data
from tinker_cookbook.rl.multiturn.message_env import EnvFromMessageEnv
from tinker_cookbook.rl.rollouts import do_group_rollout
from tinker_cookbook.rl.transcripts import write_transcript
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, Trajectory
from tinker_cookbook.tool_use import ToolRegistry, ToolUseEnv, tool

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'
SEARCH = CALL.format(name="search", args='{"query": "Quarrowby"}')


@tool
def search(query: str) -> str:
    """Search the notes."""
    if query == "crash":
        raise RuntimeError("index offline")
    return "Quarrowby was founded by Ilsa Thorne."


@pytest.fixture(scope="module")
def renderer() -> Renderer:
    return renderer_for(SMOLLM2, "chatml_tools")


class Replies(TokenCompleter):
    """Answers each prompt with the next scripted text (then ``<|im_end|>``); records the prompts."""

    def __init__(self, renderer: Renderer, replies: Sequence[str]) -> None:
        self.renderer, self.replies = renderer, list(replies)
        self.prompts: list[list[int]] = []

    async def __call__(self, model_input: tinker.ModelInput, stop: StopCondition, *,
                       max_tokens: int | None = None) -> TokensWithLogprobs:
        self.prompts.append(model_input.to_ints())
        tokens = self.renderer.encode(self.replies[len(self.prompts) - 1] + "<|im_end|>")
        return TokensWithLogprobs(tokens, [-1.0] * len(tokens))


def _env(renderer: Renderer, **kwargs: Any) -> ToolUseEnv:
    prompt = renderer.create_conversation_prefix_with_tools([search.spec()], "Answer briefly.")
    prompt.append({"role": "user", "content": "Who founded Quarrowby?"})
    return ToolUseEnv(prompt, ToolRegistry([search]), lambda answer: "ilsa thorne" in answer.lower(), **kwargs)


class _Group(EnvGroupBuilder):
    def __init__(self, renderer: Renderer, env: ToolUseEnv) -> None:
        self.renderer, self.env = renderer, env

    async def make_envs(self) -> Sequence[Env]:
        return [EnvFromMessageEnv(self.renderer, self.env)]


def _play(renderer: Renderer, env: ToolUseEnv, replies: Sequence[str]) -> tuple[Trajectory, Replies]:
    policy = Replies(renderer, replies)
    group = asyncio.run(do_group_rollout(_Group(renderer, env), policy))
    return group.trajectories_G[0], policy


def _decode(renderer: Renderer, tokens: Sequence[int]) -> str:
    return renderer.decode(tokens)


def test_search_then_answer(renderer: Renderer) -> None:
    traj, policy = _play(renderer, _env(renderer), [f"Let me look.\n{SEARCH}", "Ilsa Thorne."])
    first, last = traj.transitions
    assert [t.reward for t in traj.transitions] == [0.0, 1.0]
    assert first.logs["tool_calls"] == 'search({"query": "Quarrowby"})'
    assert first.logs["tool_results"] == "Quarrowby was founded by Ilsa Thorne."
    assert last.logs["episode_end"] == "answered" and last.logs["answer"] == "Ilsa Thorne."
    assert "<tool_response>\nQuarrowby was founded by Ilsa Thorne.\n</tool_response>" in _decode(renderer,
                                                                                             policy.prompts[1])
    assert last.metrics["episode/success"] == 1.0 and last.metrics["episode/success_with_tool"] == 1.0
    assert "episode/success_without_tool" not in last.metrics
    assert last.metrics["episode/tool_calls"] == 1 and last.metrics["episode/stop/answered"] == 1.0
    assert last.metrics["episode/stop/max_turns"] == 0.0
    # Each observation extends the last one with the sampled tokens, so the episode trains as one datum.
    assert policy.prompts[1][: len(policy.prompts[0])] == policy.prompts[0]
    assert len(trajectory_to_data(traj, 0.5)) == 1


def test_answer_without_tool(renderer: Renderer) -> None:
    traj, _ = _play(renderer, _env(renderer), ["Ilsa Thorne, I think."])
    (only,) = traj.transitions
    assert only.reward == 1.0 and only.metrics["episode/success_without_tool"] == 1.0
    assert only.metrics["episode/tool_calls"] == 0 and "episode/success_with_tool" not in only.metrics


@pytest.mark.parametrize(("bad_call", "error"), [
    (CALL.format(name="lookup", args='{"query": "x"}'), "Error: unknown tool 'lookup'; the tools are ['search']"),
    (CALL.format(name="search", args='{"q": "x"}'),
     "Error: bad arguments for search:\nunknown argument 'q'; search takes ['query']\n"
     "missing required argument 'query'"),
])
def test_unknown_tool_and_bad_arguments_cost_a_penalty_and_the_episode_goes_on(
        renderer: Renderer, bad_call: str, error: str) -> None:
    traj, policy = _play(renderer, _env(renderer, format_penalty=0.25), [bad_call, SEARCH, "Ilsa Thorne"])
    assert [t.reward for t in traj.transitions] == [-0.25, 0.0, 1.0]
    assert traj.transitions[0].logs["tool_results"] == error
    assert f"<tool_response>\n{error}\n</tool_response>" in _decode(renderer, policy.prompts[1])
    metrics = traj.transitions[-1].metrics
    assert metrics["episode/format_errors"] == 1 and metrics["episode/tool_errors"] == 1
    assert metrics["episode/tool_calls"] == 2 and metrics["episode/success_with_tool"] == 1.0


def test_tool_exception_is_reported_without_penalty(renderer: Renderer) -> None:
    crash = CALL.format(name="search", args='{"query": "crash"}')
    traj, _ = _play(renderer, _env(renderer), [crash, "No idea."])
    assert [t.reward for t in traj.transitions] == [0.0, 0.0]
    assert traj.transitions[0].logs["tool_results"] == "Error: search failed: RuntimeError: index offline"
    metrics = traj.transitions[-1].metrics
    assert metrics["episode/format_errors"] == 0 and metrics["episode/tool_errors"] == 1
    assert metrics["episode/success_without_tool"] == 0.0  # no tool result was read


def test_malformed_call_gets_a_notice(renderer: Renderer) -> None:
    broken = '<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call>'
    traj, policy = _play(renderer, _env(renderer), [broken, "Ilsa Thorne"])
    assert [t.reward for t in traj.transitions] == [-0.1, 1.0]
    assert str(traj.transitions[0].logs["malformed_calls"]).startswith("invalid JSON")
    assert "Your tool call could not be read (invalid JSON" in _decode(renderer, policy.prompts[1])


def test_a_reply_that_never_stops_calling_ends_at_the_call_limit(renderer: Renderer) -> None:
    traj, _ = _play(renderer, _env(renderer, max_turns=10, max_tool_calls=2), [SEARCH, SEARCH, SEARCH])
    assert len(traj.transitions) == 3
    assert traj.transitions[-1].logs["episode_end"] == "max_tool_calls"
    metrics = traj.transitions[-1].metrics
    assert metrics["episode/stop/max_tool_calls"] == 1.0 and metrics["episode/tool_calls"] == 2
    assert metrics["episode/success"] == 0.0


def test_calls_beyond_the_budget_are_not_run(renderer: Renderer) -> None:
    traj, policy = _play(renderer, _env(renderer, max_tool_calls=1), [f"{SEARCH}\n{SEARCH}", "Ilsa Thorne"])
    assert traj.transitions[0].logs["calls_not_run"] == 1
    assert "Not run: the limit of 1 tool calls is reached" in _decode(renderer, policy.prompts[1])
    assert traj.transitions[-1].metrics["episode/tool_calls"] == 1


def test_turn_limit_ends_the_episode(renderer: Renderer) -> None:
    traj, _ = _play(renderer, _env(renderer, max_turns=2, max_tool_calls=5), [SEARCH, SEARCH])
    assert traj.transitions[-1].logs["episode_end"] == "max_turns"
    assert traj.transitions[-1].metrics["episode/stop/max_turns"] == 1.0


def test_prefilled_first_call(renderer: Renderer) -> None:
    prefill = renderer.tool_call_prefix("search") + '{"query": "'
    env = _env(renderer, first_reply_prefill=prefill)
    traj, policy = _play(renderer, env, ['Quarrowby"}}\n</tool_call>', "Ilsa Thorne"])
    assert _decode(renderer, policy.prompts[0]).endswith('<|im_start|>assistant\n' + prefill)
    assert traj.transitions[0].logs["tool_calls"] == 'search({"query": "Quarrowby"})'
    assert not _decode(renderer, policy.prompts[1]).endswith(prefill)  # only the first reply is prefilled
    assert traj.transitions[-1].reward == 1.0


def test_stop_reasons_reach_the_html_transcript(renderer: Renderer, tmp_path) -> None:
    policy = Replies(renderer, [SEARCH, SEARCH])
    env = _env(renderer, max_turns=2)
    group = asyncio.run(do_group_rollout(_Group(renderer, env), policy))
    builder = _Group(renderer, env)
    page = write_transcript(tmp_path / "train.html", "tools", [group], [builder], renderer.tokenizer, 1)
    assert page is not None
    html = page.read_text()
    assert "episode_end" in html and "max_turns" in html and "tool_results" in html
