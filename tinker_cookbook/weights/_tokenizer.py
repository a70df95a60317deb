"""The tokenizer that goes with exported weights, carrying the chat template of the run's renderer."""

from __future__ import annotations

from pathlib import Path

from tinker_cookbook import model_info, renderers
from tinker_cookbook.tokenizer_utils import Tokenizer, get_tokenizer
from tinker_cookbook.weights._adapter import Adapter
from tinker_cookbook.weights._base import BaseFiles
from tinker_cookbook.weights._chat_format import chat_format


def choose_renderer(adapter: Adapter, base_model: str, renderer_name: str | None) -> str:
    """The renderer asked for, else the one the run recorded, else the one recommended for the base model."""
    name = renderer_name or adapter.renderer_name or model_info.get_recommended_renderer_name(base_model)
    chat_format(name)  # an unknown name fails here, before any weights are written
    return name


def base_tokenizer(base: BaseFiles) -> Tokenizer:
    """The tokenizer in the base model's folder where it has one, else the tokenizer of that model name."""
    if (base.folder / "tokenizer.json").is_file() or (base.folder / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(base.folder))
    return get_tokenizer(base.name)


def stop_token_ids(tokenizer: Tokenizer, renderer_name: str) -> list[int]:
    """The token ids the renderer stops on (empty for a renderer that stops on text)."""
    stops = renderers.get_renderer(renderer_name, tokenizer).get_stop_sequences()
    return [s for s in stops if isinstance(s, int)]


def stop_strings(tokenizer: Tokenizer, renderer_name: str) -> list[str]:
    """The renderer's stops as text (token stops decoded)."""
    stops = renderers.get_renderer(renderer_name, tokenizer).get_stop_sequences()
    return [s if isinstance(s, str) else str(tokenizer.decode([s])) for s in stops]


def save_tokenizer(out: Path, base: BaseFiles, renderer_name: str) -> Tokenizer:
    """Write the tokenizer into ``out`` with the renderer's chat template; returns it."""
    from transformers import AutoTokenizer

    # Saved and read back first: the base tokenizer is a shared instance that must keep its own template.
    base_tokenizer(base).save_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    tokenizer.chat_template = chat_format(renderer_name).jinja()
    tokenizer.save_pretrained(str(out))
    return tokenizer
