"""Multi-turn envs written in messages, and the adapter that runs them as token ``Env``s.

A game such as twenty questions is easiest to write in messages: the env shows a conversation, reads the player's
reply as text and answers with a new user message. ``MessageEnv`` is that interface; ``EnvFromMessageEnv`` turns
one into the token-level ``Env`` the RL loop rolls out, keeping two promises:

- Observations extend: turn k+1's observation starts with turn k's observation followed by the exact tokens the
  policy sampled (not a re-tokenization of their text, and also when the reply was cut off at the token limit),
  whenever the renderer has the extension property. ``rl.data_processing.trajectory_to_data`` then merges the
  whole episode into one datum, so training costs O(T) instead of O(T²) in the number of turns. With a renderer
  that rewrites history (e.g. strips reasoning) each turn is rendered from scratch and the turns become separate
  datums.
- Tool calls and prefills: the reply handed to ``MessageEnv.step`` keeps the tool calls the renderer parsed
  (``tool_calls`` / ``unparsed_tool_calls``), and ``MessageEnv.reply_prefill`` can start the next reply with fixed
  text (e.g. the opening of a tool call): the prefill is part of the observation (prompt, weight 0) and the reply
  is parsed from the prefill plus the sampled tokens.
- Per-episode metrics: the final step of an episode carries ``episode/turns``, ``episode/cut_off_replies`` and
  whatever the env's ``episode_metrics`` adds (success, format errors, ...). The loop averages each metric key over
  the steps that report it, so keys that only the final step reports are means over episodes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tinker_cookbook import tinker
from tinker_cookbook.completers import StopCondition
from tinker_cookbook.rl.problem_env import is_stop_sequence_termination, message_text
from tinker_cookbook.rl.types import Action, Env, Logs, Metrics, Observation, StepResult

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Message, Renderer


@dataclass
class MessageStepResult:
    """What a message env makes of one reply of the player."""

    reward: float
    episode_done: bool
    next_messages: list[Message] = field(default_factory=list)
    """Messages shown after the player's reply (usually one user message); ignored when ``episode_done``."""
    metrics: Metrics = field(default_factory=dict)
    logs: Logs = field(default_factory=dict)


class MessageEnv(ABC):
    """One episode of a conversation game; the player is the assistant."""

    @abstractmethod
    async def initial_messages(self) -> list[Message]:
        """The conversation the player replies to first (e.g. a system prompt with the rules and a user turn)."""

    @abstractmethod
    async def step(self, reply: Message, ended_cleanly: bool) -> MessageStepResult:
        """Score the player's ``reply``; ``ended_cleanly`` is False when it was cut off or did not parse."""

    def episode_metrics(self) -> Metrics:
        """Metrics of the whole episode, attached to its final step (e.g. ``episode/success``)."""
        return {}

    def reply_prefill(self) -> str | None:
        """Text that starts the player's next reply (asked before each turn); None: the player writes it all."""
        return None


class EnvFromMessageEnv(Env):
    """A token ``Env`` that renders a ``MessageEnv``'s conversation for the policy (see the module docstring)."""

    def __init__(self, renderer: Renderer, message_env: MessageEnv) -> None:
        self.renderer = renderer
        self.message_env = message_env
        self.messages: list[Message] = []
        self._observation: Observation = tinker.ModelInput.empty()
        self._turns = 0
        self._cut_off_replies = 0
        self._prefill: list[int] = []

    @property
    def stop_condition(self) -> StopCondition:
        return self.renderer.get_stop_sequences()

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        self.messages = list(await self.message_env.initial_messages())
        self._observation = _prompt(self.renderer, self.messages, self._next_prefill())
        return self._observation, self.stop_condition

    def _next_prefill(self) -> str | None:
        prefill = self.message_env.reply_prefill()
        self._prefill = list(self.renderer.content_chunk("", prefill).tokens) if prefill else []
        return prefill

    async def step(self, action: Action) -> StepResult:
        parsed, termination = self.renderer.parse_response([*self._prefill, *action])
        ended_cleanly = is_stop_sequence_termination(termination)
        reply: Message = {"role": "assistant", "content": message_text(parsed)}
        for key in ("tool_calls", "unparsed_tool_calls"):
            if parsed.get(key):
                reply[key] = parsed[key]  # type: ignore[literal-required]
        result = await self.message_env.step(reply, ended_cleanly)
        self._turns += 1
        self._cut_off_replies += int(not ended_cleanly)
        metrics = dict(result.metrics)
        if result.episode_done:
            metrics.update({"episode/turns": self._turns, "episode/cut_off_replies": self._cut_off_replies,
                            **self.message_env.episode_metrics()})
            return StepResult(result.reward, True, tinker.ModelInput.empty(), self.stop_condition, metrics,
                              dict(result.logs))
        reply_index = len(self.messages)
        self.messages += [reply, *result.next_messages]
        self._observation = next_observation(self.renderer, self._observation, list(action), self.messages,
                                             reply_index, self._next_prefill())
        return StepResult(result.reward, False, self._observation, self.stop_condition, metrics, dict(result.logs))


def next_observation(renderer: Renderer, observation: Observation, action: list[int], messages: list[Message],
                     reply_index: int, prefill: str | None = None) -> Observation:
    """The prompt after ``messages`` (then ``prefill``) as ``observation + action`` plus the rendering of the rest.

    ``messages[reply_index]`` is the parsed text of ``action`` and everything after it is new. Rendering the whole
    conversation again would re-tokenize the replies, which can differ from the sampled tokens (another split of
    the same characters, or a stop token that a cut-off reply lacks). So for a renderer with the extension property
    and stop tokens the result is spliced: the previous observation and the sampled tokens as they are, the stop
    token if the reply was cut off, then the new messages' tokens (the part of the rendering after the reply).
    Otherwise the plain rendering of ``messages`` is returned.
    """
    full = _prompt(renderer, messages, prefill)
    stops = renderer.get_stop_sequences()
    token_stops = [s for s in stops if isinstance(s, int)]
    if not renderer.has_extension_property or not token_stops or len(token_stops) != len(stops):
        return full  # with string stops, where a reply ends in tokens is not well defined
    full_ints = full.to_ints()
    through_reply = renderer.build_supervised_example(messages[: reply_index + 1])[0].to_ints()
    if full_ints[: len(through_reply)] != through_reply:
        return full  # the renderer broke its extension promise; the turns will train as separate datums
    closing = [] if action and action[-1] in token_stops else [token_stops[0]]
    return tinker.ModelInput.from_ints(observation.to_ints() + action + closing + full_ints[len(through_reply):])


def _prompt(renderer: Renderer, messages: list[Message], prefill: str | None) -> Observation:
    # Without a prefill, the plain call: renderers written for envs without prefills need not accept one.
    if prefill is None:
        return renderer.build_generation_prompt(messages)
    return renderer.build_generation_prompt(messages, prefill=prefill)


def renderer_for(model_name: str, renderer_name: str | None = None) -> Renderer:
    """The renderer ``renderer_name`` (None: the one recommended for ``model_name``) on ``model_name``'s tokenizer."""
    from tinker_cookbook import model_info, renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    name = renderer_name or model_info.get_recommended_renderer_name(model_name)
    return renderers.get_renderer(name, get_tokenizer(model_name))
