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


def _with_special_tokens(tokens: tuple[str, ...]) -> Tokenizer:
    """A copy of Qwen3's tokenizer with ``tokens`` added as special tokens: the stand-in for a family whose tokenizer
    does not ship offline. Its tests check that family's format as text (decoded), so the ids being this
    vocabulary's does not matter."""
    from tokenizers import AddedToken

    tokenizer = copy.deepcopy(tokenizer_utils.get_tokenizer("Qwen/Qwen3-8B"))
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in tokens], special_tokens=True)
    return tokenizer


@pytest.fixture(scope="session")
def harmony_tokenizer() -> Tokenizer:
    """gpt-oss's special tokens (harmony) on Qwen3's vocabulary."""
    from tinker_cookbook.renderers.gpt_oss import SPECIAL_TOKENS

    return _with_special_tokens(SPECIAL_TOKENS)


@pytest.fixture(scope="session")
def deepseek_tokenizer() -> Tokenizer:
    """DeepSeek-V3.1's special tokens on Qwen3's vocabulary (which has ``<think>`` and ``</think>`` already)."""
    from tinker_cookbook.renderers.deepseek_v3 import SPECIAL_TOKENS

    return _with_special_tokens(SPECIAL_TOKENS)


@pytest.fixture(scope="session")
def kimi_tokenizer() -> Tokenizer:
    """Kimi-K2's special tokens on Qwen3's vocabulary (which has ``<|im_end|>``, ``<think>`` and ``</think>``)."""
    from tinker_cookbook.renderers.kimi_k2 import SPECIAL_TOKENS

    return _with_special_tokens(SPECIAL_TOKENS)
