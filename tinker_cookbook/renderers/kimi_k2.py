"""Kimi-K2's chat format (moonshotai/Kimi-K2-Thinking), the ``kimi_k2`` renderer.

Every message is ``<|im_{kind}|>{name}<|im_middle|>{content}<|im_end|>``, with no separator:

- a system message: ``<|im_system|>system<|im_middle|>...``; a conversation without one starts with Kimi's default,
  ``You are Kimi, an AI assistant created by Moonshot AI.``, as the model's template does;
- a user message: ``<|im_user|>user<|im_middle|>...``;
- an assistant message: ``<|im_assistant|>assistant<|im_middle|><think>{reasoning}</think>{text}<|im_end|>``. The
  replies of the current turn (after the last reply that called no tool) keep their reasoning; earlier ones keep
  an empty ``<think></think>``, as the template writes history. Tool calls follow the text:
  ``<|tool_calls_section_begin|><|tool_call_begin|>{id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>
  ...<|tool_calls_section_end|>``, where ``id`` is the call's id, or ``functions.{name}:{index}`` without one
  (the id is the only place of the function's name: give calls Kimi's ids, ``functions.NAME:INDEX``, or none);
- a tool result: ``<|im_system|>{name}<|im_middle|>## Return of {tool_call_id}\\n{content}<|im_end|>`` (``name``
  defaults to ``tool``; ``tool_call_id`` is required: it is how the model matches a result to its call).

The generation prompt ends ``<|im_assistant|>assistant<|im_middle|>``; sampling stops at ``<|im_end|>``. Building
the renderer needs Kimi's tokenizer (from the Hugging Face cache); any other raises a ``RendererError`` naming the
missing special tokens. No Kimi tokenizer ships offline: the tests check the format as text, on a tokenizer given
those tokens. Declaring tools (Kimi's ``tool_declare`` message) is not implemented: it raises a ``RendererError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers.base import (
    FunctionBody,
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    ToolCall,
    UnparsedToolCall,
    get_text_content,
    get_thinking_content,
    get_tool_calls,
    remove_thinking,
)
from tinker_cookbook.renderers.messages import assistant_message, reasoned_content
from tinker_cookbook.tokenizer_utils import Tokenizer

IM_SYSTEM, IM_USER, IM_ASSISTANT = "<|im_system|>", "<|im_user|>", "<|im_assistant|>"
IM_MIDDLE, IM_END = "<|im_middle|>", "<|im_end|>"
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
SPECIAL_TOKENS = (IM_SYSTEM, IM_USER, IM_ASSISTANT, IM_MIDDLE, IM_END, SECTION_BEGIN, SECTION_END, CALL_BEGIN,
                  ARGUMENT_BEGIN, CALL_END)
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."

_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(ARGUMENT_BEGIN) + r"(.*?)" + re.escape(CALL_END),
                   re.DOTALL)


class KimiK2Renderer(Renderer):
    """Kimi-K2's ``<|im_*|>`` messages with reasoning and tool calls (see the module docstring)."""

    special_token_tool_calls = ("kimi_k2", "Kimi's tool_declare message")

    def __init__(self, tokenizer: Tokenizer):
        super().__init__(tokenizer)
        missing = [token for token in SPECIAL_TOKENS if len(self.encode(token)) != 1]
        if missing:
            raise RendererError(
                f"the kimi_k2 renderer needs Kimi's tokenizer, but this one ({type(tokenizer).__name__}, "
                f"{getattr(tokenizer, 'name_or_path', '?')!r}) has no single token for {missing}; use "
                "get_tokenizer('moonshotai/Kimi-K2-Thinking') with the model in the Hugging Face cache"
            )
        self._im_end = self.encode(IM_END)[0]

    @property
    def bos_tokens(self) -> list[int]:  # type: ignore[override]
        return []  # Kimi's template starts with the first message

    def _check_supported(self, messages: Sequence[Message]) -> None:
        super()._check_supported(messages)
        for i, message in enumerate(messages):
            if message["role"] == "tool" and not message.get("tool_call_id"):
                raise RendererError(
                    f"messages[{i}] is a tool result without 'tool_call_id': Kimi's format names the call a result "
                    "returns (## Return of ID); set it to the id of the assistant's tool call"
                )

    def prepare_messages(self, messages: Sequence[Message]) -> list[Message]:
        """The default system prompt first when there is none; reasoning kept only in the current turn."""
        msgs = list(messages)
        if msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": DEFAULT_SYSTEM_PROMPT})
        # The current turn starts after the last reply that called no tool (the last message itself excluded:
        # it is the one being trained or answered).
        start = next((i + 1 for i in range(len(msgs) - 2, -1, -1)
                      if msgs[i]["role"] == "assistant" and not get_tool_calls(msgs[i])), 0)
        return [remove_thinking(m) if i < start and m["role"] == "assistant" else m for i, m in enumerate(msgs)]

    # -- rendering -------------------------------------------------------------------------------------------

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = message["role"]
        text = get_text_content(message)
        if role == "tool":
            call_id = message.get("tool_call_id")
            header = self.text_chunks(f"{IM_SYSTEM}{message.get('name') or 'tool'}{IM_MIDDLE}")
            return RenderedMessage(header=header, output=[self.content_chunk(f"## Return of {call_id}\n", text,
                                                                             IM_END)])
        if role != "assistant":
            kind = IM_USER if role == "user" else IM_SYSTEM
            return RenderedMessage(header=self.text_chunks(f"{kind}{role}{IM_MIDDLE}"),
                                   output=[self.content_chunk("", text, IM_END)])
        pieces: list[tuple[str, bool]] = [(THINK_OPEN, False), (get_thinking_content(message) or "", True),
                                          (THINK_CLOSE, False), (text, True)]
        calls = get_tool_calls(message)
        if calls:
            pieces.append((SECTION_BEGIN, False))
            for index, call in enumerate(calls):
                call_id = call.id or f"functions.{call.function.name}:{index}"
                pieces += [(f"{CALL_BEGIN}{call_id}{ARGUMENT_BEGIN}", False), (call.function.arguments, True),
                           (CALL_END, False)]
            pieces.append((SECTION_END, False))
        pieces.append((IM_END, False))
        return RenderedMessage(header=self.text_chunks(f"{IM_ASSISTANT}assistant{IM_MIDDLE}"),
                               output=[self.framed_chunk(*pieces)])

    def get_stop_sequences(self) -> list[int]:
        return [self._im_end]

    # -- parsing ---------------------------------------------------------------------------------------------

    def parse_response(self, response: Sequence[int]) -> tuple[Message, ParseTermination]:
        body, termination = self.split_at_stop_token(response)
        return self.parse_text(self.decode(body)), termination

    def streaming_fields(self, text: str) -> tuple[str, str]:
        message = self.parse_text(text.split(SECTION_BEGIN, 1)[0])
        return get_thinking_content(message) or "", get_text_content(message)

    def parse_text(self, text: str) -> Message:
        """An assistant message from a reply's decoded text: ``<think>...</think>`` -> ThinkingPart (a reply cut
        off inside it is all reasoning; an empty block is no reasoning), ``<|tool_calls_section_begin|>`` starts
        its tool calls (a call's name read from its ``functions.NAME:INDEX`` id)."""
        thinking: str | None = None
        if text.startswith(THINK_OPEN):
            before, found, after = text[len(THINK_OPEN):].partition(THINK_CLOSE)
            thinking, text = (before, after) if found else (before, "")
        text, found, section = text.partition(SECTION_BEGIN)
        calls: list[ToolCall] = []
        unparsed: list[UnparsedToolCall] = []
        if found:
            for call_id, arguments in _CALL.findall(section):
                name = call_id.strip().split(":", 1)[0].removeprefix("functions.")
                try:
                    json.loads(arguments)
                    calls.append(ToolCall(id=call_id.strip(), function=FunctionBody(name=name,
                                                                                     arguments=arguments.strip())))
                except json.JSONDecodeError as error:
                    unparsed.append(UnparsedToolCall(raw_text=f"{CALL_BEGIN}{call_id}{ARGUMENT_BEGIN}{arguments}"
                                                     f"{CALL_END}", error=f"arguments of {name} are not valid "
                                                     f"JSON: {error}"))
            if SECTION_END not in section:
                unparsed.append(UnparsedToolCall(raw_text=SECTION_BEGIN + section,
                                                 error=f"the tool calls are not closed with {SECTION_END}"))
        return assistant_message(reasoned_content(thinking or None, text), calls, unparsed)
