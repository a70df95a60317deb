"""Renderers: conversations to tokens (for sampling and training) and sampled tokens back to messages.

Usage::

    from tinker_cookbook import model_info, renderers, tokenizer_utils

    tokenizer = tokenizer_utils.get_tokenizer("Qwen/Qwen3-8B")
    renderer = renderers.get_renderer(model_info.get_recommended_renderer_name("Qwen/Qwen3-8B"), tokenizer)
    prompt = renderer.build_generation_prompt(messages[:-1])
    model_input, weights = renderer.build_supervised_example(messages)
    message, ok = renderer.parse_response(sampled_tokens)

Renderers are looked up by name in one ``name -> factory`` dict (``BUILTIN_RENDERERS``); ``register_renderer``
adds or overrides names. ``get_registered_renderer_names()`` lists every valid name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.image_processing_utils import ImageProcessor
from tinker_cookbook.renderers.base import (
    Content,
    ContentPart,
    FunctionBody,
    ImagePart,
    Message,
    ParseTermination,
    RenderContext,
    RenderedMessage,
    Renderer,
    Role,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolSpec,
    TrainOnWhat,
    UnparsedToolCall,
    ensure_list,
    format_content_as_string,
    get_text_content,
    get_thinking_content,
    has_thinking,
    remove_thinking,
)
from tinker_cookbook.renderers.chatml import SMOLLM2_DEFAULT_SYSTEM_PROMPT, ChatMLRenderer
from tinker_cookbook.renderers.chatml_tools import ChatMLToolsRenderer
from tinker_cookbook.renderers.deepseek_v3 import DeepSeekV3Renderer
from tinker_cookbook.renderers.gpt_oss import GptOssRenderer
from tinker_cookbook.renderers.kimi_k2 import KimiK2Renderer
from tinker_cookbook.renderers.llama3 import Llama3Renderer
from tinker_cookbook.renderers.qwen3 import (
    Qwen3DisableThinkingRenderer,
    Qwen3InstructRenderer,
    Qwen3Renderer,
    Qwen3VLInstructRenderer,
    Qwen3VLRenderer,
)
from tinker_cookbook.renderers.role_colon import RoleColonRenderer
from tinker_cookbook.renderers.streaming import (
    MessageDelta,
    StreamingMessageComplete,
    StreamingMessageHeader,
    StreamingTextDelta,
    StreamingThinkingDelta,
    Utf8TokenDecoder,
)
from tinker_cookbook.tokenizer_utils import Tokenizer

RendererFactory: TypeAlias = Callable[[Tokenizer, "ImageProcessor | None"], Renderer]

BUILTIN_RENDERERS: dict[str, RendererFactory] = {
    "role_colon": lambda tok, _: RoleColonRenderer(tok),
    "llama3": lambda tok, _: Llama3Renderer(tok),
    "qwen3": lambda tok, _: Qwen3Renderer(tok),
    "qwen3_disable_thinking": lambda tok, _: Qwen3DisableThinkingRenderer(tok),
    "qwen3_instruct": lambda tok, _: Qwen3InstructRenderer(tok),
    "qwen3_vl": lambda tok, proc: Qwen3VLRenderer(tok, proc),
    "qwen3_vl_instruct": lambda tok, proc: Qwen3VLInstructRenderer(tok, proc),
    "chatml": lambda tok, _: ChatMLRenderer(tok, default_system_prompt=SMOLLM2_DEFAULT_SYSTEM_PROMPT),
    "chatml_tools": lambda tok, _: ChatMLToolsRenderer(tok),
    "gpt_oss_no_sysprompt": lambda tok, _: GptOssRenderer(tok),
    "gpt_oss_low_reasoning": lambda tok, _: GptOssRenderer(tok, reasoning_effort="low"),
    "gpt_oss_medium_reasoning": lambda tok, _: GptOssRenderer(tok, reasoning_effort="medium"),
    "gpt_oss_high_reasoning": lambda tok, _: GptOssRenderer(tok, reasoning_effort="high"),
    "deepseekv3": lambda tok, _: DeepSeekV3Renderer(tok),
    "deepseekv3_disable_thinking": lambda tok, _: DeepSeekV3Renderer(tok),
    "deepseekv3_thinking": lambda tok, _: DeepSeekV3Renderer(tok, thinking=True),
    "kimi_k2": lambda tok, _: KimiK2Renderer(tok),
}
"""Every built-in renderer name and how to build it from ``(tokenizer, image_processor)``."""

_VISION_RENDERERS = frozenset({"qwen3_vl", "qwen3_vl_instruct"})

_custom_renderers: dict[str, RendererFactory] = {}


def register_renderer(name: str, factory: RendererFactory) -> None:
    """Make ``get_renderer(name, ...)`` return ``factory(tokenizer, image_processor)``; overrides a built-in name."""
    _custom_renderers[name] = factory


def unregister_renderer(name: str) -> None:
    """Remove a renderer added with ``register_renderer``; raises ``KeyError`` for names it did not add."""
    if name not in _custom_renderers:
        raise KeyError(
            f"no custom renderer registered under {name!r}; custom names: {sorted(_custom_renderers)}"
        )
    del _custom_renderers[name]


def is_renderer_registered(name: str) -> bool:
    return name in _custom_renderers or name in BUILTIN_RENDERERS


def get_registered_renderer_names() -> list[str]:
    """Every name ``get_renderer`` accepts: built-in and custom."""
    return sorted({*BUILTIN_RENDERERS, *_custom_renderers})


def get_renderer(
    name: str,
    tokenizer: Tokenizer,
    image_processor: ImageProcessor | None = None,
    model_name: str | None = None,
    special_tokens_in_content: bool = False,
) -> Renderer:
    """The renderer called ``name`` for ``tokenizer``.

    Vision renderers take ``image_processor``; when it is None and ``model_name`` is given, the model's
    processor is loaded (``image_processing_utils.get_image_processor``). Without either they still render
    text and raise when asked to render an image. ``special_tokens_in_content=True`` parses special-token strings
    inside message content as special tokens, as Hugging Face chat templates do (by default content is plain
    text, so that it cannot forge turn boundaries; see ``Renderer``).
    """
    factory = _custom_renderers.get(name) or BUILTIN_RENDERERS.get(name)
    if factory is None:
        raise RendererError(
            f"unknown renderer name {name!r}; valid names: {get_registered_renderer_names()}. "
            "register_renderer(name, factory) adds your own"
        )
    if image_processor is None and model_name is not None and name in _VISION_RENDERERS:
        from tinker_cookbook.image_processing_utils import get_image_processor

        image_processor = get_image_processor(model_name)
    renderer = factory(tokenizer, image_processor)
    if special_tokens_in_content:
        renderer.special_tokens_in_content = True
    return renderer


def renderer_for(model_name: str, renderer_name: str | None = None) -> Renderer:
    """The renderer ``renderer_name`` (None: the one recommended for ``model_name``) on ``model_name``'s tokenizer,
    as a config that names a model and optionally a renderer means it."""
    from tinker_cookbook.model_info import get_recommended_renderer_name
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    name = renderer_name if renderer_name is not None else get_recommended_renderer_name(model_name)
    return get_renderer(name, get_tokenizer(model_name), model_name=model_name)


__all__ = [
    "BUILTIN_RENDERERS",
    "ChatMLRenderer",
    "ChatMLToolsRenderer",
    "Content",
    "ContentPart",
    "DeepSeekV3Renderer",
    "FunctionBody",
    "GptOssRenderer",
    "ImagePart",
    "KimiK2Renderer",
    "Llama3Renderer",
    "Message",
    "MessageDelta",
    "ParseTermination",
    "Qwen3DisableThinkingRenderer",
    "Qwen3InstructRenderer",
    "Qwen3Renderer",
    "Qwen3VLInstructRenderer",
    "Qwen3VLRenderer",
    "RenderContext",
    "RenderedMessage",
    "Renderer",
    "RendererFactory",
    "Role",
    "RoleColonRenderer",
    "StreamingMessageComplete",
    "StreamingMessageHeader",
    "StreamingTextDelta",
    "StreamingThinkingDelta",
    "TextPart",
    "ThinkingPart",
    "ToolCall",
    "ToolSpec",
    "TrainOnWhat",
    "UnparsedToolCall",
    "Utf8TokenDecoder",
    "ensure_list",
    "format_content_as_string",
    "get_registered_renderer_names",
    "get_renderer",
    "get_text_content",
    "get_thinking_content",
    "has_thinking",
    "is_renderer_registered",
    "register_renderer",
    "remove_thinking",
    "renderer_for",
    "unregister_renderer",
]
