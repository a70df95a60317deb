"""Real tokenizers (packaged, offline) shared by the renderer tests."""

from __future__ import annotations

import copy

import pytest

from tinker_cookbook import tokenizer_utils
from tinker_cookbook.tokenizer_utils import Tokenizer


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Tokenizer:
    return tokenizer_utils.get_tokenizer("Qwen/Qwen3-8B")


@pytest.fixture(scope="session")
def llama3_tokenizer() -> Tokenizer:
    return tokenizer_utils.get_tokenizer("meta-llama/Llama-3.1-8B-Instruct")


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> Tokenizer:
    return tokenizer_utils.get_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def harmony_tokenizer() -> Tokenizer:
    """No gpt-oss tokenizer ships offline: a copy of Qwen3's with harmony's special tokens added. The gpt_oss tests
    check the format as text (decoded), so the ids being this vocabulary's does not matter."""
    from tokenizers import AddedToken

    from tinker_cookbook.renderers.gpt_oss import SPECIAL_TOKENS

    tokenizer = copy.deepcopy(tokenizer_utils.get_tokenizer("Qwen/Qwen3-8B"))
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS],
                         special_tokens=True)
    return tokenizer
