"""Off-policy distillation's data builder: rows written, resumed after a kill, deduplicated, teacher checked."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tinker_cookbook import tinker
from tinker_cookbook.distillation.datasets import Conversation, TeacherConfig
from tinker_cookbook.distillation.teacher_data import prompt_key, write_teacher_data
from tinker_cookbook.exceptions import DataError
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

TEACHER = TeacherConfig(base_model="HuggingFaceTB/SmolLM2-135M-Instruct", load_checkpoint_path="tinker://t/x/final")


class _Renderer:
    """Characters as tokens; token 0 is the stop sequence."""

    def build_generation_prompt(self, messages: list[dict]) -> tinker.ModelInput:
        return tinker.ModelInput.from_ints([ord(c) for c in messages[-1]["content"]])

    def get_stop_sequences(self) -> list[int]:
        return [0]

    def parse_response(self, tokens: list[int]) -> tuple[dict, bool]:
        stopped = 0 in tokens
        text = "".join(chr(t) for t in (tokens[: tokens.index(0)] if stopped else tokens))
        return {"role": "assistant", "content": text}, stopped


class _Sampler:
    """Replies with the prompt upper-cased (cut short, without the stop token, for prompts starting with 'long')."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def sample_async(self, prompt: tinker.ModelInput, num_samples: int, sampling_params: tinker.SamplingParams
                           ) -> tinker.SampleResponse:
        text = "".join(chr(t) for t in prompt.to_ints())
        self.prompts.append(text)
        tokens = [ord(c) for c in text.upper()] + ([] if text.startswith("long") else [0])
        return tinker.SampleResponse(sequences=[
            tinker.SampledSequence(stop_reason="stop", tokens=tokens, logprobs=[0.0] * len(tokens))
            for _ in range(num_samples)])


class _Service:
    def __init__(self) -> None:
        self.sampler = _Sampler()

    def create_sampling_client(self, model_path: str | None = None, base_model: str | None = None) -> _Sampler:
        return self.sampler


def _prompt(text: str) -> Conversation:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


def _write(path: Path, prompts: list[str], teacher: TeacherConfig = TEACHER, **kwargs) -> tuple[object, _Service]:
    service = _Service()
    stats = asyncio.run(write_teacher_data(path, [_prompt(p) for p in prompts], teacher,
                                           _Renderer(), service, chunk_size=2, **kwargs))  # type: ignore[arg-type]
    return stats, service


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_are_conversations_the_sft_builder_reads(tmp_path):
    out = tmp_path / "teacher.jsonl"
    stats, _ = _write(out, ["ab", "cd", "ab"], samples_per_prompt=2)
    assert (stats.prompts, stats.skipped, stats.rows_written) == (2, 0, 4)  # "ab" twice is one prompt
    rows = _rows(out)
    assert rows[0]["messages"] == [*_prompt("ab"), {"role": "assistant", "content": "AB"}]
    assert {r["key"] for r in rows} == {prompt_key(_prompt("ab")), prompt_key(_prompt("cd"))}
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer="HuggingFaceTB/SmolLM2-135M-Instruct",
                                            renderer_name="chatml", batch_size=2, max_length=64)
    train, _ = FromConversationFileBuilder(common_config=common, file_path=str(out))()
    assert len(train) == 2


def test_a_rerun_skips_done_prompts_and_resamples_after_a_torn_line(tmp_path):
    out = tmp_path / "teacher.jsonl"
    _write(out, ["ab", "cd", "ef"])
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][:10])  # killed while writing the third row
    stats, service = _write(out, ["ab", "cd", "ef", "gh"])
    assert (stats.skipped, stats.rows_written) == (2, 2)  # type: ignore[attr-defined]
    assert service.sampler.prompts == ["ef", "gh"]
    assert [r["messages"][-1]["content"] for r in _rows(out)] == ["AB", "CD", "EF", "GH"]


def test_a_file_of_another_teacher_is_refused(tmp_path):
    out = tmp_path / "teacher.jsonl"
    _write(out, ["ab"])
    with pytest.raises(DataError, match="written by teacher"):
        _write(out, ["cd"], teacher=TeacherConfig(base_model="HuggingFaceTB/SmolLM2-135M-Instruct"))


def test_replies_cut_by_max_tokens_are_dropped_unless_kept(tmp_path):
    stats, _ = _write(tmp_path / "a.jsonl", ["long one", "ok"])
    assert (stats.rows_written, stats.truncated) == (1, 1)  # type: ignore[attr-defined]
    stats, _ = _write(tmp_path / "b.jsonl", ["long one", "ok"], keep_truncated=True)
    assert (stats.rows_written, stats.truncated) == (2, 0)  # type: ignore[attr-defined]
