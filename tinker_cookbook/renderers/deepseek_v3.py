"""DeepSeek-V3.1's chat format (deepseek-ai/DeepSeek-V3.1), in its non-thinking (``deepseekv3``) and thinking
(``deepseekv3_thinking``) modes.

``<｜begin▁of▁sentence｜>`` opens the conversation, a system message follows it with no role token (only at the
start), then:

- a user message: ``<｜User｜>{content}``;
- an assistant message: ``<｜Assistant｜></think>{text}<｜end▁of▁sentence｜>``. Non-thinking mode always opens the
  reply with ``</think>`` (no reasoning). Thinking mode samples after ``<｜Assistant｜><think>``: its last reply is
  ``<think>{reasoning}</think>{text}`` (an empty ``<think></think>`` when it has no reasoning), and earlier replies
  drop their reasoning and open with ``</think>``, as the model's template writes history;
- tool calls follow the reply's text: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}
  <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`` before ``<｜end▁of▁sentence｜>``;
- a tool result: ``<｜tool▁output▁begin｜>{content}<｜tool▁output▁end｜>``; the assistant message after results
  continues without a role token (and a generation prompt after results adds nothing).

Sampling stops at ``<｜end▁of▁sentence｜>``. Building a renderer needs DeepSeek's tokenizer (from the Hugging Face
cache); any other raises a ``RendererError`` naming the missing special tokens. No DeepSeek tokenizer ships offline:
the tests check the format as text, on a tokenizer given those tokens. Declaring tools (DeepSeek's ``## Tools``
system prompt) is not implemented: ``create_conversation_prefix_with_tools`` says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers.base import (
    Chunk,
    FunctionBody,
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    Role,
    ToolCall,
    UnparsedToolCall,
    get_text_content,
    get_thinking_content,
    get_tool_calls,
)
from tinker_cookbook.renderers.messages import assistant_message, reasoned_content
from tinker_cookbook.tokenizer_utils import Tokenizer

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, CALL_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
OUTPUT_BEGIN, OUTPUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"
SPECIAL_TOKENS = (BOS, EOS, USER, ASSISTANT, CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, CALL_SEP, OUTPUT_BEGIN,
                  OUTPUT_END)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(CALL_SEP) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)


class DeepSeekV3Renderer(Renderer):
    """DeepSeek-V3.1's format (see the module docstring); ``thinking`` picks the mode."""

    special_token_tool_calls = ("deepseekv3", "DeepSeek's '## Tools' system prompt")

    def __init__(self, tokenizer: Tokenizer, thinking: bool = False):
        super().__init__(tokenizer)
        self.thinking = thinking
        missing = [token for token in SPECIAL_TOKENS if len(self.encode(token)) != 1]
        if missing:
            raise RendererError(
                f"the deepseekv3 renderers need DeepSeek's tokenizer, but this one "
                f"({type(tokenizer).__name__}, {getattr(tokenizer, 'name_or_path', '?')!r}) has no single token for "
                f"{missing}; use get_tokenizer('deepseek-ai/DeepSeek-V3.1') with the model in the Hugging Face cache"
            )
        self._eos = self.encode(EOS)[0]

    @property
    def bos_tokens(self) -> list[int]:  # type: ignore[override]
        return self.encode(BOS)

    @property
    def has_extension_property(self) -> bool:
        # Thinking mode drops the reasoning of earlier replies, so a later rendering is no extension of an earlier.
        return not self.thinking

    @property
    def disables_thinking(self) -> bool:
        return not self.thinking

    # -- rendering -------------------------------------------------------------------------------------------

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = message["role"]
        text = get_text_content(message)
        if role == "system":
            if ctx.idx != 0:
                raise RendererError(
                    f"messages[{ctx.idx}] is a system message after the start: DeepSeek's format has one system "
                    "prompt, first; merge it into messages[0] or make it a user message"
                )
            return RenderedMessage(output=[self.content_chunk("", text)])
        if role == "user":
            return RenderedMessage(header=self.text_chunks(USER), output=[self.content_chunk("", text)])
        if role == "tool":
            return RenderedMessage(header=self.text_chunks(OUTPUT_BEGIN),
                                   output=[self.content_chunk("", text, OUTPUT_END)])
        after_tool = ctx.prev_message is not None and ctx.prev_message["role"] == "tool"
        header = [] if after_tool else self.text_chunks(ASSISTANT)
        pieces: list[tuple[str, bool]] = []
        thinking = get_thinking_content(message)
        if self.thinking and ctx.is_last and not after_tool:
            pieces += [(THINK_OPEN, False), (thinking or "", True), (THINK_CLOSE, False)]
        elif not after_tool:
            header += self.text_chunks(THINK_CLOSE)  # no reasoning: the template's marker, part of the prompt
        pieces.append((text, True))
        calls = get_tool_calls(message)
        if calls:
            pieces.append((CALLS_BEGIN, False))
            for call in calls:
                pieces += [(f"{CALL_BEGIN}{call.function.name}{CALL_SEP}", False), (call.function.arguments, True),
                           (CALL_END, False)]
            pieces.append((CALLS_END, False))
        pieces.append((EOS, False))
        return RenderedMessage(header=header, output=[self.framed_chunk(*pieces)])

    def generation_suffix(self, role: Role, ctx: RenderContext) -> list[Chunk]:
        if role == "assistant" and ctx.prev_message is not None and ctx.prev_message["role"] == "tool":
            return []  # the reply continues the tool results
        if role == "assistant":
            return self.text_chunks(ASSISTANT, THINK_OPEN if self.thinking else THINK_CLOSE)
        return super().generation_suffix(role, ctx)

    def get_stop_sequences(self) -> list[int]:
        return [self._eos]

    # -- parsing ---------------------------------------------------------------------------------------------

    def parse_response(self, response: Sequence[int]) -> tuple[Message, ParseTermination]:
        body, termination = self.split_at_stop_token(response)
        return self.parse_text(self.decode(body), finished=termination.is_clean), termination

    def streaming_fields(self, text: str) -> tuple[str, str]:
        message = self.parse_text(text.split(CALLS_BEGIN, 1)[0], finished=False)
        return get_thinking_content(message) or "", get_text_content(message)

    def parse_text(self, text: str, finished: bool = True) -> Message:
        """An assistant message from a reply's decoded text: in thinking mode the text before ``</think>`` is its
        reasoning; without ``</think>``, a reply still running or cut off is all reasoning, and a finished one (or
        one with tool calls) all text. ``<｜tool▁calls▁begin｜>`` starts its tool calls."""
        thinking: str | None = None
        if self.thinking:
            before, found, after = text.partition(THINK_CLOSE)
            if found:
                thinking, text = before.removeprefix(THINK_OPEN), after
            elif not finished and CALLS_BEGIN not in text:
                thinking, text = text.removeprefix(THINK_OPEN), ""
        text, found, calls_text = text.partition(CALLS_BEGIN)
        calls: list[ToolCall] = []
        unparsed: list[UnparsedToolCall] = []
        if found:
            for name, arguments in _CALL.findall(calls_text):
                try:
                    json.loads(arguments)
                    calls.append(ToolCall(function=FunctionBody(name=name.strip(), arguments=arguments.strip())))
                except json.JSONDecodeError as error:
                    unparsed.append(UnparsedToolCall(raw_text=f"{CALL_BEGIN}{name}{CALL_SEP}{arguments}{CALL_END}",
                                                     error=f"arguments of {name} are not valid JSON: {error}"))
            if CALLS_END not in calls_text:
                unparsed.append(UnparsedToolCall(raw_text=CALLS_BEGIN + calls_text,
                                                 error=f"the tool calls are not closed with {CALLS_END}"))
        return assistant_message(reasoned_content(thinking, text), calls, unparsed)
