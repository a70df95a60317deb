"""The Tinker docs' quickstart on the local engine: teach a model Pig Latin, then sample from it.

    python -m recipes.quickstart                              # embedded default SmolLM2-135M-Instruct, ~1-2 min on 2 CPU cores
    python -m recipes.quickstart model_name=tinker-cookbook/tiny-smollm2 steps=2   # seconds (random tiny model)

Expected: the per-token loss falls step by step (about 4 -> under 1 on the default model), then eight greedy
completions of "coffee break" print. Only the public API is used, exactly as in the docs (after changing the import).
"""

from __future__ import annotations

import chz
import numpy as np

from tinker_cookbook import tinker
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.tinker import types

EXAMPLES = [
    ("banana split", "anana-bay plit-say"),
    ("quantum physics", "uantum-qay ysics-phay"),
    ("donut shop", "onut-day op-shay"),
    ("pickle jar", "ickle-pay ar-jay"),
    ("space exploration", "ace-spay exploration-way"),
    ("rubber duck", "ubber-ray uck-day"),
    ("coding wizard", "oding-cay izard-way"),
    ("hello world", "ello-hay orld-way"),
    ("green apple", "een-gray apple-way"),
    ("lucky cat", "ucky-lay at-cay"),
]


@chz.chz
class Config:
    """The quickstart's settings."""

    model_name: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    """The base model (the tiny random ``tinker-cookbook/tiny-smollm2`` runs in seconds, but learns nothing)."""
    rank: int = 32
    """Rank of the LoRA adapter."""
    steps: int = 8
    """Training steps over the ten examples."""
    learning_rate: float = 5e-4
    """Adam learning rate."""
    seed: int = 0
    """Seed of the LoRA initialisation."""


def process_example(english: str, pig_latin: str, tokenizer) -> types.Datum:
    prompt_tokens = tokenizer.encode(f"English: {english}\nPig Latin:", add_special_tokens=True)
    completion_tokens = tokenizer.encode(f" {pig_latin}\n\n", add_special_tokens=False)
    tokens = prompt_tokens + completion_tokens
    weights = [0] * len(prompt_tokens) + [1] * len(completion_tokens)
    # Next-token prediction: inputs drop the last token, targets drop the first.
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens=tokens[:-1]),
        loss_fn_inputs=dict(weights=weights[1:], target_tokens=tokens[1:]),
    )


def main(config: Config) -> list[float]:
    service_client = tinker.ServiceClient()
    print("Available models:", ", ".join(m.model_name or "" for m in service_client.get_server_capabilities().supported_models))
    training_client = service_client.create_lora_training_client(
        base_model=config.model_name, rank=config.rank, seed=config.seed
    )
    tokenizer = training_client.get_tokenizer()
    data = [process_example(en, pl, tokenizer) for en, pl in EXAMPLES]

    losses = []
    for step in range(config.steps):
        # Submit both requests before waiting: they run back to back on the engine.
        fwdbwd_future = training_client.forward_backward(data, "cross_entropy")
        optim_future = training_client.optim_step(types.AdamParams(learning_rate=config.learning_rate))
        fwdbwd_result, _ = fwdbwd_future.result(), optim_future.result()
        logprobs = np.concatenate([out["logprobs"].tolist() for out in fwdbwd_result.loss_fn_outputs])
        weights = np.concatenate([d.loss_fn_inputs["weights"].tolist() for d in data])
        losses.append(float(-np.dot(logprobs, weights) / weights.sum()))
        print(f"step {step}: loss per token {losses[-1]:.4f}")

    sampling_client = training_client.save_weights_and_get_sampling_client(name="pig-latin-model")
    prompt = types.ModelInput.from_ints(tokenizer.encode("English: coffee break\nPig Latin:"))
    params = types.SamplingParams(max_tokens=20, temperature=0.0, stop=["\n"])
    result = sampling_client.sample(prompt=prompt, sampling_params=params, num_samples=8).result()
    print("Responses:")
    for i, seq in enumerate(result.sequences):
        print(f"{i}: {tokenizer.decode(seq.tokens)!r}")
    return losses


if __name__ == "__main__":
    run_recipe(main)
