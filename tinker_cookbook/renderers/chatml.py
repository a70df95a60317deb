"""ChatML (``<|im_start|>role\\n...<|im_end|>``), the format of SmolLM2-Instruct, the project's default small model.

SmolLM2's chat template inserts a fixed system prompt when a conversation has none; the ``chatml`` renderer
does the same so that it matches the template token for token. ``ChatMLRenderer(tokenizer)`` without a
default system prompt is plain ChatML.
"""

from __future__ import annotations

from collections.abc import Sequence

from tinker_cookbook.renderers.base import (
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    Role,
    get_text_content,
)
from tinker_cookbook.tokenizer_utils import Tokenizer

SMOLLM2_DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class ChatMLRenderer(Renderer):
    """``<|im_start|>{role}\\n{content}<|im_end|>`` per message, newline-separated; stops on ``<|im_end|>``.

    The newline that follows each ``<|im_end|>`` is rendered at the start of the next header, so a message's
    output ends at its stop token and a sampled message can be appended to the prompt as is.
    """

    def __init__(self, tokenizer: Tokenizer, default_system_prompt: str | None = None):
        super().__init__(tokenizer)
        self.default_system_prompt = default_system_prompt
        self._im_end = self._special_id(IM_END)

    def _special_id(self, token: str) -> int:
        ids = self.encode(token)
        if len(ids) != 1:
            raise ValueError(
                f"{type(self).__name__} needs a tokenizer with a single {token} token, got ids {ids}"
            )
        return ids[0]

    @property
    def has_extension_property(self) -> bool:
        return True

    def header_text(self, role: Role, ctx: RenderContext) -> str:
        separator = "\n" if ctx.idx > 0 else ""
        return f"{separator}{IM_START}{role}\n"

    def prepare_messages(self, messages: Sequence[Message]) -> list[Message]:
        msgs = list(messages)
        if self.default_system_prompt is not None and msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": self.default_system_prompt, "trainable": False})
        return msgs

    def _check_supported(self, messages: Sequence[Message]) -> None:
        super()._check_supported(messages)
        self._reject_thinking_and_tools(messages)

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        return RenderedMessage(
            header=self.text_chunks(self.header_text(message["role"], ctx)),
            output=[self.content_chunk("", get_text_content(message), IM_END)],
        )

    def get_stop_sequences(self) -> list[int]:
        return [self._im_end]

    def parse_response(self, response: Sequence[int]) -> tuple[Message, ParseTermination]:
        body, termination = self.split_at_stop_token(response)
        return {"role": "assistant", "content": self.decode(body)}, termination
