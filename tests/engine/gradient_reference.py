"""Gradients of a built-in loss by plain autograd through the model, datum by datum: the reference that the
engine's batched, padded, chunked passes are compared with."""

from __future__ import annotations

from typing import Any

import torch

from tinker_cookbook.engine.training import losses
from tinker_cookbook.tinker import types


def pending_gradients(session: Any) -> dict[str, torch.Tensor]:
    """The gradients the session has accumulated (copies)."""
    return {k: p.grad.clone() for k, p in session.params.items() if p.grad is not None}


def direct_gradients(session: Any, data: list[types.Datum], loss_fn: str) -> dict[str, torch.Tensor]:
    """The session's adapter's gradients of ``loss_fn`` summed over ``data``, each datum in its own plain forward
    (the session's pending gradients are replaced)."""
    for p in session.params.values():
        p.grad = None
    spec, config = losses.get_loss(loss_fn), losses.resolve_config(loss_fn, None)
    model = session.base.activate(session.run_id)
    for d in data:
        hidden = model.model(input_ids=torch.tensor([d.model_input.to_ints()])).last_hidden_state[0]
        logits = model.get_output_embeddings()(hidden).float()
        inputs = {k: v.to_torch() for k, v in d.loss_fn_inputs.items()}
        logp = torch.log_softmax(logits, -1).gather(-1, inputs["target_tokens"][:, None]).squeeze(-1)
        if spec.sequence_inputs is not None:  # GSPO: its sequence ratio over this whole datum, in one piece
            inputs.update(spec.sequence_inputs(logp.detach(), inputs))
        spec.fn(logp, inputs, config).backward()
    return pending_gradients(session)


def relative_difference(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """|ours - reference| / |reference| over all tensors together.

    Not per tensor: lm_head's LoRA A gradient is a sum of nearly cancelling terms (norm ~1e-3 of the others'), so
    its own relative rounding error is large on a tiny norm."""
    assert ours.keys() == reference.keys()
    difference = torch.cat([(ours[k] - reference[k]).flatten() for k in ours])
    scale = torch.cat([reference[k].flatten() for k in ours])
    return float(difference.norm() / scale.norm())
