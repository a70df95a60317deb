import pytest
from sl_helpers import write_conversations


@pytest.fixture
def conversations_file(tmp_path):
    """A small JSONL of 20 valid conversations."""
    return write_conversations(tmp_path / "conversations.jsonl", 20)
