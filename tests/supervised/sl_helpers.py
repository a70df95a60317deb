"""Shared data for the supervised tests."""

import json
from pathlib import Path

TINY_MODEL = "tinker-cookbook/tiny-smollm2"


def card_conversation(i: int) -> dict:
    return {"messages": [
        {"role": "system", "content": "You write contact cards."},
        {"role": "user", "content": f"Person {i} is {20 + i} and lives in Town{i}."},
        {"role": "assistant", "content": f"Name: Person {i}\nAge: {20 + i}\nCity: Town{i}"},
    ]}


def write_conversations(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps(card_conversation(i)) + "\n" for i in range(count)))
    return path
