"""The Direct Preference Optimization loop: ``Config`` + ``main``.

    python -m recipes.preference.dpo.train                     # the recipe over this loop (see its docstring)

DPO (Rafailov et al., 2023, https://arxiv.org/abs/2305.18290) trains the policy pi_theta directly on pairs
(prompt x, chosen y_c, rejected y_r), with the initial model as the reference pi_ref:

    loss = mean over pairs of  -log sigmoid( beta * [ (log pi_theta - log pi_ref)(y_c | x)
                                                      - (log pi_theta - log pi_ref)(y_r | x) ] )

where log pi(y | x) is the sum of the logprobs of the completion's tokens (the prompt is not scored).

Mechanics, all through the public API:

- Reference logprobs come from ``compute_logprobs`` on a sampling client of the initial weights (the base model,
  or ``load_checkpoint_path``), once per distinct sequence: ``ReferenceLogprobs`` caches the sums, so later epochs
  and repeated evaluations never recompute them.
- Each step is one ``forward_backward_custom`` with the DPO loss, then ``optim_step`` at
  ``learning_rate * schedule(step)``.
- Metrics per step (docs' names): ``dpo_loss``, ``accuracy`` (fraction of pairs whose chosen reward is higher;
  an exact tie counts one half), ``margin`` (mean of chosen_reward - rejected_reward), ``chosen_reward`` and ``rejected_reward`` (means of
  beta * (log pi_theta - log pi_ref)), ``num_pairs``, ``num_tokens``, ``learning_rate``, ``progress``, ``epoch``,
  ``time/...``, and ``reference/num_computed`` (sequences whose reference logprobs were computed so far in this
  process; it stops growing after the first epoch). All are measured on the weights before the step's update.
- The test pairs are evaluated (``test/dpo_loss``, ``test/accuracy``, ``test/margin``, ``test/chosen_reward``,
  ``test/rejected_reward``, ``test/num_pairs``) every ``eval_every`` steps, before the step of that row, and on
  the final model in the last row of a finished run. Both policy and reference logprobs of the test pairs come from
  ``compute_logprobs`` (on a snapshot of the current weights), so at step 0 every margin is exactly 0.

Steps, epochs, checkpoints, resuming, ``log_path`` files and the log-dir policy are those of every loop
(``tinker_cookbook.run_core``) and match the supervised loop's: a checkpoint named ``%06d`` of step ``s`` holds the
state after ``s`` steps; a run stopped by ``max_steps`` resumes exactly; a finished run is a no-op when run again.
The reference is always the initial model, also after resuming.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import chz
import numpy as np
import torch
import torch.nn.functional as F

from tinker_cookbook import cli_utils, run_core, tinker
from tinker_cookbook.eval.evaluators import SamplingClientEvaluator
from tinker_cookbook.exceptions import ConfigurationError, TrainingError
from tinker_cookbook.preference.preference_datasets import DPODatasetBuilder
from tinker_cookbook.supervised.types import SupervisedDataset
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.training_client import CustomLossFn
from tinker_cookbook.utils.misc_utils import timed

logger = logging.getLogger(__name__)

DPO_METRICS = ("dpo_loss", "accuracy", "margin", "chosen_reward", "rejected_reward", "num_pairs")


@chz.chz
class Config(run_core.EpochRunConfig):
    """DPO training of a LoRA adapter (the reference model is the initial one: the base or ``load_checkpoint_path``)."""

    dataset_builder: DPODatasetBuilder
    """Builds the train (and optional test) comparison pairs."""
    learning_rate: float = 1e-5
    """Peak learning rate of AdamW."""
    dpo_beta: float = 0.1
    """beta of the DPO loss: how far the policy may move from the reference for a given preference margin."""

    @chz.validate
    def _check(self) -> None:
        run_core.check_learning_rate(self.learning_rate)
        if not (math.isfinite(self.dpo_beta) and self.dpo_beta > 0):
            raise ValueError(f"dpo_beta={self.dpo_beta} must be a positive finite number, such as 0.1")


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The DPO loss of a batch of pairs, and its metrics.

    Inputs are per-pair sequence logprobs (sums over completion tokens), shape ``[P]``. With the implicit rewards
    ``r_c = beta * (chosen_logps - ref_chosen_logps)`` and ``r_r = beta * (rejected_logps - ref_rejected_logps)``:

    - ``dpo_loss`` = mean(-log sigmoid(r_c - r_r)) (the returned tensor);
    - ``accuracy`` = mean(1[r_c > r_r] + 1/2 * 1[r_c == r_r]): a tie, which only the initial model itself produces
      (policy = reference), is a coin flip rather than a miss;
    - ``margin`` = mean(r_c - r_r), ``chosen_reward`` = mean(r_c), ``rejected_reward`` = mean(r_r) (beta applied
      once, in the rewards), ``num_pairs`` = P.
    """
    chosen_rewards = beta * (chosen_logps - ref_chosen_logps)
    rejected_rewards = beta * (rejected_logps - ref_rejected_logps)
    margins = chosen_rewards - rejected_rewards
    loss = -F.logsigmoid(margins).mean()
    wins = (margins > 0).double() + 0.5 * (margins == 0).double()
    metrics = {
        "dpo_loss": float(loss.detach()),
        "accuracy": float(wins.mean()),
        "margin": float(margins.detach().mean()),
        "chosen_reward": float(chosen_rewards.detach().mean()),
        "rejected_reward": float(rejected_rewards.detach().mean()),
        "num_pairs": len(margins),
    }
    return loss, metrics


def split_pairs(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen, rejected)`` of an interleaved ``[c0, r0, c1, r1, ...]`` tensor."""
    if len(values) % 2:
        raise TrainingError(f"a DPO batch interleaves chosen and rejected datums, so it must be even; got {len(values)}")
    return values[0::2], values[1::2]


def dpo_loss_from_sums(
    policy_sums: torch.Tensor, reference_sums: Sequence[float], beta: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """``dpo_loss`` of an interleaved batch, given each datum's policy and reference completion logprob."""
    policy_chosen, policy_rejected = split_pairs(policy_sums)
    ref_chosen, ref_rejected = split_pairs(torch.tensor(reference_sums, dtype=torch.float64))
    return dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)


def sequence_logprobs(logprobs: Sequence[torch.Tensor], data: Sequence[types.Datum]) -> torch.Tensor:
    """``sum(weights * logprobs)`` of each datum (the completion's logprob; DPO weights are 1 on it, 0 elsewhere),
    in float64 so that long completions lose no precision in the sum."""
    weights = [d.loss_fn_inputs["weights"].to_torch().double() for d in data]
    return torch.stack([(lp.double() * w).sum() for lp, w in zip(logprobs, weights, strict=True)])


# ---------------------------------------------------------------------------------------------------------
# Reference logprobs
# ---------------------------------------------------------------------------------------------------------


def full_sequence(datum: types.Datum) -> types.ModelInput:
    """The whole sequence a datum was made from: its inputs plus the last target token."""
    return datum.model_input.append_int(int(datum.loss_fn_inputs["target_tokens"].tolist()[-1]))


def _weighted_sum(datum: types.Datum, logprobs: Sequence[float | None]) -> float:
    # compute_logprobs scores every position of the full sequence (the first has no logprob), so target i of the
    # datum is position i + 1.
    weights = datum.loss_fn_inputs["weights"].to_numpy().astype(np.float64)
    scored = logprobs[1:]
    if len(scored) != len(weights):
        raise TrainingError(f"compute_logprobs returned {len(logprobs)} values for a {len(weights) + 1}-token sequence")
    total = 0.0
    for lp, w in zip(scored, weights, strict=True):
        if w != 0:
            if lp is None:
                raise TrainingError("compute_logprobs returned no logprob for a completion token")
            total += float(w) * lp
    return total


async def compute_sequence_logprobs(sampling_client: tinker.SamplingClient, data: Sequence[types.Datum]) -> list[float]:
    """Each datum's ``sum(weights * logprobs)`` under the sampling client's weights, via ``compute_logprobs``.

    All requests are queued before any is awaited, so the engine batches them.
    """
    results = await asyncio.gather(*(sampling_client.compute_logprobs_async(full_sequence(d)) for d in data))
    return [_weighted_sum(datum, logprobs) for datum, logprobs in zip(data, results, strict=True)]


def _sequence_key(datum: types.Datum) -> bytes:
    digest = hashlib.sha256()
    for name in ("target_tokens", "weights"):
        digest.update(datum.loss_fn_inputs[name].to_numpy().tobytes())
    digest.update(repr(datum.model_input.chunks).encode())
    return digest.digest()


class ReferenceLogprobs:
    """The reference model's completion logprob of each sequence, computed once per distinct sequence and cached
    (a digest of its tokens and weights is the key), so epochs and evaluations after the first cost nothing.

    ``num_computed`` counts the sequences sent to ``compute_logprobs``.
    """

    def __init__(self, sampling_client: tinker.SamplingClient) -> None:
        self.sampling_client = sampling_client
        self._sums: dict[bytes, float] = {}
        self.num_computed = 0

    async def sums(self, data: Sequence[types.Datum]) -> list[float]:
        keys = [_sequence_key(d) for d in data]
        missing = {key: datum for key, datum in zip(keys, data, strict=True) if key not in self._sums}
        computed = await compute_sequence_logprobs(self.sampling_client, list(missing.values()))
        self._sums.update(zip(missing, computed, strict=True))
        self.num_computed += len(missing)
        return [self._sums[key] for key in keys]


class DPOEvaluator(SamplingClientEvaluator):
    """Implicit-reward metrics of held-out pairs: ``{name}/dpo_loss``, ``/accuracy``, ``/margin``, ...

    Policy and reference logprobs both come from ``compute_logprobs`` (the same engine and numerics), on a
    sampling client of the current weights and of the initial ones; at step 0 every margin is exactly 0.
    """

    def __init__(self, data: Sequence[types.Datum], reference: ReferenceLogprobs, beta: float, name: str = "test"
                 ) -> None:
        if not data or len(data) % 2:
            raise ValueError(f"DPOEvaluator {name!r} needs a non-empty, interleaved list of pairs; got {len(data)} datums")
        self.data = list(data)
        self.reference = reference
        self.beta = beta
        self.name = name

    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        reference_sums = await self.reference.sums(self.data)
        policy_sums = await compute_sequence_logprobs(sampling_client, self.data)
        _, metrics = dpo_loss_from_sums(torch.tensor(policy_sums, dtype=torch.float64), reference_sums, self.beta)
        return {f"{self.name}/{key}": value for key, value in metrics.items()}


# ---------------------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------------------


def _reference_sampling_client(service_client: tinker.ServiceClient, config: Config) -> tinker.SamplingClient:
    """A sampling client of the initial weights, also when the run resumes from trained ones."""
    if config.load_checkpoint_path is None:
        return service_client.create_sampling_client(base_model=config.model_name)
    initial = service_client.create_training_client_from_state(config.load_checkpoint_path)
    return initial.save_weights_and_get_sampling_client()


def _with_renderer_name(config: Config) -> Config:
    """``renderer_name`` resolved from the dataset builder, which renders the data; a conflict is an error."""
    data_renderer = config.dataset_builder.renderer_name
    if config.renderer_name is None:
        return chz.replace(config, renderer_name=data_renderer)
    if config.renderer_name != data_renderer:
        raise ConfigurationError(
            f"renderer_name={config.renderer_name!r} differs from the dataset's renderer {data_renderer!r}; set "
            "dataset_builder.common_config.renderer_name to the same value"
        )
    return config


# ---------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------


def make_dpo_loss_fn(reference_sums: Sequence[float], beta: float) -> CustomLossFn:
    """The ``forward_backward_custom`` loss of an interleaved batch whose reference sums are ``reference_sums``."""

    def loss_fn(data: list[types.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        return dpo_loss_from_sums(sequence_logprobs(logprobs, data), reference_sums, beta)

    return loss_fn


async def train_step(
    training_client: tinker.TrainingClient, data: list[types.Datum], reference_sums: list[float], beta: float,
    adam_params: types.AdamParams,
) -> dict[str, float]:
    """One DPO step: ``forward_backward_custom`` with the DPO loss, then ``optim_step`` (queued back to back)."""
    fwd_bwd = await training_client.forward_backward_custom_async(data, make_dpo_loss_fn(reference_sums, beta))
    optim = await training_client.optim_step_async(adam_params)
    output = await fwd_bwd.result_async()
    optim_metrics = (await optim.result_async()).metrics or {}
    metrics = {key: output.metrics[key] for key in DPO_METRICS}
    metrics["num_pairs"] = len(data) // 2  # an int in the logs (the engine reports every metric as a float)
    return {**metrics, **{f"optim/{k}": v for k, v in optim_metrics.items()}}


async def _train(run: run_core.Run, config: Config, batches: run_core.EpochBatches, reference: ReferenceLogprobs,
                 evaluators: run_core.Evaluators) -> None:
    plan, training_client = run.plan, run.training_client
    for step in range(plan.start_step, plan.end_step):
        start = time.perf_counter()
        epoch, _ = plan.position(step)
        metrics: dict[str, Any] = {"epoch": epoch, "progress": (step + 1) / plan.total_steps}
        # Everything queued so far ends with step - 1's optim_step: saves and evals see the weights after `step` steps.
        pending_save = run.start_checkpoint_if_due(step)
        with timed("evals", metrics):
            metrics.update(await run_core.run_evaluators(evaluators.before_step(plan, step), training_client))
        data = batches.get(step)
        with timed("reference", metrics), run.phase("reference"):
            reference_sums = await reference.sums(data)
        metrics["reference/num_computed"] = reference.num_computed  # stays flat once every pair has been seen
        lr = config.learning_rate * config.lr_multiplier(plan, step)
        with timed("train_step", metrics), run.phase("training"):
            metrics.update(await train_step(training_client, data, reference_sums, config.dpo_beta,
                                            config.adam_params(lr)))
        metrics.update(learning_rate=lr, num_tokens=sum(d.model_input.length for d in data))
        if pending_save is not None:
            await pending_save.finish_async()
        if step == plan.end_step - 1:
            await _finish_run(run, evaluators, metrics)
        metrics["time/total"] = time.perf_counter() - start
        metrics["perf/tokens_per_s"] = metrics["num_tokens"] / max(metrics["time/total"], 1e-9)
        run.ml_logger.log_metrics(metrics, step=step)


async def _finish_run(run: run_core.Run, evaluators: run_core.Evaluators, metrics: dict[str, Any]) -> None:
    """The last checkpoint and, when the run is finished, the final model's evaluations (into the last row)."""
    pending = run.start_last_checkpoint()
    if run.plan.finished:
        with timed("evals", metrics):
            metrics.update(await run_core.run_evaluators(evaluators.after_run(run.plan), run.training_client))
    row = await pending.finish_async()
    what = "finished" if run.plan.finished else f"stopped at max_steps={run.config.max_steps}"
    logger.info("DPO training %s after %d steps; last checkpoint %s", what, run.plan.end_step, row.get("state_path"))


def _build_evaluators(
    config: Config, test_dataset: SupervisedDataset | None, reference: ReferenceLogprobs
) -> run_core.Evaluators:
    evaluators = run_core.Evaluators(log_path=config.log_path)
    if test_dataset is not None:
        test_data = [datum for i in range(len(test_dataset)) for datum in test_dataset.get_batch(i)]
        evaluators.add(config.eval_every, [DPOEvaluator(test_data, reference, config.dpo_beta)])
    evaluators.add(config.eval_every, [builder() for builder in config.evaluator_builders])
    return evaluators


async def main(config: Config) -> None:
    """Train per ``config``; see the module docstring for the loss, metrics, checkpoints and resuming."""
    config = _with_renderer_name(config)
    opened = await run_core.open_epoch_run(config, config.dataset_builder)
    if opened is None:
        return
    run, train_dataset, test_dataset = opened
    with run:
        logger.info("DPO with beta %g against the initial model as the reference", config.dpo_beta)
        reference = ReferenceLogprobs(_reference_sampling_client(run.service_client, config))
        evaluators = _build_evaluators(config, test_dataset, reference)
        await _train(run, config, run_core.EpochBatches(train_dataset, run.plan), reference, evaluators)


def run(config: Config) -> None:
    """Train per ``config`` from synchronous code (a script, a notebook): ``main`` run to the end."""
    run_core.run_sync(main, config)


def cli_main(config: Config) -> None:
    run(config)


if __name__ == "__main__":
    cli_utils.run_recipe(cli_main)
