"""Diagnostics of the policy update and the KL penalty against a reference model.

With q the sampler's logprob and p the learner's logprob of each sampled (action) token, and d = q − p:

- ``kl_sample_train_v1`` = mean(d): an unbiased estimate of KL(sampler ‖ learner) (can be negative per batch);
- ``kl_sample_train_v2`` = ½ · mean(d²): a low-variance, always non-negative estimate (Schulman, "Approximating
  KL divergence", 2020);
- ``entropy`` = −mean(q): the sampled tokens' mean negative logprob, an estimate of the per-token entropy.

All means are over action tokens (``mask`` = 1) of all datums together.
"""

from __future__ import annotations

import asyncio

import numpy as np

from tinker_cookbook import tinker


def _masked_arrays(data_D: list[tinker.Datum], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``key`` and ``mask`` of all datums, concatenated."""
    values = [d.loss_fn_inputs[key].to_numpy().astype(np.float64) for d in data_D]
    masks = [d.loss_fn_inputs["mask"].to_numpy().astype(np.float64) for d in data_D]
    if not values:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(values), np.concatenate(masks)


def compute_kl_sample_train(
    data_D: list[tinker.Datum], training_logprobs_D: list[np.ndarray]
) -> dict[str, float]:
    """KL estimators between the sampler and the learner, and the sampled-token entropy (see module docstring)."""
    sampled, mask = _masked_arrays(data_D, "logprobs")
    if len(training_logprobs_D) != len(data_D):
        raise ValueError(f"got {len(training_logprobs_D)} training logprob arrays for {len(data_D)} datums")
    trained = np.concatenate([np.asarray(t, dtype=np.float64) for t in training_logprobs_D]) if data_D else sampled
    if trained.shape != sampled.shape:
        raise ValueError(f"training logprobs have {trained.shape[0]} tokens, sampled ones {sampled.shape[0]}")
    n = mask.sum()
    if n == 0:
        return {}
    diff = (sampled - trained) * mask
    return {
        "optim/kl_sample_train_v1": float(diff.sum() / n),
        "optim/kl_sample_train_v2": float(0.5 * (diff**2).sum() / n),
        "optim/entropy": float(-(sampled * mask).sum() / n),
    }


def discounted_future_sum(values_T: np.ndarray, gamma: float) -> np.ndarray:
    """out[t] = Σ_{k ≥ t} gamma^(k−t) · values[k]."""
    out = np.zeros_like(values_T, dtype=np.float64)
    running = 0.0
    for t in range(len(values_T) - 1, -1, -1):
        running = float(values_T[t]) + gamma * running
        out[t] = running
    return out


async def compute_reference_logprobs(
    data_D: list[tinker.Datum], reference_client: tinker.SamplingClient
) -> list[np.ndarray]:
    """The reference model's logprob of each target token of each datum (all requests sent concurrently)."""

    async def one(datum: tinker.Datum) -> np.ndarray:
        targets = datum.loss_fn_inputs["target_tokens"].to_numpy().tolist()
        full = datum.model_input.append_int(int(targets[-1]))
        logprobs = await reference_client.compute_logprobs_async(full)
        # Entry k is the logprob of full[k] given full[:k]; targets are full[1:], so drop the leading None.
        return np.asarray(logprobs[1:], dtype=np.float64)

    return list(await asyncio.gather(*(one(d) for d in data_D)))


def apply_kl_penalty(
    data_D: list[tinker.Datum], reference_logprobs_D: list[np.ndarray], kl_penalty_coef: float,
    kl_discount_factor: float = 0.0,
) -> tuple[list[tinker.Datum], dict[str, float]]:
    """Datums whose advantages include a penalty for moving away from the reference model.

    Per action token d = q − log p_ref (q = sampled logprob). With avg = mean(d) over all action tokens of the batch,
    each action token's advantage gets ``coef · (avg − d)`` (optionally summed over the future with discount
    ``kl_discount_factor``): tokens that are likelier under the policy than under the reference are pushed down,
    and the batch-mean term keeps the total advantage unchanged. Logs ``kl_policy_base`` = avg.
    """
    diffs_D, masks_D = [], []
    for datum, ref in zip(data_D, reference_logprobs_D, strict=True):
        sampled = datum.loss_fn_inputs["logprobs"].to_numpy().astype(np.float64)
        mask = datum.loss_fn_inputs["mask"].to_numpy().astype(np.float64)
        if ref.shape != sampled.shape:
            raise ValueError(f"reference logprobs have {ref.shape[0]} tokens, the datum {sampled.shape[0]}")
        diffs_D.append((sampled - ref) * mask)
        masks_D.append(mask)
    total_mask = sum(float(m.sum()) for m in masks_D)
    if total_mask == 0:
        return data_D, {}
    avg = sum(float(d.sum()) for d in diffs_D) / total_mask
    new_data: list[tinker.Datum] = []
    for datum, diff, mask in zip(data_D, diffs_D, masks_D, strict=True):
        bonus = kl_penalty_coef * mask * (avg - diff)
        if kl_discount_factor > 0:
            bonus = discounted_future_sum(bonus, kl_discount_factor) * mask
        advantages = datum.loss_fn_inputs["advantages"].to_numpy().astype(np.float64) + bonus
        inputs = dict(datum.loss_fn_inputs)
        inputs["advantages"] = tinker.TensorData.from_numpy(advantages.astype(np.float32))
        new_data.append(tinker.Datum(model_input=datum.model_input, loss_fn_inputs=inputs))
    return new_data, {"kl_policy_base": avg}


async def incorporate_kl_penalty(
    data_D: list[tinker.Datum], reference_client: tinker.SamplingClient, kl_penalty_coef: float,
    kl_discount_factor: float = 0.0,
) -> tuple[list[tinker.Datum], dict[str, float]]:
    """``apply_kl_penalty`` with reference logprobs computed through ``reference_client.compute_logprobs``."""
    reference_logprobs_D = await compute_reference_logprobs(data_D, reference_client)
    return apply_kl_penalty(data_D, reference_logprobs_D, kl_penalty_coef, kl_discount_factor)
