"""gpt-oss's chat format, harmony (openai/gpt-oss-20b, openai/gpt-oss-120b).

Every message is ``<|start|>{header}<|message|>{content}{end}`` with no separator between messages:

- a user message: ``<|start|>user<|message|>{content}<|end|>``;
- a system message is harmony's developer message, its text under ``# Instructions``:
  ``<|start|>developer<|message|># Instructions\\n\\n{content}\\n\\n<|end|>``;
- an assistant message in channels: its reasoning in ``analysis``, its reply in ``final``, each a message of its own:
  ``<|start|>assistant<|channel|>analysis<|message|>{thinking}<|end|><|start|>assistant<|channel|>final<|message|>
  {text}<|return|>``. The conversation's last assistant message ends with ``<|return|>`` (what the model samples),
  earlier ones with ``<|end|>`` (how harmony stores a finished reply in the history);
- a tool call goes to the commentary channel, addressed to the function, with JSON arguments, and ends with
  ``<|call|>``: ``<|start|>assistant to=functions.{name}<|channel|>commentary <|constrain|>json<|message|>{args}
  <|call|>`` (text next to calls is a commentary preamble before them);
- a tool result comes from the function, in the commentary channel:
  ``<|start|>functions.{name} to=assistant<|channel|>commentary<|message|>{result}<|end|>`` (the tool message's
  ``name`` is required: harmony addresses results by function name).

The renderers with a reasoning effort (``gpt_oss_{low,medium,high}_reasoning``) put harmony's system message first
(model identity, knowledge cutoff, the date, ``Reasoning: {effort}``, the valid channels);
``gpt_oss_no_sysprompt`` has none. Sampling stops at ``<|return|>`` (a reply) or ``<|call|>`` (a tool call).

Building a renderer needs a tokenizer with harmony's special tokens (gpt-oss's own, from the Hugging Face cache);
any other raises a ``RendererError`` naming the missing tokens. No gpt-oss tokenizer ships offline: the tests check
the format as text, on a tokenizer given those tokens. Declaring tools (harmony's TypeScript-like ``namespace
functions`` in the developer message) is not implemented: ``create_conversation_prefix_with_tools`` says so.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Sequence

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers.base import (
    ContentPart,
    FunctionBody,
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    TextPart,
    ThinkingPart,
    ToolCall,
    UnparsedToolCall,
    get_text_content,
    get_thinking_content,
    get_tool_calls,
)
from tinker_cookbook.renderers.messages import assistant_message
from tinker_cookbook.tokenizer_utils import Tokenizer

START, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
SPECIAL_TOKENS = (START, MESSAGE, CHANNEL, CONSTRAIN, END, RETURN, CALL)
REASONING_EFFORTS = ("low", "medium", "high")

SYSTEM_PROMPT = (
    "You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n"
    "Current date: {date}\n\n"
    "Reasoning: {effort}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)
"""Harmony's system message for gpt-oss (what OpenAI's format guide and the model's chat template write)."""

# A message header names its recipient before or after its channel (harmony allows both).
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>([^\s<]+)")


class GptOssRenderer(Renderer):
    """Harmony messages and channels (see the module docstring); ``reasoning_effort`` None: no system message."""

    special_token_tool_calls = ("gpt_oss", "harmony's 'namespace functions' in the developer message")

    def __init__(self, tokenizer: Tokenizer, reasoning_effort: str | None = None, current_date: str | None = None):
        super().__init__(tokenizer)
        if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
            raise RendererError(
                f"reasoning_effort={reasoning_effort!r} is not one of gpt-oss's efforts {list(REASONING_EFFORTS)}"
            )
        self.reasoning_effort = reasoning_effort
        # The date is fixed when the renderer is made, so that one run renders every prompt alike.
        self.current_date = current_date or datetime.date.today().isoformat()
        self._ids = {token: self._special_id(token) for token in SPECIAL_TOKENS}

    def _special_id(self, token: str) -> int:
        ids = self.encode(token)
        if len(ids) != 1:
            missing = [t for t in SPECIAL_TOKENS if len(self.encode(t)) != 1]
            raise RendererError(
                f"the gpt_oss renderers need a tokenizer with harmony's special tokens, but this one "
                f"({type(self.tokenizer).__name__}, {getattr(self.tokenizer, 'name_or_path', '?')!r}) has no single "
                f"token for {missing}; use gpt-oss's tokenizer (get_tokenizer('openai/gpt-oss-20b') with the model in "
                "the Hugging Face cache)"
            )
        return ids[0]

    @property
    def bos_tokens(self) -> list[int]:  # type: ignore[override]
        # Harmony has no BOS token; the system message, when there is one, opens every conversation.
        if self.reasoning_effort is None:
            return []
        prompt = SYSTEM_PROMPT.format(date=self.current_date, effort=self.reasoning_effort)
        return list(self.content_chunk(f"{START}system{MESSAGE}", prompt, END).tokens)

    # -- rendering -------------------------------------------------------------------------------------------

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = message["role"]
        if role == "tool":
            name = message.get("name")
            if not name:
                raise RendererError(
                    f"messages[{ctx.idx}] is a tool result without 'name': harmony addresses a result by the "
                    "function that made it; set the tool message's name to the called function's name"
                )
            qualified = name if name.startswith("functions.") else f"functions.{name}"
            header = self.text_chunks(f"{START}{qualified} to=assistant")
            body = self.content_chunk(f"{CHANNEL}commentary{MESSAGE}", get_text_content(message), END)
            return RenderedMessage(header=header, output=[body])
        if role == "system":
            body = self.content_chunk(f"{MESSAGE}# Instructions\n\n", get_text_content(message), f"\n\n{END}")
            return RenderedMessage(header=self.text_chunks(f"{START}developer"), output=[body])
        if role != "assistant":
            body = self.content_chunk(MESSAGE, get_text_content(message), END)
            return RenderedMessage(header=self.text_chunks(f"{START}{role}"), output=[body])
        return RenderedMessage(header=self.text_chunks(f"{START}assistant"),
                               output=[self.framed_chunk(*self._assistant_pieces(message, ctx.is_last))])

    def _assistant_pieces(self, message: Message, is_last: bool) -> list[tuple[str, bool]]:
        """An assistant message after its ``<|start|>assistant`` header, as (text, is_content) pieces."""
        pieces: list[tuple[str, bool]] = []
        next_start = f"{END}{START}assistant"
        thinking = get_thinking_content(message)
        if thinking:
            pieces += [(f"{CHANNEL}analysis{MESSAGE}", False), (thinking, True), (next_start, False)]
        text, calls = get_text_content(message), get_tool_calls(message)
        if not calls:
            return [*pieces, (f"{CHANNEL}final{MESSAGE}", False), (text, True), (RETURN if is_last else END, False)]
        if text:  # a preamble: visible text before the calls
            pieces += [(f"{CHANNEL}commentary{MESSAGE}", False), (text, True), (next_start, False)]
        for i, call in enumerate(calls):
            pieces += [(f" to=functions.{call.function.name}{CHANNEL}commentary {CONSTRAIN}json{MESSAGE}", False),
                       (call.function.arguments, True), (CALL if i == len(calls) - 1 else f"{CALL}{START}assistant",
                                                         False)]
        return pieces

    def get_stop_sequences(self) -> list[int]:
        return [self._ids[RETURN], self._ids[CALL]]

    # -- parsing ---------------------------------------------------------------------------------------------

    def parse_response(self, response: Sequence[int]) -> tuple[Message, ParseTermination]:
        body, termination = self.split_at_stop_token(response)
        return self.parse_text(self.decode(body)), termination

    def streaming_fields(self, text: str) -> tuple[str, str]:
        # A reply still inside a harmony header (before its <|message|>) shows nothing of it yet.
        head, found, tail = text.rpartition(START)
        if MESSAGE not in (tail if found else text):
            text = head
        message = self.parse_text(text)
        return get_thinking_content(message) or "", get_text_content(message)

    def parse_text(self, text: str) -> Message:
        """An assistant message from the decoded text of a reply (after the prompt's ``<|start|>assistant``):
        ``analysis`` -> ThinkingPart, ``final`` and ``commentary`` -> TextPart, ``to=functions.NAME`` -> a tool
        call (an ``UnparsedToolCall`` when its arguments are not JSON). Text in no harmony message (a reply cut
        off before ``<|message|>``) stays as text."""
        parts: list[ContentPart] = []
        calls: list[ToolCall] = []
        unparsed: list[UnparsedToolCall] = []
        for segment in text.split(START):
            header, found, body = segment.removeprefix("assistant").partition(MESSAGE)
            if not found:
                if segment.strip():
                    parts.append(TextPart(type="text", text=segment))
                continue
            body = body.split(END, 1)[0]
            recipient, channel = _RECIPIENT.search(header), _CHANNEL.search(header)
            if recipient and recipient[1].startswith("functions."):
                call = _tool_call(recipient[1].removeprefix("functions."), body, START + segment)
                if isinstance(call, ToolCall):
                    calls.append(call)
                else:
                    unparsed.append(call)
            elif channel and channel[1] == "analysis":
                parts.append(ThinkingPart(type="thinking", thinking=body))
            else:
                parts.append(TextPart(type="text", text=body))
        content: str | list[ContentPart] = parts
        if all(p["type"] == "text" for p in parts):
            content = "".join(p["text"] for p in parts if p["type"] == "text")
        return assistant_message(content, calls, unparsed)


def _tool_call(name: str, arguments: str, raw: str) -> ToolCall | UnparsedToolCall:
    try:
        json.loads(arguments)
    except json.JSONDecodeError as error:
        return UnparsedToolCall(raw_text=raw, error=f"arguments of {name} are not valid JSON: {error}")
    return ToolCall(function=FunctionBody(name=name, arguments=arguments.strip()))
