"""``ToolUseEnv``: an agent episode where the model may call tools before it answers.

Each turn the model's reply is read by the renderer into text and tool calls:

- tool calls: each is run by the ``ToolRegistry`` and answered with a ``tool`` message, then the model replies
  again. A call to an unknown tool or with arguments that do not match the schema is answered with the error (the
  model can correct itself) and costs ``format_penalty``, as does a call the renderer could not parse (answered
  with a user message that quotes the parse error). A tool's exception or timeout is answered with the error too,
  but costs nothing: it is not the model's mistake;
- no tool call: the reply is the answer; ``grade(answer_text)`` decides success and the episode ends.

Limits: ``max_turns`` replies per episode and ``max_tool_calls`` calls. Calls beyond the remaining budget in one
reply are answered "not run"; a reply that calls a tool when the budget is already spent ends the episode. Every
episode ends with one ``StopReason``, written into the last turn's logs (``episode_end``, shown in the HTML
transcripts) and counted in the metrics ``episode/stop/<reason>``.

Rewards: ``correct_reward`` on the last step when the answer is right, minus ``format_penalty`` on each step per
format error. Metrics of the episode: ``episode/tool_calls`` (calls per episode), ``episode/success``, and
``episode/success_with_tool`` or ``episode/success_without_tool`` (reported only by episodes that did, or did not,
get a tool result, so each is the success rate of that kind of episode), ``episode/tool_errors`` and
``episode/format_errors``.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from tinker_cookbook.renderers import Message, ToolCall, UnparsedToolCall
from tinker_cookbook.renderers.messages import get_tool_calls, get_unparsed_tool_calls
from tinker_cookbook.rl.multiturn.message_env import MessageEnv, MessageStepResult
from tinker_cookbook.rl.problem_env import message_text
from tinker_cookbook.rl.types import Logs, Metrics
from tinker_cookbook.tool_use.registry import ToolRegistry, tool_message

Grader = Callable[[str], bool]
"""Whether an answer text is right."""

_LOG_CHARS = 300  # enough of a tool result to see what the model read, short enough for the transcript table


class StopReason(StrEnum):
    """Why a tool-use episode ended."""

    ANSWERED = "answered"
    """The model replied without a tool call: that reply was graded."""
    CUT_OFF = "cut_off"
    """The answer was cut off at the token limit (it was still graded)."""
    MAX_TURNS = "max_turns"
    """The model was still calling tools (or writing malformed calls) when its last turn was used."""
    MAX_TOOL_CALLS = "max_tool_calls"
    """The model called a tool after its tool-call budget was spent."""


class ToolUseEnv(MessageEnv):
    """One question answered with the help of ``registry``'s tools (see the module docstring)."""

    def __init__(self, prompt: list[Message], registry: ToolRegistry, grade: Grader, *, max_turns: int = 4,
                 max_tool_calls: int = 3, format_penalty: float = 0.1, correct_reward: float = 1.0,
                 first_reply_prefill: str | None = None) -> None:
        if max_turns < 1 or max_tool_calls < 0:
            raise ValueError(f"max_turns={max_turns} must be >= 1 and max_tool_calls={max_tool_calls} >= 0")
        self.prompt, self.registry, self.grade = prompt, registry, grade
        self.max_turns, self.max_tool_calls = max_turns, max_tool_calls
        self.format_penalty, self.correct_reward = format_penalty, correct_reward
        self.first_reply_prefill = first_reply_prefill
        self.turns = self.tool_calls = self.tool_results = self.tool_errors = self.format_errors = 0
        self.success = False
        self.stop_reason: StopReason | None = None

    async def initial_messages(self) -> list[Message]:
        return list(self.prompt)

    def reply_prefill(self) -> str | None:
        return self.first_reply_prefill if self.turns == 0 else None

    async def step(self, reply: Message, ended_cleanly: bool) -> MessageStepResult:
        self.turns += 1
        calls, unparsed = get_tool_calls(reply), get_unparsed_tool_calls(reply)
        logs: Logs = {}
        if not calls and not unparsed:
            return self._finish_answer(message_text(reply), ended_cleanly, logs)
        if calls and self.tool_calls >= self.max_tool_calls:
            logs["tool_calls"] = _describe_calls(calls)
            return self._end(StopReason.MAX_TOOL_CALLS, 0.0, logs)
        errors_before = self.format_errors
        next_messages = await self._run_calls(calls, logs)
        if unparsed:
            self.format_errors += len(unparsed)
            logs["malformed_calls"] = "; ".join(u.error for u in unparsed)
            next_messages.append({"role": "user", "content": _malformed_call_notice(unparsed)})
        penalty = -self.format_penalty * (self.format_errors - errors_before)
        if self.turns >= self.max_turns:
            return self._end(StopReason.MAX_TURNS, penalty, logs)
        return MessageStepResult(penalty, False, next_messages, {}, logs)

    async def _run_calls(self, calls: list[ToolCall], logs: Logs) -> list[Message]:
        allowed = max(self.max_tool_calls - self.tool_calls, 0)
        messages: list[Message] = []
        results: list[str] = []
        for i, call in enumerate(calls):
            if i >= allowed:
                messages.append(tool_message(call, f"Not run: the limit of {self.max_tool_calls} tool calls is "
                                                   "reached. Answer with what you have."))
                continue
            outcome = await self.registry.call(call)
            self.tool_calls += 1
            if outcome.error is None:
                self.tool_results += 1
            else:
                self.tool_errors += 1
                self.format_errors += int(outcome.error.is_format_error)
            messages.append(outcome.message)
            results.append(message_text(outcome.message)[:_LOG_CHARS])
        if calls:
            logs["tool_calls"] = _describe_calls(calls)
            logs["tool_results"] = "\n---\n".join(results)
            if len(calls) > allowed:
                logs["calls_not_run"] = len(calls) - allowed
        return messages

    def _finish_answer(self, answer: str, ended_cleanly: bool, logs: Logs) -> MessageStepResult:
        self.success = bool(self.grade(answer))
        logs["answer"] = answer.strip()[:_LOG_CHARS]
        reason = StopReason.ANSWERED if ended_cleanly else StopReason.CUT_OFF
        return self._end(reason, self.correct_reward if self.success else 0.0, logs)

    def _end(self, reason: StopReason, reward: float, logs: Logs) -> MessageStepResult:
        self.stop_reason = reason
        logs["episode_end"] = reason.value
        return MessageStepResult(reward, True, [], {}, logs)

    def episode_metrics(self) -> Metrics:
        used_tool = "with_tool" if self.tool_results else "without_tool"
        metrics: Metrics = {
            "episode/success": float(self.success),
            f"episode/success_{used_tool}": float(self.success),
            "episode/tool_calls": self.tool_calls,
            "episode/tool_errors": self.tool_errors,
            "episode/format_errors": self.format_errors,
        }
        metrics.update({f"episode/stop/{r.value}": float(r is self.stop_reason) for r in StopReason})
        return metrics


def _describe_calls(calls: list[ToolCall]) -> str:
    return "\n".join(f"{c.function.name}({c.function.arguments})" for c in calls)


def _malformed_call_notice(unparsed: list[UnparsedToolCall]) -> str:
    errors = "; ".join(u.error for u in unparsed)
    return f"Your tool call could not be read ({errors}). Write the call again in the format the system message shows."
