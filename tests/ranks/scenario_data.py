"""The batch, adapter and sampling settings that the 2-rank scenario and its one-process reference share."""

from __future__ import annotations

from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-qwen3"
LORA = types.LoraConfig(rank=4, seed=3)
ADAM = types.AdamParams(learning_rate=1e-2)
GREEDY = types.SamplingParams(max_tokens=5, temperature=0.0)
PROMPTS = [[3, 17, 29, 4], [8, 8, 41, 2, 19, 7]]


def datum(tokens: list[int], weight: float = 1.0) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [weight] * (len(tokens) - 1)})


# Lengths 11, 4, 7, 9, 3 tokens: the token-balanced split gives rank 0 and rank 1 different datum counts.
DATA = [
    datum([5, 9, 14, 3, 8, 22, 31, 7, 12, 40, 2, 6]),
    datum([2, 7, 7, 30, 11]),
    datum([1, 4, 9, 16, 25, 36, 49, 64], 0.5),
    datum([11, 13, 17, 19, 23, 29, 31, 37, 41, 43]),
    datum([60, 61, 62, 63]),
]
