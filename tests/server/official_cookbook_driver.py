"""Runs the official cookbook's own training loops, unchanged, against a Tinker-protocol server.

Started by ``test_official_cookbook.py`` in a subprocess whose ``PYTHONPATH`` holds the registry's
``tinker-cookbook`` (its package is also named ``tinker_cookbook``, so it must not share a process with this
project's). Only the data are ours: a tiny in-memory supervised dataset and a tiny RL environment, built on the
official cookbook's public types. Usage::

    python official_cookbook_driver.py sl,rl BASE_URL MODEL TOKENIZER_DIR LOG_DIR

(the loops named, in that order, in one process: the official package's imports take most of the time).

The model's tokenizer is registered from ``TOKENIZER_DIR`` (the official ``register_tokenizer``), since the model
hub is not reachable where the tests run. Prints one JSON line: each loop's logged metrics.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import chz
import tinker
from transformers import AutoTokenizer

import tinker_cookbook
from tinker_cookbook import tokenizer_utils
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.types import SupervisedDataset, SupervisedDatasetBuilder

PROMPTS = ["English: banana split\nPig Latin:", "English: quantum physics\nPig Latin:",
           "English: donut shop\nPig Latin:", "English: coffee break\nPig Latin:"]


def _tokenizer(tokenizer_dir: str):  # noqa: ANN202 - a transformers tokenizer
    return AutoTokenizer.from_pretrained(tokenizer_dir)


# -- supervised ------------------------------------------------------------------------------------------------

class TinySupervised(SupervisedDataset):
    def __init__(self, tokenizer_dir: str) -> None:
        tokenizer = _tokenizer(tokenizer_dir)
        self.data = []
        for prompt in PROMPTS:
            tokens = tokenizer.encode(prompt + " ananab-ay")
            self.data.append(tinker.Datum(
                model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)}))

    def get_batch(self, index: int) -> list[tinker.Datum]:
        return self.data[2 * index: 2 * index + 2]

    def __len__(self) -> int:
        return len(self.data) // 2


@chz.chz
class TinySupervisedBuilder(SupervisedDatasetBuilder):
    tokenizer_dir: str

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        return TinySupervised(self.tokenizer_dir), None


# -- reinforcement learning ------------------------------------------------------------------------------------

class ParityEnv(Env):
    """One step: the prompt, then a reward of 1 for an even first sampled token (rewards vary within a group)."""

    def __init__(self, prompt_tokens: list[int]) -> None:
        self.prompt_tokens = prompt_tokens

    async def initial_observation(self):  # noqa: ANN201 - the official (Observation, StopCondition)
        return tinker.ModelInput.from_ints(self.prompt_tokens), []

    async def step(self, action, *, extra=None) -> StepResult:  # noqa: ANN001 - the official Action
        return StepResult(reward=float(bool(action) and action[0] % 2 == 0), episode_done=True,
                          next_observation=tinker.ModelInput.empty(), next_stop_condition=[])


class ParityGroup(EnvGroupBuilder):
    def __init__(self, prompt_tokens: list[int]) -> None:
        self.prompt_tokens = prompt_tokens

    async def make_envs(self) -> Sequence[Env]:
        return [ParityEnv(self.prompt_tokens) for _ in range(4)]


class ParityDataset(RLDataset):
    def __init__(self, tokenizer_dir: str) -> None:
        tokenizer = _tokenizer(tokenizer_dir)
        self.groups = [ParityGroup(tokenizer.encode(p)) for p in PROMPTS]

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return self.groups[2 * index: 2 * index + 2]

    def __len__(self) -> int:
        return len(self.groups) // 2


@chz.chz
class ParityDatasetBuilder(RLDatasetBuilder):
    tokenizer_dir: str

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return ParityDataset(self.tokenizer_dir), None


# -- main --------------------------------------------------------------------------------------------------------

def run(mode: str, base_url: str, model: str, tokenizer_dir: str, log_dir: str) -> list[dict]:
    if mode == "sl":
        sl_config = sl_train.Config(
            log_path=log_dir, model_name=model, recipe_name="sl-through-serve", base_url=base_url,
            dataset_builder=TinySupervisedBuilder(tokenizer_dir=tokenizer_dir), learning_rate=1e-3, lora_rank=4,
            save_every=0, eval_every=0, infrequent_eval_every=0, max_steps=2)
        asyncio.run(sl_train.main(sl_config))
    else:
        rl_config = rl_train.Config(
            log_path=log_dir, model_name=model, recipe_name="rl-through-serve", base_url=base_url,
            dataset_builder=ParityDatasetBuilder(tokenizer_dir=tokenizer_dir), learning_rate=1e-3, lora_rank=4,
            max_tokens=3, save_every=0, eval_every=0, max_steps=2, num_groups_to_log=0)
        asyncio.run(rl_train.main(rl_config))
    return [json.loads(line) for line in (Path(log_dir) / "metrics.jsonl").read_text().splitlines() if line]


def main(modes: str, base_url: str, model: str, tokenizer_dir: str, log_dir: str) -> None:
    tokenizer_utils.register_tokenizer(model, lambda: _tokenizer(tokenizer_dir))
    metrics = {mode: run(mode, base_url, model, tokenizer_dir, str(Path(log_dir) / mode)) for mode in modes.split(",")}
    print(json.dumps({"cookbook": tinker_cookbook.__file__, "metrics": metrics}))


if __name__ == "__main__":
    main(*sys.argv[1:6])
