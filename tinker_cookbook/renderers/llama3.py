"""Llama-3 Instruct format (Llama-3.1-8B-Instruct, Llama-3.2-3B-Instruct, Llama-3.3-70B-Instruct).

``<|begin_of_text|>`` then, per message, ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``;
generation stops on ``<|eot_id|>``. Unlike Meta's own template this adds no "Cutting Knowledge Date" system
preamble (put one in a system message if you want it). Reasoning is refused with a RendererError.

Tool calls follow Llama 3.1/3.2's JSON function calling (the format of Meta's template for custom tools):

- ``create_conversation_prefix_with_tools`` writes a system message that says how to call and lists each tool as
  the OpenAI function-tool JSON object;
- an assistant tool call is the whole message: ``{"name": "search", "parameters": {"query": "..."}}`` (Meta's format
  holds one call per message, so a message with text and a call, or with several calls, is refused);
- a tool result is an ``ipython`` message: ``<|start_header_id|>ipython<|end_header_id|>\\n\\n{result}<|eot_id|>``.

Parsing reads a reply that is a JSON object with ``name`` and ``parameters`` (or ``arguments``) as a tool call,
after an optional ``<|python_tag|>``; a reply that starts like a call but is not valid JSON becomes an
``UnparsedToolCall``. No Llama-3 chat template is available offline to compare with, so these strings follow
Meta's published prompt format rather than a token-exact template test.
"""

from __future__ import annotations

import json
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
    ToolSpec,
    UnparsedToolCall,
    get_text_content,
    get_thinking_content,
    get_tool_calls,
    get_unparsed_tool_calls,
)
from tinker_cookbook.tokenizer_utils import Tokenizer

BEGIN_OF_TEXT = "<|begin_of_text|>"
START_HEADER, END_HEADER = "<|start_header_id|>", "<|end_header_id|>"
EOT = "<|eot_id|>"
PYTHON_TAG = "<|python_tag|>"
TOOL_RESULT_ROLE = "ipython"

_TOOLS_PREAMBLE = (
    "You have access to the following functions. To call a function, respond with only a JSON object in the "
    'format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use '
    "variables.\n\n"
)


class Llama3Renderer(Renderer):
    """Llama-3 chat headers; ``<|eot_id|>`` ends every message; JSON tool calls (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer):
        super().__init__(tokenizer)
        self._bos = self._single_token(BEGIN_OF_TEXT)
        self._eot = self._single_token(EOT)

    def _single_token(self, token: str) -> int:
        ids = self.encode(token)
        if len(ids) != 1:
            raise ValueError(
                f"Llama3Renderer needs a Llama-3 tokenizer with a single {token} token, got ids {ids}"
            )
        return ids[0]

    @property
    def bos_tokens(self) -> list[int]:  # type: ignore[override]
        # The Llama-3 instruct tokenizers differ in whether encode() adds BOS; the format always has it.
        return [self._bos]

    @property
    def has_extension_property(self) -> bool:
        return True

    def _check_supported(self, messages: Sequence[Message]) -> None:
        super()._check_supported(messages)
        for i, message in enumerate(messages):
            if get_thinking_content(message) is not None:
                raise RendererError(
                    f"messages[{i}] has thinking parts but Llama3Renderer has no reasoning format; drop them "
                    "(renderers.remove_thinking) or use a qwen3 renderer"
                )
            calls = len(get_tool_calls(message)) + len(get_unparsed_tool_calls(message))
            if calls > 1 or (calls and get_text_content(message)):
                raise RendererError(
                    f"messages[{i}] has {calls} tool call(s) and text {get_text_content(message)!r:.80}; Llama 3's "
                    "JSON format holds exactly one call and nothing else per assistant message: split it into "
                    "several assistant messages, or use a qwen3 or chatml_tools renderer"
                )

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = TOOL_RESULT_ROLE if message["role"] == "tool" else message["role"]
        header = self.text_chunks(f"{START_HEADER}{role}{END_HEADER}\n\n")
        return RenderedMessage(header=header, output=[self.content_chunk("", self._body(message), EOT)])

    def _body(self, message: Message) -> str:
        calls = get_tool_calls(message)
        if calls:
            call = calls[0].function
            return f'{{"name": "{call.name}", "parameters": {call.arguments}}}'
        unparsed = get_unparsed_tool_calls(message)
        return unparsed[0].raw_text if unparsed else get_text_content(message)

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """One system message: the calling instructions, each tool's JSON (blank-line separated), ``system_prompt``."""
        if not tools:
            raise RendererError(
                "create_conversation_prefix_with_tools: tools is empty; pass at least one ToolSpec"
            )
        declarations = "\n\n".join(
            json.dumps({"type": "function", "function": dict(tool)}, indent=4, ensure_ascii=False) for tool in tools
        )
        suffix = f"\n\n{system_prompt}" if system_prompt else ""
        return [{"role": "system", "content": _TOOLS_PREAMBLE + declarations + suffix}]

    def tool_call_prefix(self, name: str | None = None) -> str:
        return '{"name": "' + (f'{name}", "parameters": ' if name else "")

    def get_stop_sequences(self) -> list[int]:
        return [self._eot]

    def parse_response(self, response: Sequence[int]) -> tuple[Message, ParseTermination]:
        body, termination = self.split_at_stop_token(response)
        return parse_json_tool_call(self.decode(body)), termination


def parse_json_tool_call(text: str) -> Message:
    """An assistant message from a Llama-3 reply: a tool call when the reply is one JSON call, else text."""
    stripped = text.removeprefix(PYTHON_TAG).strip()
    if not stripped.startswith("{"):
        return {"role": "assistant", "content": text}
    try:
        obj = json.loads(stripped)
    except json.JSONDecodeError as e:
        if stripped.startswith('{"name"'):
            return _unparsed(text, f"invalid JSON: {e}")
        return {"role": "assistant", "content": text}
    if not isinstance(obj, dict) or "name" not in obj:
        return {"role": "assistant", "content": text}  # JSON that is not a call: an ordinary answer
    name = obj["name"]
    arguments = obj.get("parameters", obj.get("arguments"))
    if not isinstance(name, str) or not name:
        return _unparsed(text, "missing or non-string 'name'")
    if not isinstance(arguments, dict):
        return _unparsed(text, "missing 'parameters' object")
    call = ToolCall(function=FunctionBody(name=name, arguments=json.dumps(arguments, ensure_ascii=False)))
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _unparsed(text: str, error: str) -> Message:
    return {"role": "assistant", "content": "", "unparsed_tool_calls": [UnparsedToolCall(raw_text=text, error=error)]}
