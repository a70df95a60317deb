"""An image classifier from a vision-language model: supervised fine-tuning on (image, class name) conversations,
measured by accuracy on a held-out split.

    python -m recipes.vlm_classifier.train          # offline: tiny Qwen3-VL on generated colour squares, CPU, minutes
    python -m recipes.vlm_classifier.train max_steps=2 train_per_class=4 test_per_class=2   # smoke test, seconds
    python -m recipes.vlm_classifier.train model_name=Qwen/Qwen3-VL-2B-Instruct dataset=caltech101 \\
        learning_rate=5e-4 batch_size=32 max_length=8192           # where the model and the hub are reachable
    python -m recipes.vlm_classifier.train --help   # every key, its default and what it does

The loop is the shared supervised one (``tinker_cookbook.supervised.train``; keys, files written and resuming as in
``recipes.sl_basic``); the data comes from ``recipes/vlm_classifier/data.py``. Each conversation is the image and a
question from the user and the class name from the assistant; only the answer is trained
(``LAST_ASSISTANT_MESSAGE``). The classifier is evaluated by sampling a greedy answer to every held-out image and
comparing it with the class name (``test/accuracy``, next to the test set's ``test/nll``), before training (step 0)
and after it; the figures are printed at the end.

The default model, ``tinker-cookbook/tiny-qwen3-vl``, is a random-weight Qwen3-VL (2 text and 2 vision layers) that
cannot see anything meaningful; its LoRA still learns to name the colour of a square, because its random vision
features differ by colour. A hub dataset needs a real model (e.g. ``Qwen/Qwen3-VL-2B-Instruct``); offline, asking
for one stops at once with one ``Error:`` line.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import chz

from recipes.vlm_classifier import data
from tinker_cookbook.cli_utils import RecipeKey, run_recipe
from tinker_cookbook.eval.custom_evaluators import CustomEvaluator
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.recipe_defaults import COMMON, follow_the_model
from tinker_cookbook.supervised.types import resolve_renderer_name

DEFAULT_MODEL = "tinker-cookbook/tiny-qwen3-vl"
DATASET = RecipeKey(
    "dataset", data.OFFLINE_DATASET,
    f"'{data.OFFLINE_DATASET}' (squares of {len(data.COLOURS)} colours generated offline), one of "
    f"{sorted(data.HUB_DATASETS)} or a hub id with image/label columns (these need the hub or its cache).",
)
METRIC = "test/accuracy"


def normalise(text: str) -> str:
    """Lower case, words only: ``"Red."`` and ``" red"`` both name ``red``."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def names_the_class(answer: str, label: str) -> bool:
    return normalise(answer) == normalise(label)


@chz.chz
class AccuracyEvaluatorBuilder:
    """Greedy answers to the held-out images of ``dataset_builder``, graded against the class names."""

    dataset_builder: data.VLMClassifierDatasetBuilder
    model_name: str
    renderer_name: str

    def __call__(self) -> CustomEvaluator:
        examples = self.dataset_builder.examples("test")
        rows = [{"input": data.conversation(e, with_answer=False)[0]["content"], "output": e.label} for e in examples]
        return CustomEvaluator(rows, names_the_class, self.model_name, self.renderer_name, max_tokens=16,
                               temperature=0.0, name="test")


def blueprint(args: Mapping[str, str]) -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults; the model-dependent ones follow ``model_name`` as given."""
    model = args.get("model_name", DEFAULT_MODEL)
    values: dict[str, Any] = {
        "model_name": model,
        "recipe_name": "vlm_classifier",
        "num_epochs": 4,
        "lora_rank": 16,
        "eval_every": 32,
        "save_every": 0,
        "lr_schedule": "cosine",
        "dataset_builder": data.VLMClassifierDatasetBuilder,
        "dataset_builder.dataset": args.get(DATASET.name, DATASET.default),
        COMMON + "batch_size": 4,
        COMMON + "max_length": 8192,
        **follow_the_model(args, model),
    }
    if model == DEFAULT_MODEL:
        # The answer is the class name alone, so the non-thinking format; and a random model needs large steps
        # (measured, README): get_lr's 6.5e-4 is still near chance after 60 steps.
        values.update({k: v for k, v in [("renderer_name", "qwen3_vl_instruct"), ("learning_rate", 5e-3)]
                       if k not in args})
    return chz.Blueprint(train.Config).apply(values, layer_name="vlm_classifier defaults")


def main(config: train.Config) -> None:
    builder = config.dataset_builder
    if not isinstance(builder, data.VLMClassifierDatasetBuilder):
        raise TypeError(f"dataset_builder must be a VLMClassifierDatasetBuilder, got {type(builder).__name__}")
    renderer_name = resolve_renderer_name(config.model_name, config.renderer_name)
    evaluator = AccuracyEvaluatorBuilder(dataset_builder=builder, model_name=config.model_name,
                                         renderer_name=renderer_name)
    config = chz.replace(config, evaluator_builders=[*config.evaluator_builders, evaluator])
    asyncio.run(train.main(config))
    rows = [json.loads(line) for line in (Path(config.log_path) / "metrics.jsonl").read_text().splitlines() if line]
    measured = [r for r in rows if METRIC in r]
    if measured:
        first, last = measured[0], measured[-1]
        print(f"held-out accuracy {first[METRIC]:.2f} (step {first['step']}) -> {last[METRIC]:.2f} "
              f"(step {last['step']}); chance {1 / max(1, len(data.COLOURS)):.2f} for dataset=colours")


if __name__ == "__main__":
    run_recipe(main, blueprint, [DATASET], name="vlm_classifier")
