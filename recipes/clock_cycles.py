"""What overlapping requests buys: the docs' clock-cycles demo, measured on the local engine.

    python -m recipes.clock_cycles                                  # SmolLM2-135M-Instruct, 3 ways, 6 steps each
    python -m recipes.clock_cycles model_name=tinker-cookbook/tiny-smollm2 n_steps=3   # seconds
    python -m recipes.clock_cycles client_work_s=0                  # no work of the loop's own between steps

The same training step (``forward_backward`` with ``cross_entropy`` on ``batch_size`` random sequences, then
``optim_step``) is run ``n_steps`` times in three ways, each on a fresh LoRA adapter, and the time per step printed:

- ``naive``: submit ``forward_backward``, wait for it, submit ``optim_step``, wait for it, then prepare the next
  batch: the engine idles during every round trip and while the loop prepares data;
- ``back_to_back``: submit both requests before waiting for either (one round trip per step, as the docs advise);
- ``pipelined``: also submit step k+1 before waiting for step k, so the loop's own work (``client_work_s`` per step:
  making the next batch, sampling, computing rewards ...) happens while the engine trains.

The hosted service runs requests in clock cycles shared by many users, so a missed cycle costs a whole cycle. The
local engine has no cycles: one worker thread runs each client's requests in order, as soon as they arrive. What
is lost here is the engine's idle time: the round trips and the loop's own work between requests. So
``pipelined`` approaches the engine's compute time per step (``client_work_s`` hidden), ``back_to_back`` adds the
loop's work, and ``naive`` adds a round trip on top. Measured on a shared 2-core machine with the defaults
(``n_steps=4``): naive 9.2, back to back 8.7, pipelined 5.8 s/step; more in docs/recipes.md.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

import chz

from tinker_cookbook import run_core, tinker
from tinker_cookbook.cli_utils import run_recipe

MODES = ("naive", "back_to_back", "pipelined")


@chz.chz
class Config:
    """The demo's settings."""

    model_name: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    """The base model the LoRA adapters are trained on."""
    lora_rank: int = 8
    """Rank of each LoRA adapter."""
    batch_size: int = 4
    """Sequences per step."""
    seq_len: int = 64
    """Tokens per sequence (random ids: only the time matters)."""
    n_steps: int = 6
    """Timed steps per way (after one untimed warm-up step)."""
    client_work_s: float = 2.0
    """Seconds the loop spends between steps on its own work (sleeps: stands for data loading, sampling, rewards)."""
    learning_rate: float = 1e-4
    """Adam learning rate."""
    modes: tuple[str, ...] = MODES
    """Which ways to time, in this order."""
    seed: int = 0
    """Seed of the random sequences and of the adapters."""

    @chz.validate
    def _check(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"modes={list(self.modes)} holds {bad}; choose from {list(MODES)}")
        if self.n_steps < 1 or self.batch_size < 1 or self.seq_len < 2:
            raise ValueError(f"n_steps={self.n_steps}, batch_size={self.batch_size}, seq_len={self.seq_len}: need "
                             "n_steps >= 1, batch_size >= 1 and seq_len >= 2")
        if self.client_work_s < 0:
            raise ValueError(f"client_work_s={self.client_work_s} is negative; use 0 for a loop with no work of its own")


def make_batch(rng: random.Random, cfg: Config, vocab_size: int) -> list[tinker.Datum]:
    """``batch_size`` random sequences, every next token weighted 1."""
    batch = []
    for _ in range(cfg.batch_size):
        tokens = [rng.randrange(vocab_size) for _ in range(cfg.seq_len)]
        batch.append(tinker.Datum(
            model_input=tinker.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (cfg.seq_len - 1)}))
    return batch


Step = tuple[tinker.APIFuture[tinker.ForwardBackwardOutput], tinker.APIFuture[tinker.OptimStepResponse]]


async def _submit(client: tinker.TrainingClient, batch: list[tinker.Datum], adam: tinker.AdamParams) -> Step:
    fwd_bwd = await client.forward_backward_async(batch, loss_fn="cross_entropy")
    return fwd_bwd, await client.optim_step_async(adam)


async def _wait(step: Step) -> None:
    await step[0].result_async()
    await step[1].result_async()


async def run_naive(client: tinker.TrainingClient, next_batch: Callable[[], Awaitable[list[tinker.Datum]]],
                    adam: tinker.AdamParams, n_steps: int) -> None:
    for _ in range(n_steps):
        batch = await next_batch()
        fwd_bwd = await client.forward_backward_async(batch, loss_fn="cross_entropy")
        await fwd_bwd.result_async()
        optim = await client.optim_step_async(adam)
        await optim.result_async()


async def run_back_to_back(client: tinker.TrainingClient, next_batch: Callable[[], Awaitable[list[tinker.Datum]]],
                           adam: tinker.AdamParams, n_steps: int) -> None:
    for _ in range(n_steps):
        await _wait(await _submit(client, await next_batch(), adam))


async def run_pipelined(client: tinker.TrainingClient, next_batch: Callable[[], Awaitable[list[tinker.Datum]]],
                        adam: tinker.AdamParams, n_steps: int) -> None:
    in_flight = await _submit(client, await next_batch(), adam)
    for _ in range(n_steps - 1):
        following = await _submit(client, await next_batch(), adam)  # queued before the previous step is awaited
        await _wait(in_flight)
        in_flight = following
    await _wait(in_flight)


RUNNERS = {"naive": run_naive, "back_to_back": run_back_to_back, "pipelined": run_pipelined}


async def time_mode(service: tinker.ServiceClient, cfg: Config, mode: str) -> float:
    """Seconds per step of ``mode`` (a fresh adapter; one untimed warm-up step first)."""
    client = await service.create_lora_training_client_async(base_model=cfg.model_name, rank=cfg.lora_rank,
                                                             seed=cfg.seed)
    vocab_size = len(client.get_tokenizer())
    rng = random.Random(cfg.seed)
    adam = run_core.adam_params(cfg.learning_rate)

    async def next_batch() -> list[tinker.Datum]:
        if cfg.client_work_s > 0:
            await asyncio.sleep(cfg.client_work_s)
        return make_batch(rng, cfg, vocab_size)

    await _wait(await _submit(client, make_batch(rng, cfg, vocab_size), adam))
    start = time.perf_counter()
    await RUNNERS[mode](client, next_batch, adam, cfg.n_steps)
    return (time.perf_counter() - start) / cfg.n_steps


async def measure(cfg: Config) -> dict[str, float]:
    """Seconds per step of each of ``cfg.modes``."""
    service = tinker.ServiceClient()
    return {mode: await time_mode(service, cfg, mode) for mode in cfg.modes}


def main(cfg: Config) -> None:
    results = asyncio.run(measure(cfg))
    print(f"{cfg.model_name}: {cfg.batch_size} x {cfg.seq_len} tokens per step, {cfg.client_work_s:g} s of the "
          f"loop's own work per step, {cfg.n_steps} steps each")
    fastest = min(results.values())
    for mode, seconds in results.items():
        print(f"  {mode:<13} {seconds:7.3f} s/step  ({seconds / fastest:.2f}x the fastest)")


if __name__ == "__main__":
    run_recipe(main, name="clock_cycles")
