"""Offline evals: run Inspect AI tasks on a checkpoint or a base model and print a score table.

    python -m tinker_cookbook.eval.run_inspect_evals model_path=tinker://RUN/sampler_weights/final \\
        tasks=example-data/evals/contact_cards.py
    python -m tinker_cookbook.eval.run_inspect_evals model_name=HuggingFaceTB/SmolLM2-135M-Instruct \\
        tasks=example-data/evals/contact_cards.py limit=16
    python -m tinker_cookbook.eval.run_inspect_evals model_path=$MODEL_PATH model_name=MODEL_NAME \\
        tasks=inspect_evals/ifeval,inspect_evals/mmlu_0_shot renderer_name=RENDERER_NAME   # needs network access

``model_path`` is a ``sampler_path`` from a run's ``checkpoints.jsonl``; without it ``model_name`` is evaluated
as a base model. The renderer defaults to the one the checkpoint was trained with, else the model's recommended
one. Every option of ``InspectEvaluatorBuilder`` is a ``key=value`` argument (``limit``, ``temperature``,
``max_tokens``, ``seed``, ``log_dir``, ...). Inspect's logs go to ``log_dir`` (default ``~/inspect-logs``);
``inspect view --log-dir DIR`` browses them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import chz

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.eval.inspect_evaluators import (
    InspectEvaluator,
    InspectEvaluatorBuilder,
    metrics_from_logs,
    task_specs_for_inspect,
)
from tinker_cookbook.exceptions import ConfigurationError


@chz.chz
class Config(InspectEvaluatorBuilder):
    model_path: str | None = None
    """A ``tinker://`` sampler checkpoint; None: evaluate the base model ``model_name``."""


def score_rows(logs: list[Any]) -> list[tuple[str, str, str, float, int]]:
    """``(task, scorer, metric, value, samples)`` for every score of every log."""
    rows = []
    for log in logs:
        samples = log.results.completed_samples if log.results is not None else 0
        for score in log.results.scores if log.results is not None else []:
            for name, metric in score.metrics.items():
                rows.append((log.eval.task, score.name, name, float(metric.value), samples))
    return rows


def format_score_table(rows: list[tuple[str, str, str, float, int]]) -> str:
    header = ("task", "scorer", "metric", "value", "samples")
    cells = [header, *((task, scorer, metric, f"{value:.4f}", str(n)) for task, scorer, metric, value, n in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


async def run(config: Config) -> dict[str, float]:
    """Evaluate and print the score table; returns the metrics (``inspect/<task>/<scorer>/<metric>``)."""
    if config.model_path is None and config.model_name is None:
        raise ConfigurationError(
            "pass model_path=tinker://RUN/sampler_weights/NAME (a checkpoint) or model_name=BASE_MODEL (a base "
            "model), e.g. model_name=HuggingFaceTB/SmolLM2-135M-Instruct"
        )
    task_specs_for_inspect(config.tasks)  # a missing task file fails now, before a model is loaded
    from tinker_cookbook.eval.inspect_utils import InspectAPIFromTinkerSampling

    # The provider loads the model and resolves the renderer exactly as `inspect eval --model` would.
    api = InspectAPIFromTinkerSampling(model_name=config.model_name, model_path=config.model_path,
                                       renderer_name=config.renderer_name)
    evaluator = InspectEvaluator(chz.replace(config, renderer_name=api.renderer_name, model_name=api.base_model),
                                 model_path=config.model_path)
    logs = await evaluator.run(api.sampling_client)
    metrics = metrics_from_logs(logs, config.metric_prefix)
    print(f"model: {config.model_path or api.base_model} (renderer {api.renderer_name})")
    print(format_score_table(score_rows(logs)))
    for log in logs:
        print(f"log: {log.location}")
    print(f"browse: inspect view --log-dir {evaluator.log_dir}")
    return metrics


def main(config: Config) -> None:
    asyncio.run(run(config))


if __name__ == "__main__":
    run_recipe(main)
