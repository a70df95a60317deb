"""Terminal views of training data: what a ``Datum`` trains on, and what happened in an RL trajectory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tinker_cookbook.tinker import types
from tinker_cookbook.tokenizer_utils import Tokenizer
from tinker_cookbook.utils.format_colorized import COMPLETION_COLOR, PROMPT_COLOR, RESET, format_colorized


def model_input_tokens(model_input: types.ModelInput, image_token: int | None = None) -> list[int]:
    """Token ids of a ModelInput; each image position becomes ``image_token`` (required when there are images)."""
    tokens: list[int] = []
    for chunk in model_input.chunks:
        if isinstance(chunk, types.EncodedTextChunk):
            tokens.extend(int(t) for t in chunk.tokens)
        elif image_token is None:
            raise ValueError("model_input has image chunks: pass image_token to stand for image positions")
        else:
            tokens.extend([image_token] * chunk.length)
    return tokens


def colorize_example(datum: types.Datum, tokenizer: Tokenizer, key: str = "weights") -> str:
    """The datum's tokens coloured by ``loss_fn_inputs[key]`` (green prompt, red trained).

    A datum holds the input tokens and the targets shifted by one, with ``key`` aligned to the targets, so
    the sequence shown is the first input token followed by every target token.
    """
    inputs = datum.loss_fn_inputs
    if "target_tokens" not in inputs or key not in inputs:
        raise ValueError(
            f"colorize_example needs loss_fn_inputs 'target_tokens' and {key!r}; got {sorted(inputs)}"
        )
    targets = [int(t) for t in inputs["target_tokens"].tolist()]
    weights = [float(w) for w in inputs[key].tolist()]
    first = next(
        (c.tokens[0] for c in datum.model_input.chunks if isinstance(c, types.EncodedTextChunk) and c.tokens),
        None,
    )
    if first is None:
        return format_colorized(targets, weights, tokenizer)
    return format_colorized([int(first), *targets], [0.0, *weights], tokenizer)


def format_trajectory(trajectory: Any, tokenizer: Tokenizer, image_token: int | None = None) -> str:
    """Each step of an RL trajectory: the observation (green) and the sampled action (red), with its reward.

    ``trajectory`` needs ``transitions``, each with ``ob`` (ModelInput), ``ac.tokens`` and ``reward``. When an
    observation extends the previous observation and action, only the new tokens are shown.
    """
    lines: list[str] = []
    context: list[int] = []
    for step, transition in enumerate(trajectory.transitions):
        ob = model_input_tokens(transition.ob, image_token)
        action = [int(t) for t in transition.ac.tokens]
        extends = len(context) > 0 and ob[: len(context)] == context
        new_ob = ob[len(context) :] if extends else ob
        lines.append(
            f"--- step {step} | reward {transition.reward:.3g}{' | continues' if extends else ''} ---"
        )
        lines.append(
            _colored(new_ob, PROMPT_COLOR, tokenizer) + _colored(action, COMPLETION_COLOR, tokenizer)
        )
        context = ob + action
    return "\n".join(lines)


def _colored(tokens: Sequence[int], color: str, tokenizer: Tokenizer) -> str:
    return f"{color}{tokenizer.decode(list(tokens), skip_special_tokens=False)}{RESET}" if tokens else ""
