"""Only the positions a loss's gradient can reach go through the unembedding's backward (``LossSpec.reach``).

In RL most positions of a datum are the prompt's, with advantage 0 (in SL, weight 0): the gradient there is
exactly 0, so their logprobs are computed without a graph. These tests check that the gradient is unchanged and
that the unreached positions really skip the head's graph.
"""

from __future__ import annotations

import pytest
import torch
from gradient_reference import direct_gradients, pending_gradients, relative_difference

from tinker_cookbook import tinker
from tinker_cookbook.engine.training import losses
from tinker_cookbook.engine.training.passes import chunk_logprobs, reached_logprobs
from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-smollm2"


class _RecordingHead(torch.nn.Module):
    """A linear head that records how many rows it saw with autograd on."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.rows_with_graph = 0

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            self.rows_with_graph += hidden.shape[0]
        return hidden @ self.weight.T


@pytest.mark.parametrize("candidates", [1, 2])
def test_reached_logprobs_equal_the_full_ones_and_graph_only_reached_rows(candidates: int) -> None:
    """Values: each position's logits come from the same head on the same row, only in a smaller matmul, so they
    agree to fp32 summation-order rounding (~1e-6 of logits ~5; 1e-5 absolute bounds it). Gradients: the
    upstream gradient is 0 off the reached positions (as every loss with a ``reach`` makes it), so d/dhidden and
    d/dweight must equal the full graph's to the same rounding."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 16, generator=generator)
    hidden = torch.randn(40, 16, generator=generator)
    shape = (40, candidates) if candidates > 1 else (40,)
    targets = torch.randint(0, 300, shape, generator=generator)
    reach = torch.zeros(40, dtype=torch.bool)
    reach[[3, 17, 18, 39]] = True
    upstream = torch.randn(shape, generator=generator) * (reach[:, None] if candidates > 1 else reach)

    head = _RecordingHead(weight.clone())
    h = hidden.clone().requires_grad_(True)
    logp = reached_logprobs(head, h, targets, reach)
    (logp * upstream).sum().backward()
    assert head.rows_with_graph == 4

    full_head = _RecordingHead(weight.clone())
    full_h = hidden.clone().requires_grad_(True)
    full = chunk_logprobs(full_head, full_h, targets)
    (full * upstream).sum().backward()
    assert full_head.rows_with_graph == 40

    assert h.grad is not None and full_h.grad is not None
    assert head.weight.grad is not None and full_head.weight.grad is not None
    torch.testing.assert_close(logp.detach(), full.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(h.grad, full_h.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(head.weight.grad, full_head.weight.grad, rtol=1e-5, atol=1e-6)
    assert bool((h.grad[~reach] == 0).all())


def test_no_reached_position_means_no_graph_and_all_reached_means_the_plain_path() -> None:
    generator = torch.Generator().manual_seed(1)
    head = _RecordingHead(torch.randn(50, 8, generator=generator))
    hidden = torch.randn(6, 8, generator=generator, requires_grad=True)
    targets = torch.randint(0, 50, (6,), generator=generator)
    assert not reached_logprobs(head, hidden, targets, torch.zeros(6, dtype=torch.bool)).requires_grad
    assert head.rows_with_graph == 0
    assert reached_logprobs(head, hidden, targets, torch.ones(6, dtype=torch.bool)).requires_grad
    assert head.rows_with_graph == 6


def test_reach_of_each_builtin_loss() -> None:
    inputs = {"weights": torch.tensor([0.0, 1.0, 0.0, -2.0]), "advantages": torch.tensor([0.0, 0.0, 0.5, 0.0])}
    assert losses.LOSSES["cross_entropy"].reach is not None
    assert losses.LOSSES["cross_entropy"].reach(inputs).tolist() == [False, True, False, True]
    for name in ("importance_sampling", "ppo", "cispo", "gspo"):
        reach = losses.LOSSES[name].reach
        assert reach is not None and reach(inputs).tolist() == [False, False, True, False]
    # DRO's quadratic penalty has a gradient at every position.
    assert losses.LOSSES["dro"].reach is None
    candidates = {"weights": torch.tensor([[0.0, 0.0], [0.0, 3.0]])}
    assert losses.LOSSES["cross_entropy"].reach is not None
    assert losses.LOSSES["cross_entropy"].reach(candidates).tolist() == [False, True]


def _rl_datum(tokens: list[int], prompt: int) -> types.Datum:
    n = len(tokens) - 1
    advantages = [0.0] * (prompt - 1) + [0.7, -0.4, 1.1, 0.3, -0.9][: n - prompt + 1]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs=dict(target_tokens=tokens[1:], logprobs=[-2.0] * n, advantages=advantages,
                            weights=[0.0 if a == 0 else 1.0 for a in advantages],
                            sequence_ratio_mask=[0.0 if a == 0 else 1.0 for a in advantages]),
    )


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"])
def test_forward_backward_gradient_equals_direct_autograd_with_unreached_prompt_positions(loss_fn: str) -> None:
    """The whole path (padding, chunks, the reach of each loss) against autograd of the loss through the model on
    each datum alone. Only fp32 rounding of different matmul shapes differs: ~1e-6 of the gradient's norm over all
    tensors (measured at 1, 2 and 4 threads), bounded at 2e-5. Not per tensor: lm_head's LoRA A gradient is a sum
    of nearly cancelling terms (norm ~1e-3 of the others'), so its own relative error is ~1e-2 of a tiny norm."""
    service = tinker.ServiceClient()
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=3)
    warm = [_rl_datum(list(range(5, 17)), prompt=8)]
    tc.forward_backward(warm, "cross_entropy").result()  # move LoRA B off zero so that every tensor has gradient
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    data = [_rl_datum([7 + 3 * i for i in range(14)], prompt=10), _rl_datum([11 + 5 * i for i in range(9)], prompt=5)]
    keep = {"cross_entropy": ("target_tokens", "weights"),
            "gspo": ("target_tokens", "logprobs", "advantages", "sequence_ratio_mask")}.get(
        loss_fn, ("target_tokens", "logprobs", "advantages"))
    data = [types.Datum(model_input=d.model_input, loss_fn_inputs={k: d.loss_fn_inputs[k] for k in keep})
            for d in data]
    tc.forward_backward(data, loss_fn).result()
    session = tc._backend._session(tc.model_id)  # white-box: compare the accumulated gradients
    ours = pending_gradients(session)
    assert len(ours) == len(session.params)
    assert relative_difference(ours, direct_gradients(session, data, loss_fn)) < 2e-5
    tc.close()
