"""Fixtures shared by the RL tests."""

import pytest

from tinker_cookbook.rl.multiturn.message_env import renderer_for

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"  # only its (packaged) tokenizer is used by these fixtures


@pytest.fixture(scope="module")
def chatml():
    """SmolLM2's chat renderer (ChatML), for envs driven by scripted policies."""
    return renderer_for(SMOLLM2)
