"""The Qwen3 family: hybrid thinking (``qwen3``, ``qwen3_disable_thinking``), Instruct-2507 (``qwen3_instruct``),
and the vision-language variants (``qwen3_vl``, ``qwen3_vl_instruct``).

The format follows the chat template shipped with the Qwen3 tokenizer, token for token:

- ``<|im_start|>{role}\\n{content}<|im_end|>`` per message, separated by ``\\n``;
- assistant reasoning as ``<think>\\n{thinking}\\n</think>\\n\\n{content}``. The template shows it only for
  assistant messages after the last user query (and always frames the final message, with an empty block
  when it has no reasoning); earlier reasoning is stripped. ``strip_thinking_from_history=False`` instead
  keeps every message's reasoning (an empty block when it has none), which gives the extension property;
- tools declared in the system message (``create_conversation_prefix_with_tools``), calls as
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` after the content, and results as
  ``<tool_response>`` blocks in a user turn (consecutive results share one turn);
- images (VL renderers) as ``<|vision_start|>`` + an ``ImageChunk`` + ``<|vision_end|>``.

Decisions where a format choice is not obvious (tests/renderers/test_renderer_format_decisions.py):

- empty think blocks: ``qwen3_disable_thinking`` prefills ``<think>\n\n</think>\n\n`` in the generation prompt
  (the template's ``enable_thinking=False``), so in supervised examples that block is prompt (weight 0); with
  thinking on (``qwen3``) the prompt does not prefill it, the model samples the block itself, and it is trained;
- Qwen3-VL: no Qwen3-VL template is available offline, so the VL renderers follow the official cookbook and use
  the Qwen3 formats (``qwen3_vl`` = ``qwen3`` with thinking, ``qwen3_vl_instruct`` = ``qwen3_instruct``), plus
  images;
- ``qwen3_instruct``: reasoning in history is dropped (the Qwen3 template drops it too for turns before the last
  query); training a reply that has reasoning is refused (an Instruct-2507 model never emits ``<think>``);
- special-token strings in content are plain text (see ``Renderer``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers.base import (
    Chunk,
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Role,
    ToolCall,
    ToolSpec,
    UnparsedToolCall,
    get_text_content,
    get_thinking_content,
    get_tool_calls,
    get_unparsed_tool_calls,
    tool_call_from_json,
)
from tinker_cookbook.renderers.chatml import IM_END, ChatMLRenderer
from tinker_cookbook.renderers.messages import assistant_message, reasoned_content
from tinker_cookbook.tokenizer_utils import Tokenizer

if TYPE_CHECKING:  # image utilities pull in PIL, which text renderers do not need at import time
    from tinker_cookbook.image_processing_utils import ImageProcessor

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EMPTY_THINKING_BLOCK = "<think>\n\n</think>\n\n"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"

_TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def tool_spec_to_json(tool: ToolSpec) -> str:
    """A tool declaration line: the OpenAI function-tool object, serialized the way the template's ``tojson`` does."""
    declaration = {
        "type": "function",
        "function": {
            "name": tool["name"],
            "description": tool["description"],
            "parameters": tool["parameters"],
        },
    }
    return json.dumps(declaration, ensure_ascii=False)


def _is_tool_response_wrapper(message: Message) -> bool:
    text = get_text_content(message)
    return text.startswith("<tool_response>") and text.endswith("</tool_response>")


class Qwen3Renderer(ChatMLRenderer):
    """Qwen3 hybrid models (Qwen3-8B, Qwen3-32B, Qwen3-30B-A3B, ...) with thinking on."""

    def __init__(self, tokenizer: Tokenizer, strip_thinking_from_history: bool = True):
        super().__init__(tokenizer)
        self.strip_thinking_from_history = strip_thinking_from_history

    @property
    def has_extension_property(self) -> bool:
        return not self.strip_thinking_from_history

    def _check_supported(self, messages: Sequence[Message]) -> None:
        # Skip ChatML's "no thinking, no tools" rule: Qwen3 has both.
        super(ChatMLRenderer, self)._check_supported(messages)

    def last_user_index(self, messages: Sequence[Message]) -> int:
        """The last user query as the template defines it: a user turn that is not a wrapped tool response.

        With no such turn the template uses the last index, so no assistant message counts as "after" it.
        """
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] == "user" and not _is_tool_response_wrapper(messages[i]):
                return i
        return len(messages) - 1

    # -- rendering -------------------------------------------------------------------------------------------

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        role = message["role"]
        if role == "tool":
            return self._render_tool_result(message, ctx)
        header = self.text_chunks(self.header_text(role, ctx))
        if role == "assistant":
            return RenderedMessage(header=header, output=self._assistant_output(message, ctx))
        return RenderedMessage(header=header, output=self.content_chunks(message, after=IM_END))

    def content_chunks(self, message: Message, before: str = "", after: str = "") -> list[Chunk]:
        """A user/system/tool message's content between ``before`` and ``after`` (text only here; the VL
        renderers add images). Adjacent text is tokenized as one piece, as in the template's string."""
        return [self.content_chunk(before, get_text_content(message), after)]

    def _render_tool_result(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        prev_is_tool = ctx.prev_message is not None and ctx.prev_message["role"] == "tool"
        next_is_tool = ctx.next_message is not None and ctx.next_message["role"] == "tool"
        separator = "\n" if ctx.idx > 0 else ""
        header = [] if prev_is_tool else self.text_chunks(f"{separator}<|im_start|>user")
        closing = "\n</tool_response>" + ("" if next_is_tool else IM_END)
        return RenderedMessage(
            header=header, output=self.content_chunks(message, "\n<tool_response>\n", closing)
        )

    def split_thinking(self, message: Message) -> tuple[str | None, str]:
        """(reasoning or None, visible text), reading ``<think>`` tags out of string content like the template."""
        thinking, text = get_thinking_content(message), get_text_content(message)
        if thinking is None and THINK_CLOSE in text:
            thinking = text.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
            text = text.split(THINK_CLOSE)[-1].lstrip("\n")
        return thinking, text

    def shows_thinking(self, thinking: str | None, ctx: RenderContext) -> bool:
        """Whether this assistant message is framed with a ``<think>`` block."""
        if not self.strip_thinking_from_history:
            return True
        return ctx.idx > ctx.last_user_index and (ctx.is_last or bool(thinking))

    def _assistant_output(self, message: Message, ctx: RenderContext) -> list[Chunk]:
        thinking, text = self.split_thinking(message)
        chunks: list[Chunk] = []
        if self.shows_thinking(thinking, ctx):
            # The think block is its own piece so that a prefilled empty block tokenizes as in the prompt.
            reasoning = (thinking or "").strip("\n")
            chunks.append(self.framed_chunk((f"{THINK_OPEN}\n", False), (reasoning, True),
                                            (f"\n{THINK_CLOSE}\n\n", False)))
            text = text.lstrip("\n")
        # Tool calls are the model's own text (their tags are not special tokens), so they count as content.
        chunks.append(self.content_chunk("", text + self._tool_calls_text(message, text), IM_END))
        return chunks

    def _tool_calls_text(self, message: Message, text: str) -> str:
        blocks = [
            f'<tool_call>\n{{"name": "{c.function.name}", "arguments": {c.function.arguments}}}\n</tool_call>'
            for c in get_tool_calls(message)
        ]
        blocks += [c.raw_text for c in get_unparsed_tool_calls(message)]
        return "".join(("\n" if (i > 0 or text) else "") + block for i, block in enumerate(blocks))

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """One system message declaring ``tools`` after ``system_prompt``, as the template writes it."""
        if not tools:
            raise RendererError(
                "create_conversation_prefix_with_tools: tools is empty; pass at least one ToolSpec"
            )
        lines = "".join("\n" + tool_spec_to_json(tool) for tool in tools)
        prefix = f"{system_prompt}\n\n" if system_prompt else ""
        return [{"role": "system", "content": prefix + _TOOLS_PREAMBLE + lines + _TOOLS_POSTAMBLE}]

    def tool_call_prefix(self, name: str | None = None) -> str:
        # A reply that calls a tool at once skips reasoning: the empty think block the template writes for it.
        start = "" if self.disables_thinking else EMPTY_THINKING_BLOCK
        return start + '<tool_call>\n{"name": "' + (f'{name}", "arguments": ' if name else "")

    # -- parsing ---------------------------------------------------------------------------------------------

    def parse_response(self, response: Sequence[int]) -> tuple[Message, ParseTermination]:
        body, termination = self.split_at_stop_token(response)
        return self.parse_text(self.decode(body)), termination

    def streaming_fields(self, text: str) -> tuple[str, str]:
        message = self.parse_text(text)
        return get_thinking_content(message) or "", get_text_content(message)

    def parse_text(self, text: str) -> Message:
        """An assistant message from decoded text: ``<think>`` -> ThinkingPart, ``<tool_call>`` -> tool calls."""
        thinking: str | None = None
        if THINK_CLOSE in text:
            before, text = text.split(THINK_CLOSE, 1)
            thinking = before.split(THINK_OPEN, 1)[-1].strip("\n")
            text = text.lstrip("\n")
        elif text.startswith(THINK_OPEN):  # reasoning cut off before </think>
            thinking, text = text[len(THINK_OPEN) :].strip("\n"), ""
        text, calls, unparsed = _split_tool_calls(text)
        return assistant_message(reasoned_content(thinking, text), calls, unparsed)


def _split_tool_calls(text: str) -> tuple[str, list[ToolCall], list[UnparsedToolCall]]:
    """(visible text, parsed calls, unparsable calls) of an assistant reply."""
    start = text.find("<tool_call>")
    if start < 0:
        return text, [], []
    visible, rest = text[:start], text[start:]
    visible = visible.removesuffix("\n")
    calls: list[ToolCall] = []
    unparsed: list[UnparsedToolCall] = []
    end = 0
    for match in _TOOL_CALL_BLOCK.finditer(rest):
        if rest[end : match.start()].strip():
            visible += rest[end : match.start()]
        parsed = tool_call_from_json(match.group(1).strip())
        if isinstance(parsed, ToolCall):
            calls.append(parsed)
        else:
            unparsed.append(UnparsedToolCall(raw_text=match.group(0), error=parsed.error))
        end = match.end()
    tail = rest[end:]
    if "<tool_call>" in tail:
        unparsed.append(UnparsedToolCall(raw_text=tail.strip("\n"), error="unterminated <tool_call> block"))
    elif tail.strip():
        visible += tail
    return visible, calls, unparsed


class Qwen3DisableThinkingRenderer(Qwen3Renderer):
    """Qwen3 hybrid models with thinking off: the prompt ends with an empty ``<think>`` block, as with the
    template's ``enable_thinking=False``."""

    def __init__(self, tokenizer: Tokenizer):
        super().__init__(tokenizer, strip_thinking_from_history=True)

    @property
    def disables_thinking(self) -> bool:
        return True

    def generation_suffix(self, role: Role, ctx: RenderContext) -> list[Chunk]:
        suffix = super().generation_suffix(role, ctx)
        return [*suffix, self.text_chunk(EMPTY_THINKING_BLOCK)] if role == "assistant" else suffix


class Qwen3InstructRenderer(Qwen3Renderer):
    """Qwen3 Instruct-2507 models: no reasoning at all, so no ``<think>`` framing; has the extension property."""

    def __init__(self, tokenizer: Tokenizer):
        super().__init__(tokenizer, strip_thinking_from_history=True)

    @property
    def has_extension_property(self) -> bool:
        return True

    @property
    def disables_thinking(self) -> bool:
        return True

    def split_thinking(self, message: Message) -> tuple[str | None, str]:
        return None, get_text_content(message)

    def shows_thinking(self, thinking: str | None, ctx: RenderContext) -> bool:
        return False


class _VisionContent:
    """Image parts in user and tool messages as ``<|vision_start|>`` + ImageChunk + ``<|vision_end|>``."""

    image_processor: ImageProcessor | None

    def _init_vision(self, image_processor: ImageProcessor | None) -> None:
        self.image_processor = image_processor

    def _check_supported(self, messages: Sequence[Message]) -> None:
        for i, message in enumerate(messages):
            content = message["content"]
            if isinstance(content, str) or message["role"] in ("user", "tool"):
                continue
            if any(part["type"] == "image" for part in content):
                raise RendererError(
                    f"messages[{i}] (role {message['role']!r}) has an image part; Qwen3-VL takes images only in "
                    "user and tool messages"
                )

    def content_chunks(self, message: Message, before: str = "", after: str = "") -> list[Chunk]:
        # Text between images is joined into one string (the vision markers are special tokens, so splitting
        # there is exact); each image becomes its own chunk.
        # Each text segment is a list of (text, is_content) pieces: user text is content, the markers framing.
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        segments: list[list[tuple[str, bool]] | Chunk] = [[(before, False)]]
        for part in parts:
            if part["type"] == "text":
                segments[-1].append((part["text"], True))  # type: ignore[union-attr,typeddict-item]
            elif part["type"] == "image":
                segments[-1].append((VISION_START, False))  # type: ignore[union-attr]
                segments += [self._image_chunk(part["image"]), [(VISION_END, False)]]  # type: ignore[typeddict-item]
        segments[-1].append((after, False))  # type: ignore[union-attr]
        chunks: list[Chunk] = []
        for segment in segments:
            if isinstance(segment, list):
                if any(text for text, _ in segment):
                    chunks.append(self.framed_chunk(*segment))  # type: ignore[attr-defined]
            else:
                chunks.append(segment)
        return chunks

    def to_openai_message(self, message: Message) -> dict[str, Any]:
        """As the base class, with image parts kept in an OpenAI content list (``image_url`` with a URL or data URI)."""
        out = super().to_openai_message(message)  # type: ignore[misc]
        content = message["content"]
        if isinstance(content, str) or not any(part["type"] == "image" for part in content):
            return out
        from tinker_cookbook.image_processing_utils import image_to_data_uri

        parts: list[dict[str, Any]] = []
        for part in content:
            if part["type"] == "text":
                parts.append({"type": "text", "text": part["text"]})  # type: ignore[typeddict-item]
            elif part["type"] == "image":
                image = part["image"]  # type: ignore[typeddict-item]
                url = (
                    image
                    if isinstance(image, str) and image.startswith(("http", "data:"))
                    else image_to_data_uri(image)
                )
                parts.append({"type": "image_url", "image_url": {"url": url}})
        out["content"] = parts
        return out

    def _image_chunk(self, image: Any) -> Chunk:
        from tinker_cookbook.image_processing_utils import image_to_chunk

        if self.image_processor is None:
            raise RendererError(
                f"{type(self).__name__} needs an image processor to render images: pass image_processor= to the "
                "renderer or model_name= to get_renderer (see image_processing_utils.get_image_processor)"
            )
        return image_to_chunk(image, self.image_processor)


class Qwen3VLRenderer(_VisionContent, Qwen3Renderer):
    """Qwen3-VL with Qwen3's thinking format; images become ``ImageChunk``s sized by the image processor."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        image_processor: ImageProcessor | None = None,
        strip_thinking_from_history: bool = True,
    ):
        Qwen3Renderer.__init__(self, tokenizer, strip_thinking_from_history=strip_thinking_from_history)
        self._init_vision(image_processor)


class Qwen3VLInstructRenderer(_VisionContent, Qwen3InstructRenderer):
    """Qwen3-VL Instruct models (Qwen3-VL-30B-A3B-Instruct, Qwen3-VL-235B-A22B-Instruct): no reasoning, images."""

    def __init__(self, tokenizer: Tokenizer, image_processor: ImageProcessor | None = None):
        Qwen3InstructRenderer.__init__(self, tokenizer)
        self._init_vision(image_processor)
