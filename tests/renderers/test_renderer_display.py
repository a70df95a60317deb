"""format_colorized and the display helpers used by training scripts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tinker_cookbook.display import colorize_example, format_trajectory, model_input_tokens
from tinker_cookbook.renderers import get_renderer
from tinker_cookbook.tinker import types
from tinker_cookbook.tokenizer_utils import Tokenizer
from tinker_cookbook.utils.format_colorized import format_colorized

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"


def test_format_colorized_runs(qwen3_tokenizer: Tokenizer) -> None:
    tokens = qwen3_tokenizer.encode("Hi there\nfriend", add_special_tokens=False)
    assert [qwen3_tokenizer.decode([t]) for t in tokens] == ["Hi", " there", "\n", "friend"]
    out = format_colorized(tokens, [0, 0, 1, -0.5], qwen3_tokenizer)
    assert out == f"{GREEN}Hi there{RESET}{RED}\n{RESET}{YELLOW}friend{RESET}"
    arrows = format_colorized(tokens, [0, 0, 1, 1], qwen3_tokenizer, draw_newline_arrow=True)
    assert arrows == f"{GREEN}Hi there{RESET}{RED}↵\nfriend{RESET}"
    with pytest.raises(ValueError, match="4 tokens but 3 weights"):
        format_colorized(tokens, [0, 0, 1], qwen3_tokenizer)


def test_colorize_example_of_a_shifted_datum(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3_instruct", qwen3_tokenizer)
    model_input, weights = renderer.build_supervised_example(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    )
    tokens = model_input.to_ints()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]},
    )
    assert colorize_example(datum, qwen3_tokenizer) == format_colorized(
        tokens, weights.tolist(), qwen3_tokenizer
    )
    assert colorize_example(datum, qwen3_tokenizer).endswith(f"{RED}Yo<|im_end|>{RESET}")
    with pytest.raises(ValueError, match="needs loss_fn_inputs 'target_tokens' and 'advantages'"):
        colorize_example(datum, qwen3_tokenizer, key="advantages")


def test_format_trajectory_shows_only_new_observation_tokens(qwen3_tokenizer: Tokenizer) -> None:
    def enc(text: str) -> list[int]:
        return qwen3_tokenizer.encode(text, add_special_tokens=False)

    ob1, ac1 = enc("User: 2+2?\nAssistant:"), enc(" 4")
    ob2, ac2 = ob1 + ac1 + enc("\nUser: 3+3?\nAssistant:"), enc(" 6")
    trajectory = SimpleNamespace(
        transitions=[
            SimpleNamespace(ob=types.ModelInput.from_ints(ob1), ac=SimpleNamespace(tokens=ac1), reward=0.0),
            SimpleNamespace(ob=types.ModelInput.from_ints(ob2), ac=SimpleNamespace(tokens=ac2), reward=1.0),
        ]
    )
    assert format_trajectory(trajectory, qwen3_tokenizer).split("\n--- ") == [
        f"--- step 0 | reward 0 ---\n{GREEN}User: 2+2?\nAssistant:{RESET}{RED} 4{RESET}",
        f"step 1 | reward 1 | continues ---\n{GREEN}\nUser: 3+3?\nAssistant:{RESET}{RED} 6{RESET}",
    ]


def test_model_input_tokens_with_images() -> None:
    image = types.ImageChunk(data=b"x", format="png", expected_tokens=2)
    model_input = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[5]), image])
    assert model_input_tokens(model_input, image_token=9) == [5, 9, 9]
    with pytest.raises(ValueError, match="pass image_token"):
        model_input_tokens(model_input)
