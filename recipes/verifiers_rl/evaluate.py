"""Run a ``verifiers`` environment's evaluation set with a policy and print its rubric's scores.

    python -m recipes.verifiers_rl.evaluate                                   # the offline example, base model
    python -m recipes.verifiers_rl.evaluate model_path=tinker://.../sampler_weights/final   # a trained policy
    python -m recipes.verifiers_rl.evaluate vf_env_id=reverse_text vf_env_args='{"num_eval": 8}' max_tokens=256

The environment drives its own rollouts through ``TinkerAsyncOpenAIClient`` (``tinker_openai.py``), which samples
from the policy: ``model_path`` (a sampler checkpoint) or ``model_name``'s base weights. The environment's
``evaluate`` runs ``num_examples`` rows of its eval set (-1: all), ``rollouts_per_example`` each; the mean and
spread of the reward and of each rubric metric are printed, with one example rollout.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import chz

from recipes.verifiers_rl.tinker_openai import TinkerAsyncOpenAIClient
from tinker_cookbook import tinker
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.rl.multiturn.message_env import renderer_for
from tinker_cookbook.rl.verifiers_env import load_vf_environment

EXAMPLE_ENV = "recipes.verifiers_rl.example_env:load_environment"


def summarize(results: Any) -> dict[str, tuple[float, float]]:
    """(mean, population standard deviation) of the reward and of each rubric metric."""
    columns = {"reward": list(results["reward"]), **{k: list(v) for k, v in results["metrics"].items()}}
    return {name: (statistics.fmean(values), statistics.pstdev(values)) for name, values in columns.items() if values}


def log_results(results: Any, vf_env_id: str, model: str, seconds: float) -> None:
    print(f"{vf_env_id} with {model}: {len(results['reward'])} rollouts in {seconds:.1f} s")
    if results["reward"]:
        print(f"example: {results['prompt'][0][-1]['content']!r} -> {results['completion'][0][-1]['content']!r} "
              f"(reward {results['reward'][0]:.3f})")
    for name, (mean, std) in summarize(results).items():
        print(f"{name}: mean {mean:.3f}, std {std:.3f}")


async def evaluate(vf_env_id: str, vf_env_args: dict[str, Any], model_name: str, num_examples: int,
                   rollouts_per_example: int, max_concurrent: int, max_tokens: int, temperature: float,
                   model_path: str | None = None, renderer_name: str | None = None) -> Any:
    """The environment's ``GenerateOutputs`` for the policy (``model_path``, or ``model_name``'s base weights)."""
    env = load_vf_environment(vf_env_id, vf_env_args)
    service = tinker.ServiceClient()
    sampling = (service.create_sampling_client(model_path=model_path) if model_path
                else service.create_sampling_client(base_model=model_name))
    client = TinkerAsyncOpenAIClient(sampling, renderer_for(model_name, renderer_name))
    start = time.monotonic()
    results = await env.evaluate(client=client, model=model_path or model_name, num_examples=num_examples,
                                 rollouts_per_example=rollouts_per_example, max_concurrent=max_concurrent,
                                 sampling_args={"max_tokens": max_tokens, "temperature": temperature})
    log_results(results, vf_env_id, model_path or model_name, time.monotonic() - start)
    return results


@chz.chz
class CLIConfig:
    """Which environment, which policy, how many rollouts."""

    model_name: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    """The policy's base model (its tokenizer and renderer; the weights when ``model_path`` is None)."""
    model_path: str | None = None
    """A sampler checkpoint (``tinker://...``, a training run's ``sampler_path``)."""
    renderer_name: str | None = None
    vf_env_id: str = EXAMPLE_ENV
    vf_env_args: str | None = None
    """The environment's arguments as a JSON object."""
    num_examples: int = -1
    rollouts_per_example: int = 1
    max_concurrent: int = 32
    max_tokens: int = 8
    temperature: float = 1.0


async def cli_main(config: CLIConfig) -> Any:
    try:
        env_args = json.loads(config.vf_env_args) if config.vf_env_args else {}
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"vf_env_args={config.vf_env_args!r} is not JSON ({exc}); "
                                 "write it as vf_env_args='{\"num_eval\": 8}'") from exc
    if not isinstance(env_args, dict):
        raise ConfigurationError(f"vf_env_args={config.vf_env_args!r} must be a JSON object")
    return await evaluate(config.vf_env_id, env_args, config.model_name, config.num_examples,
                          config.rollouts_per_example, config.max_concurrent, config.max_tokens, config.temperature,
                          config.model_path, config.renderer_name)


def main(config: CLIConfig) -> None:
    asyncio.run(cli_main(config))


if __name__ == "__main__":
    run_recipe(main)
