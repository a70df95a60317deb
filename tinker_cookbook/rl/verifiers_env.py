"""Train on environments written for the ``verifiers`` library (``pip install 'verifiers==0.1.9.post3'``).

A ``verifiers`` environment (``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ...) drives its own rollout: it calls an
OpenAI-style client (``client.chat.completions.create``) whenever it wants the model's next message, and its rubric
scores the finished rollouts. The RL loop here works the other way round (an ``Env`` hands out observations and
receives sampled tokens), so ``VerifiersEnv`` runs the environment's ``rollout`` as a task and stands in for its
client (``BridgeClient``): each chat request becomes an observation (the messages rendered by the policy's
renderer), and the tokens the loop samples are parsed back into the chat completion the environment receives.
The episode ends when the rollout does; ``VerifiersEnvGroupBuilder.compute_group_rewards`` then scores the group
with the environment's rubric (``score_group``), and each rollout's reward is ``state["reward"]`` (its metrics are
kept).

Limits: chat environments only (``message_type="chat"``), text content, no tool calls.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from typing import Any

import chz

from tinker_cookbook import tinker
from tinker_cookbook.completers import StopCondition
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.renderers import Message, Renderer
from tinker_cookbook.rl.multiturn.message_env import renderer_for
from tinker_cookbook.rl.problem_env import message_text
from tinker_cookbook.rl.types import (
    Action,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    RLDataset,
    RLDatasetBuilder,
    StepResult,
    Trajectory,
)
from tinker_cookbook.utils import logtree

_DONE = object()  # put on a bridge's queue when the rollout has finished


def _verifiers() -> Any:
    try:
        import verifiers
    except ImportError as exc:
        raise ConfigurationError("the verifiers adapter needs the 'verifiers' package: "
                                 "pip install 'verifiers==0.1.9.post3' (the official cookbook's range; later releases need openai<3)") from exc
    return verifiers


class _Completions:
    def __init__(self, bridge: BridgeClient) -> None:
        self.bridge = bridge

    async def create(self, *, model: str, messages: list[dict[str, Any]], tools: Any = None, **kwargs: Any) -> Any:
        if tools:
            raise ConfigurationError("this verifiers environment offers tools; the adapter supports chat without tools")
        reply: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
        await self.bridge.requests.put((messages, reply))
        text, finish_reason = await reply
        from openai.types.chat import ChatCompletion

        return ChatCompletion.model_validate({
            "id": f"bridge-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "finish_reason": finish_reason,
                         "message": {"role": "assistant", "content": text}}],
        })


class _Chat:
    def __init__(self, bridge: BridgeClient) -> None:
        self.completions = _Completions(bridge)


class BridgeClient:
    """The stand-in for an ``AsyncOpenAI`` client: each chat request waits on ``requests`` for the loop's reply."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[Any] = asyncio.Queue()
        self.chat = _Chat(self)


def as_messages(openai_messages: Sequence[dict[str, Any]]) -> list[Message]:
    """OpenAI-style chat messages as the renderer's messages (text content only)."""
    out: list[Message] = []
    for m in openai_messages:
        content = m.get("content")
        if not isinstance(content, str):
            parts = content or []
            if any(isinstance(p, dict) and p.get("type") != "text" for p in parts):
                raise ConfigurationError("a verifiers message holds non-text content; the adapter supports text only")
            content = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
        out.append({"role": str(m["role"]), "content": content})
    return out


class VerifiersEnv(Env):
    """One rollout of a ``verifiers`` environment on one dataset row, driven by the RL loop's sampled tokens."""

    def __init__(self, vf_env: Any, rollout_input: dict[str, Any], renderer: Renderer) -> None:
        self.vf_env, self.rollout_input, self.renderer = vf_env, rollout_input, renderer
        self.bridge = BridgeClient()
        self.state: Any = None
        self._task: asyncio.Task[Any] | None = None
        self._reply: asyncio.Future[tuple[str, str]] | None = None

    async def _run(self) -> None:
        try:
            self.state = await self.vf_env.rollout(self.rollout_input, self.bridge, "policy", {})
        finally:
            await self.bridge.requests.put(_DONE)

    async def _next(self) -> Observation | None:
        """The next request's prompt, or None when the rollout has finished (its errors are raised here)."""
        item = await self.bridge.requests.get()
        if item is _DONE:
            assert self._task is not None
            await self._task  # re-raises what the rollout raised
            error = self.state.get("error") if self.state is not None else None
            if error is not None:
                raise RuntimeError(f"the verifiers rollout failed: {error!r}") from error
            return None
        messages, self._reply = item
        return self.renderer.build_generation_prompt(as_messages(messages))

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        self._task = asyncio.ensure_future(self._run())
        ob = await self._next()
        if ob is None:
            raise RuntimeError("the verifiers rollout finished without asking the model anything")
        return ob, self.renderer.get_stop_sequences()

    async def step(self, action: Action) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        text = message_text(message)
        assert self._reply is not None
        self._reply.set_result((text, "stop" if termination else "length"))
        logtree.log_text(f"policy: {text}")
        ob = await self._next()
        stop = self.renderer.get_stop_sequences()
        if ob is None:
            return StepResult(0.0, True, tinker.ModelInput.empty(), stop)
        return StepResult(0.0, False, ob, stop)


class VerifiersEnvGroupBuilder(EnvGroupBuilder):
    """``group_size`` rollouts of one dataset row, scored together by the environment's rubric."""

    def __init__(self, vf_env: Any, rollout_input: dict[str, Any], renderer: Renderer, group_size: int,
                 tag: str = "verifiers") -> None:
        self.vf_env, self.rollout_input, self.renderer = vf_env, rollout_input, renderer
        self.group_size, self.tag = group_size, tag

    async def make_envs(self) -> Sequence[Env]:
        return [VerifiersEnv(self.vf_env, dict(self.rollout_input), self.renderer) for _ in range(self.group_size)]

    async def compute_group_rewards(self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
                                    ) -> list[tuple[float, Metrics]]:
        states = [env.state for env in env_group if isinstance(env, VerifiersEnv)]
        if len(states) != len(trajectory_group) or any(s is None for s in states):
            raise RuntimeError("a verifiers rollout of this group has no final state")
        await self.vf_env.rubric.score_group(states, score_sem=asyncio.Semaphore(len(states)))
        out: list[tuple[float, Metrics]] = []
        for state in states:
            metrics = {k: float(v) for k, v in (state.get("metrics") or {}).items() if isinstance(v, (int, float))}
            out.append((float(state.get("reward") or 0.0), metrics))
        logtree.table_from_dict({f"rollout {i}": r for i, (r, _) in enumerate(out)}, caption="verifiers rubric")
        return out

    def logging_tags(self) -> list[str]:
        return [self.tag]


def load_vf_environment(vf_env_id: str, vf_env_args: dict[str, Any]) -> Any:
    """An installed environment module (``vf.load_environment(vf_env_id, **vf_env_args)``), or ``module:function``
    naming a function that returns the environment (e.g. the project's offline example)."""
    vf = _verifiers()
    if ":" in vf_env_id:
        import importlib

        module, _, function = vf_env_id.partition(":")
        return getattr(importlib.import_module(module), function)(**vf_env_args)
    return vf.load_environment(vf_env_id, **vf_env_args)


def rollout_inputs(dataset: Any) -> list[dict[str, Any]]:
    """The ``RolloutInput`` of each row of a formatted ``verifiers`` dataset (``prompt``, ``answer``, ...)."""
    keys = [k for k in ("prompt", "answer", "task", "info", "example_id") if k in dataset.column_names]
    return [{k: dataset[i][k] for k in keys} for i in range(len(dataset))]


class VerifiersRLDataset(RLDataset):
    """Batches of ``batch_size`` rows (the last may be shorter), each a group of ``group_size`` rollouts."""

    def __init__(self, vf_env: Any, inputs: Sequence[dict[str, Any]], renderer: Renderer, batch_size: int,
                 group_size: int, tag: str = "verifiers") -> None:
        if batch_size < 1 or group_size < 1 or not inputs:
            raise ConfigurationError(f"batch_size={batch_size}, group_size={group_size} and {len(inputs)} rows: "
                                     "need at least one of each")
        self.vf_env, self.inputs, self.renderer = vf_env, list(inputs), renderer
        self.batch_size, self.group_size, self.tag = batch_size, group_size, tag

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} is outside [0, {len(self)})")
        rows = self.inputs[index * self.batch_size : (index + 1) * self.batch_size]
        return [VerifiersEnvGroupBuilder(self.vf_env, row, self.renderer, self.group_size, self.tag) for row in rows]

    def __len__(self) -> int:
        return -(-len(self.inputs) // self.batch_size)


@chz.chz
class VerifiersRLDatasetBuilder(RLDatasetBuilder):
    """Train on a ``verifiers`` environment's dataset; test on its eval dataset when it has one.

    ``vf_env_id``: an installed environment module (``vf.load_environment(vf_env_id, **vf_env_args)``), or
    ``module:function`` naming a function that returns the environment (e.g. the project's offline example).
    """

    vf_env_id: str
    vf_env_args: dict[str, Any] = chz.field(default_factory=dict)
    model_name_for_tokenizer: str
    renderer_name: str | None = None
    """None: the model's recommended renderer."""
    batch_size: int = 4
    group_size: int = 4
    dataset_n: int = -1
    """Rows of the train dataset to use (-1: all)."""
    eval_n: int = -1
    dataset_seed: int | None = 0

    def load_env(self) -> Any:
        return load_vf_environment(self.vf_env_id, self.vf_env_args)

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        vf_env = self.load_env()
        if getattr(vf_env, "message_type", "chat") != "chat":
            raise ConfigurationError(f"{self.vf_env_id} is a '{vf_env.message_type}' environment; the adapter "
                                     "supports chat environments")
        renderer = renderer_for(self.model_name_for_tokenizer, self.renderer_name)
        train = VerifiersRLDataset(vf_env, rollout_inputs(vf_env.get_dataset(n=self.dataset_n, seed=self.dataset_seed)),
                                   renderer, self.batch_size, self.group_size)
        if getattr(vf_env, "eval_dataset", None) is None:
            return train, None
        test_inputs = rollout_inputs(vf_env.get_eval_dataset(n=self.eval_n, seed=self.dataset_seed))
        return train, VerifiersRLDataset(vf_env, test_inputs, renderer, len(test_inputs), 1)
