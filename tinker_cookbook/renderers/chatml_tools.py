"""ChatML with tool calls (``chatml_tools``): SmolLM2's ChatML framing plus Qwen's tool-calling blocks.

SmolLM2-Instruct's own template has no tool format, so this renderer borrows the one that ChatML models are most
often trained on (Qwen's, rendered by ``qwen3_instruct``): tools declared in the system message (one JSON line
each, with a shorter preamble than Qwen's), calls as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` after the reply's
text, and results as ``<tool_response>`` blocks in a user turn. Without tools it renders exactly as ``chatml``
(SmolLM2's default system prompt included), so a conversation with no tool calls tokenizes as the model's template.
"""

from __future__ import annotations

from collections.abc import Sequence

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers.base import Message, ToolSpec
from tinker_cookbook.renderers.chatml import SMOLLM2_DEFAULT_SYSTEM_PROMPT
from tinker_cookbook.renderers.qwen3 import Qwen3InstructRenderer, tool_spec_to_json
from tinker_cookbook.tokenizer_utils import Tokenizer

_HOW_TO_CALL = '\nTo call a tool, write:\n<tool_call>\n{"name": <tool name>, "arguments": <JSON object>}\n</tool_call>'


class ChatMLToolsRenderer(Qwen3InstructRenderer):
    """ChatML with Qwen-style ``<tool_call>`` blocks and no reasoning; has the extension property."""

    def __init__(self, tokenizer: Tokenizer, default_system_prompt: str | None = SMOLLM2_DEFAULT_SYSTEM_PROMPT):
        super().__init__(tokenizer)
        # Qwen's template inserts no system prompt; SmolLM2's does, and this renderer follows the model's.
        self.default_system_prompt = default_system_prompt

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """One system message: ``system_prompt``, one JSON line per tool and how to call them.

        Shorter than Qwen's preamble (SmolLM2 was not trained on either), which keeps prompts small for CPU runs.
        """
        if not tools:
            raise RendererError(
                "create_conversation_prefix_with_tools: tools is empty; pass at least one ToolSpec"
            )
        prefix = f"{system_prompt}\n\n" if system_prompt else ""
        lines = "\n".join(tool_spec_to_json(tool) for tool in tools)
        return [{"role": "system", "content": prefix + "Tools:\n" + lines + _HOW_TO_CALL}]
