"""``User: ...`` / ``Assistant: ...`` plain-text dialogue, for base models that know no chat format.

Each message is ``{Role}:`` + `` {content}\\n\\n``; the sampler stops on the string ``"\\n\\nUser:"``. In a
supervised example the final message is followed by ``User:`` (trained with it), so that the model learns to
end its turn with the stop sequence. Base models often end with their end-of-text token instead: that is a
clean ``ParseTermination.EOS``, not a failure. A plain-text dialogue has no tool-call or reasoning format, so
conversations with tool calls, tool results or reasoning are refused (RendererError) instead of losing them.
"""

from __future__ import annotations

from collections.abc import Sequence

from tinker_cookbook.renderers.base import (
    Chunk,
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    get_text_content,
)

STOP_SEQUENCE = "\n\nUser:"


class RoleColonRenderer(Renderer):
    """``User: ...\\n\\nAssistant: ...`` with the tokenizer's own BOS (if it adds one)."""

    @property
    def has_extension_property(self) -> bool:
        return True

    def _check_supported(self, messages: Sequence[Message]) -> None:
        super()._check_supported(messages)
        self._reject_thinking_and_tools(messages)

    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        header = self.text_chunks(message["role"].capitalize() + ":")
        output: list[Chunk] = [self.content_chunk(" ", get_text_content(message), "\n\n")]
        # "User:" completes the stop sequence after an assistant message: the model samples it, so train it.
        overlap = self.text_chunks("User:") if message["role"] == "assistant" else []
        return RenderedMessage(header=header, output=output, stop_overlap=overlap)

    def streaming_fields(self, text: str) -> tuple[str, str]:
        return "", text.lstrip()  # the parse strips the reply; the stop string ends the stream before it shows

    def get_stop_sequences(self) -> list[str]:
        return [STOP_SEQUENCE]

    def parse_response(self, response: Sequence[int]) -> tuple[Message, ParseTermination]:
        tokens = [int(t) for t in response]
        eos = self.end_of_sequence_ids()
        ended_with_eos = False
        for i, token in enumerate(tokens):
            if token in eos:
                tokens, ended_with_eos = tokens[:i], True
                break
        text = self.decode(tokens)
        if STOP_SEQUENCE in text:
            # A string stop can end mid-token, so the last token may carry text past it: keep what is before.
            content, termination = text.split(STOP_SEQUENCE, 1)[0], ParseTermination.STOP_SEQUENCE
        elif ended_with_eos:
            content, termination = text, ParseTermination.EOS
        else:
            content, termination = text, ParseTermination.MALFORMED
        return {"role": "assistant", "content": content.strip()}, termination
