"""Stop sequences from two sources: the renderer's (which end a message) and a caller's extra strings.

Both the Inspect provider and the OpenAI-compatible server add a caller's ``stop`` strings to the renderer's own
stop sequences, and both return text that ends before the first caller stop string, as OpenAI-style APIs do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def merge_stop_sequences(renderer_stops: Sequence[str] | Sequence[int], extra: Sequence[str],
                         tokenizer: Any) -> list[str] | list[int]:
    """The sampler's ``stop``: the renderer's stop sequences plus a caller's extra strings.

    The sampler takes either token ids or strings. When strings are added to a renderer that stops on token
    ids, the ids are written as their (special-token) text: the sampler searches stop strings in text decoded
    with special tokens kept, so ``<|im_end|>`` still ends the message at the same token.
    """
    extra = [s for s in extra if s]
    if not extra:
        return list(renderer_stops)  # type: ignore[return-value]  # all str or all int, as the renderer gave
    if all(isinstance(s, str) for s in renderer_stops):
        return [*(str(s) for s in renderer_stops), *extra]
    as_text = [tokenizer.decode([int(s)], skip_special_tokens=False) for s in renderer_stops]
    return [*as_text, *extra]


def cut_at_stop_strings(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to (not including) the earliest stop string, and whether it was cut."""
    positions = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(positions)], True) if positions else (text, False)
