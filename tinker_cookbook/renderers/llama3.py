"""Llama-3 Instruct format (Llama-3.1-8B-Instruct, Llama-3.3-70B-Instruct).

``<|begin_of_text|>`` then, per message, ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``;
generation stops on ``<|eot_id|>``. Unlike Meta's own template this adds no "Cutting Knowledge Date" system
preamble (put one in a system message if you want it), and it has no tool-calling format: a conversation with tool
calls, tool results or reasoning is refused with a RendererError rather than rendered without them (no Llama-3 chat
template is available offline to copy a format from, and the official cookbook has none for this renderer either).
"""

from __future__ import annotations

from collections.abc import Sequence

from tinker_cookbook.renderers.base import (
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    get_text_content,
)
from tinker_cookbook.tokenizer_utils import Tokenizer

BEGIN_OF_TEXT = "<|begin_of_text|>"
START_HEADER, END_HEADER = "<|start_header_id|>", "<|end_header_id|>"
EOT = "<|eot_id|>"


class Llama3Renderer(Renderer):
    """Llama-3 chat headers; ``<|eot_id|>`` ends every message."""

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
        self._reject_thinking_and_tools(messages)

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        return RenderedMessage(
            header=self.text_chunks(f"{START_HEADER}{message['role']}{END_HEADER}\n\n"),
            output=[self.content_chunk("", get_text_content(message), EOT)],
        )

    def get_stop_sequences(self) -> list[int]:
        return [self._eot]

    def parse_response(self, response: Sequence[int]) -> tuple[Message, ParseTermination]:
        body, termination = self.split_at_stop_token(response)
        return {"role": "assistant", "content": self.decode(body)}, termination
