"""Shared data for the preference tests."""

from __future__ import annotations

import json
from pathlib import Path

from tinker_cookbook.preference.preference_datasets import DPODatasetBuilder, JsonlComparisonBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

TINY_MODEL = "tinker-cookbook/tiny-smollm2"


def pair_row(i: int) -> dict:
    return {"prompt": f"What is {i} plus {i}? Answer with a single number.",
            "chosen": str(2 * i), "rejected": f"{i} plus {i} equals {2 * i}."}


def write_pairs(path: Path, count: int, start: int = 0) -> Path:
    path.write_text("".join(json.dumps(pair_row(i)) + "\n" for i in range(start, start + count)))
    return path


def dpo_builder(train_path: str, batch_size: int = 2, test_path: str | None = None, max_length: int | None = 128,
                **jsonl_fields) -> DPODatasetBuilder:
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=TINY_MODEL, renderer_name="chatml",
                                            max_length=max_length, batch_size=batch_size)
    comparisons = JsonlComparisonBuilder(train_path=train_path, test_path=test_path, **jsonl_fields)
    return DPODatasetBuilder(common_config=common, comparison_builder=comparisons)
