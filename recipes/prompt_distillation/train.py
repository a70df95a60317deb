"""Prompt distillation, step 2: fine-tune the student on the teacher's replies WITHOUT the teacher's prompt, through
the shared supervised loop, and measure how often it follows the prompt's behaviour on held-out sentences.

    python -m recipes.prompt_distillation.create_data             # first: the data (see create_data)
    python -m recipes.prompt_distillation.train                   # SmolLM2-135M-Instruct student, CPU, ~1 min
    python -m recipes.prompt_distillation.train model_name=tinker-cookbook/tiny-smollm2 max_steps=1   # smoke test
    python -m recipes.prompt_distillation.train file_path=/tmp/tinker-datasets/prompt_distillation_lang.jsonl \\
        model_name=Qwen/Qwen3-30B-A3B batch_size=128 learning_rate=1e-4 max_length=32768   # the docs' run

The docs' spelling, ``python -m tinker_cookbook.recipes.prompt_distillation.train``, runs this same file.

The student sees only the sentence (no system prompt). At step 0 (the untrained model) and at the end, it answers
the held-out sentences of ``task.split("held_out")`` greedily, and the loop logs to ``metrics.jsonl``:
``held_out/follow_rate`` (the reply is exactly one language code, the behaviour the prompt asked for),
``held_out/accuracy`` (the reply is the right code) and ``held_out/label_rate`` (the reply starts with a code).
The final figures are printed at the end. Other keys and files are those of ``recipes.sl_basic``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import chz

from recipes.prompt_distillation import task
from tinker_cookbook import renderers, tinker
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.eval.evaluators import SamplingClientEvaluator
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.recipe_defaults import COMMON, follow_the_model
from tinker_cookbook.supervised.types import resolve_renderer_name
from tinker_cookbook.tokenizer_utils import get_tokenizer

METRICS = ("held_out/follow_rate", "held_out/accuracy", "held_out/label_rate")


class FollowRateEvaluator(SamplingClientEvaluator):
    """Greedy replies to the held-out sentences, without the teacher prompt, scored against the behaviour."""

    def __init__(self, model_name: str, renderer_name: str, max_tokens: int = 8) -> None:
        self.renderer = renderers.get_renderer(renderer_name, get_tokenizer(model_name), model_name=model_name)
        self.max_tokens = max_tokens
        self.examples = task.split("held_out")

    async def _reply(self, sampling_client: tinker.SamplingClient, sentence: str) -> str:
        params = tinker.SamplingParams(max_tokens=self.max_tokens, temperature=0.0,
                                       stop=self.renderer.get_stop_sequences())
        prompt = self.renderer.build_generation_prompt([renderers.Message(role="user", content=sentence)])
        response = await sampling_client.sample_async(prompt=prompt, num_samples=1, sampling_params=params)
        return renderers.get_text_content(self.renderer.parse_response(response.sequences[0].tokens)[0])

    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        replies = await asyncio.gather(*(self._reply(sampling_client, s) for s, _ in self.examples))
        n = len(self.examples)
        return {
            "held_out/follow_rate": sum(map(task.follows, replies)) / n,
            "held_out/accuracy": sum(r.strip() == code for r, (_, code) in zip(replies, self.examples, strict=True)) / n,
            "held_out/label_rate": sum(task.reply_label(r) is not None for r in replies) / n,
        }


@chz.chz
class FollowRateEvaluatorBuilder:
    model_name: str
    renderer_name: str

    def __call__(self) -> FollowRateEvaluator:
        return FollowRateEvaluator(self.model_name, self.renderer_name)


def blueprint(args: Mapping[str, str]) -> chz.Blueprint[train.Config]:
    """The loop's Config with this recipe's defaults; the model-dependent ones follow ``model_name`` as given."""
    model = args.get("model_name", task.DEFAULT_MODEL)
    return chz.Blueprint(train.Config).apply({
        "model_name": model,
        "recipe_name": "prompt_distillation",
        "num_epochs": 4,
        "eval_every": 1000,  # the behaviour is measured on the untrained model (step 0) and at the end
        "save_every": 0,
        "dataset_builder": FromConversationFileBuilder,
        "dataset_builder.file_path": task.default_output_file(),
        COMMON + "batch_size": 8,
        COMMON + "max_length": 128,
        **follow_the_model(args, model),
    }, layer_name="prompt_distillation defaults")


def main(config: train.Config) -> None:
    data = Path(getattr(config.dataset_builder, "file_path", "")).expanduser()
    if not data.is_file():
        raise ConfigurationError(f"file_path={str(data)!r} does not exist; make it first with "
                                 "python -m recipes.prompt_distillation.create_data (same output_file)")
    renderer_name = resolve_renderer_name(config.model_name, config.renderer_name)
    evaluator = FollowRateEvaluatorBuilder(model_name=config.model_name, renderer_name=renderer_name)
    config = chz.replace(config, evaluator_builders=[*config.evaluator_builders, evaluator])
    asyncio.run(train.main(config))
    rows = [json.loads(line) for line in (Path(config.log_path) / "metrics.jsonl").read_text().splitlines() if line]
    measured = [r for r in rows if METRICS[0] in r]
    if measured:
        first, last = measured[0], measured[-1]
        print("held-out, without the teacher prompt: " + ", ".join(
            f"{key.split('/')[1]} {first[key]:.2f} (step {first['step']}) -> {last[key]:.2f} (step {last['step']})"
            for key in METRICS))


if __name__ == "__main__":
    run_recipe(main, blueprint, name="prompt_distillation")
