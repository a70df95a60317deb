"""Real tokenizers (packaged, offline) shared by the renderer tests."""

from __future__ import annotations

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
