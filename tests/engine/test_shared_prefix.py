"""Rows of one pass that start with the same tokens run that prefix through the decoder once (``passes.decoder_hidden``).

RL batches are made of this: every sample of a prompt, and often every prompt (system prompt, few-shot examples),
begins the same way. Values and gradients must be those of separate passes, to fp32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gradient_reference import direct_gradients, pending_gradients, relative_difference

from tinker_cookbook import tinker
from tinker_cookbook.engine.training.passes import MIN_SHARED_PREFIX, shared_prefix_length
from tinker_cookbook.tinker import types

MODELS = ["tinker-cookbook/tiny-smollm2", "tinker-cookbook/tiny-qwen3"]


def test_shared_prefix_length() -> None:
    prefix = list(range(100, 100 + MIN_SHARED_PREFIX + 4))
    assert shared_prefix_length([prefix + [1, 2], prefix + [3]]) == len(prefix)
    # Every row keeps at least one token of its own, so a row that is all prefix shortens the shared part.
    assert shared_prefix_length([prefix, prefix + [3, 4]]) == len(prefix) - 1
    # Too short a common start, a single row, or a difference early on: no sharing.
    short = prefix[: MIN_SHARED_PREFIX - 1]
    assert shared_prefix_length([short + [1, 2, 3], short + [4, 5, 6]]) == 0
    assert shared_prefix_length([prefix + [1]]) == 0
    assert shared_prefix_length([[7] + prefix, [8] + prefix]) == 0


def _rl_batch(seed: int, prompt_len: int = 24, groups: int = 2, samples: int = 3) -> list[types.Datum]:
    """``groups`` prompts that share a 20-token system prefix, ``samples`` replies each, advantages on replies."""
    rng = np.random.default_rng(seed)
    system = rng.integers(5, 2000, size=20).tolist()
    data = []
    for _ in range(groups):
        prompt = system + rng.integers(5, 2000, size=prompt_len - 20).tolist()
        for _ in range(samples):
            reply = rng.integers(5, 2000, size=int(rng.integers(2, 7))).tolist()
            tokens = prompt + reply
            n = len(tokens) - 1
            advantages = [0.0] * (len(prompt) - 1) + rng.normal(size=len(reply)).round(2).tolist()
            data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                    loss_fn_inputs=dict(target_tokens=tokens[1:], logprobs=[-3.0] * n,
                                                        advantages=advantages)))
    return data


@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("loss_fn", ["importance_sampling", "dro"])
def test_shared_prefix_pass_equals_separate_passes(model_name: str, loss_fn: str) -> None:
    """Logprobs against each datum's own forward (the same matmuls on fewer rows: fp32 rounding, ~1e-6 of
    logprobs ~10; bound 1e-4), and the gradient against autograd of the loss through the model datum by datum
    (rounding only: ~1e-6 of the gradient's norm over all tensors; bound 2e-5, not per tensor because lm_head's
    LoRA A gradient is a sum of nearly cancelling terms). The decoder must really have run fewer positions."""
    service = tinker.ServiceClient()
    tc = service.create_lora_training_client(base_model=model_name, rank=4, seed=5)
    tc.forward_backward(_rl_batch(0), "importance_sampling").result()  # LoRA B off zero
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    session = tc._backend._session(tc.model_id)  # white-box: gradients and the decoder's position count
    data = _rl_batch(1)

    alone = [tc.forward([d], loss_fn).result().loss_fn_outputs[0]["logprobs"].to_torch() for d in data]
    before = session.base.decoder_positions
    out = tc.forward_backward(data, loss_fn).result()
    run = session.base.decoder_positions - before
    widest = max(d.model_input.length for d in data)
    assert run <= len(data) * widest - (len(data) - 1) * 20  # the 20-token system prefix ran once (or less)
    for got, want in zip(out.loss_fn_outputs, alone, strict=True):
        torch.testing.assert_close(got["logprobs"].to_torch(), want, rtol=0, atol=1e-4)
    ours = pending_gradients(session)
    assert relative_difference(ours, direct_gradients(session, data, loss_fn)) < 2e-5
    tc.close()
