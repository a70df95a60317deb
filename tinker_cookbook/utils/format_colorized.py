"""Show which tokens of an example are trained: tokens coloured by their loss weight, for a terminal.

Colours follow the rendering docs: prompt tokens (weight 0) green, trained completion tokens (weight > 0) red,
and negative weights (e.g. negative advantages) yellow.
"""

from __future__ import annotations

from collections.abc import Sequence

from tinker_cookbook.tokenizer_utils import Tokenizer

PROMPT_COLOR = "\033[32m"  # green: weight 0
COMPLETION_COLOR = "\033[31m"  # red: weight > 0
NEGATIVE_COLOR = "\033[33m"  # yellow: weight < 0
RESET = "\033[0m"


def weight_color(weight: float) -> str:
    """The ANSI colour code of a token with this loss weight."""
    if weight > 0:
        return COMPLETION_COLOR
    if weight < 0:
        return NEGATIVE_COLOR
    return PROMPT_COLOR


def format_colorized(
    tokens: Sequence[int], weights: Sequence[float], tokenizer: Tokenizer, draw_newline_arrow: bool = False
) -> str:
    """The decoded tokens, each run of same-coloured tokens decoded together and wrapped in its colour.

    Decoding runs rather than single tokens keeps multi-byte characters intact. ``draw_newline_arrow`` shows
    newlines as ``↵`` followed by the newline, as in the docs.
    """
    weight_list = [float(w) for w in weights]
    if len(tokens) != len(weight_list):
        raise ValueError(
            f"format_colorized: {len(tokens)} tokens but {len(weight_list)} weights; they must align"
        )
    pieces: list[str] = []
    start = 0
    for end in range(1, len(tokens) + 1):
        if end < len(tokens) and weight_color(weight_list[end]) == weight_color(weight_list[start]):
            continue
        text = str(tokenizer.decode(list(tokens[start:end]), skip_special_tokens=False))
        if draw_newline_arrow:
            text = text.replace("\n", "↵\n")
        pieces.append(f"{weight_color(weight_list[start])}{text}{RESET}")
        start = end
    return "".join(pieces)
