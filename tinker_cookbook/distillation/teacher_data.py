"""Off-policy distillation's data: a teacher's replies to prompts, stored as a JSONL file of conversations.

``write_teacher_data`` samples ``samples_per_prompt`` teacher replies per prompt and appends one row per reply::

    {"messages": [...the prompt..., {"role": "assistant", "content": reply}], "teacher": "<teacher>", "key": "<id>"}

The file is the input of any supervised dataset builder (``FromConversationFileBuilder``: the extra keys are
ignored), so the student is fine-tuned on it by the shared SFT loop. Writing is resumable: rows are appended and
flushed a chunk of prompts at a time; a rerun drops a torn last line (a run killed mid-write), skips the prompts
whose replies are already there and samples the rest. Prompts are deduplicated (the same conversation twice is
sampled once), and a file written by another teacher is refused rather than mixed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinker_cookbook import renderers, tinker
from tinker_cookbook.distillation.datasets import Conversation, TeacherConfig
from tinker_cookbook.exceptions import DataError
from tinker_cookbook.rl.problem_env import is_stop_sequence_termination, message_text

logger = logging.getLogger(__name__)


def teacher_id(teacher: TeacherConfig) -> str:
    """The name a file records for its teacher: the base model, and ``@checkpoint`` when there is one."""
    return teacher.base_model + (f"@{teacher.load_checkpoint_path}" if teacher.load_checkpoint_path else "")


def prompt_key(messages: Conversation) -> str:
    """A stable id of a prompt (its messages' JSON), for skipping and deduplicating."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def read_done(path: Path, teacher: str) -> dict[str, int]:
    """Rows per prompt key already in ``path``, after cutting a torn last line; a row of another teacher raises."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):  # a write cut short by a kill: keep the complete lines only
        logger.warning("%s: dropping a torn last line of %d bytes", path, len(data) - end)
        with open(path, "r+b") as f:
            f.truncate(end)
    done: dict[str, int] = {}
    for number, line in enumerate(data[:end].decode().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get("teacher") != teacher:
            raise DataError(f"{path}:{number} was written by teacher {row.get('teacher')!r}, not {teacher!r}; "
                            "give another output file, or delete this one to start over")
        done[row["key"]] = done.get(row["key"], 0) + 1
    return done


@dataclass(frozen=True)
class TeacherDataStats:
    """What one ``write_teacher_data`` call did."""

    prompts: int
    """Distinct prompts asked for."""
    skipped: int
    """Of them, already in the file."""
    rows_written: int
    """Replies appended now."""
    truncated: int
    """Replies dropped because they hit ``max_tokens`` before the stop sequence."""


async def write_teacher_data(
    path: str | Path, prompts: Sequence[Conversation], teacher: TeacherConfig, renderer: renderers.Renderer,
    service_client: tinker.ServiceClient, *, samples_per_prompt: int = 1, max_tokens: int = 256,
    temperature: float = 0.0, chunk_size: int = 32, keep_truncated: bool = False,
) -> TeacherDataStats:
    """Append the teacher's replies to ``prompts`` to ``path`` (see the module docstring); returns what it did."""
    if samples_per_prompt < 1 or chunk_size < 1:
        raise DataError(f"samples_per_prompt={samples_per_prompt} and chunk_size={chunk_size} must be at least 1")
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    name = teacher_id(teacher)
    done = read_done(out, name)
    unique = {prompt_key(p): p for p in prompts}
    todo = [(k, p) for k, p in unique.items() if k not in done]
    client = teacher.sampling_client(service_client)
    params = tinker.SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                   stop=renderer.get_stop_sequences())
    written = truncated = 0

    async def replies(messages: Conversation) -> list[tuple[str, bool]]:
        response = await client.sample_async(prompt=renderer.build_generation_prompt(messages),
                                             num_samples=samples_per_prompt, sampling_params=params)
        parsed = [renderer.parse_response(seq.tokens) for seq in response.sequences]
        return [(message_text(m), is_stop_sequence_termination(t)) for m, t in parsed]

    for start in range(0, len(todo), chunk_size):
        chunk = todo[start : start + chunk_size]
        results = await asyncio.gather(*(replies(p) for _, p in chunk))
        rows: list[dict[str, Any]] = []
        for (key, messages), sampled in zip(chunk, results, strict=True):
            for text, stopped in sampled:
                if not stopped and not keep_truncated:
                    truncated += 1
                    continue
                rows.append({"messages": [*messages, {"role": "assistant", "content": text}], "teacher": name,
                             "key": key})
        with open(out, "a") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            f.flush()
            os.fsync(f.fileno())
        written += len(rows)
        logger.info("%s: %d of %d prompts sampled", out, min(start + chunk_size, len(todo)), len(todo))
    return TeacherDataStats(len(unique), len(unique) - len(todo), written, truncated)
