"""Held-out negative log-likelihood, computed with ``forward`` on the training client (no gradients)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tinker_cookbook import tinker
from tinker_cookbook.eval.evaluators import TrainingClientEvaluator
from tinker_cookbook.supervised.common import compute_mean_nll
from tinker_cookbook.supervised.types import SupervisedDataset
from tinker_cookbook.tinker import types


class NLLEvaluator(TrainingClientEvaluator):
    """``{name}/nll`` = ``-sum(w * logp) / sum(w)`` over every datum, the same quantity as ``train_mean_nll``.

    The data is sent in requests of at most ``max_batch_size`` datums (bounding the engine's memory); they are
    all queued before any is awaited, so they run back to back, ordered after earlier training requests.
    """

    def __init__(self, data: Sequence[types.Datum], name: str = "test", max_batch_size: int = 32) -> None:
        if not data:
            raise ValueError(f"NLLEvaluator {name!r} needs at least one datum")
        if max_batch_size <= 0:
            raise ValueError(f"max_batch_size={max_batch_size} must be positive")
        self.data = list(data)
        self.name = name
        self.max_batch_size = max_batch_size

    @classmethod
    def from_dataset(cls, dataset: SupervisedDataset, name: str = "test", max_batch_size: int = 32) -> NLLEvaluator:
        """All batches of ``dataset`` (in its current order) as one evaluation set."""
        data = [datum for i in range(len(dataset)) for datum in dataset.get_batch(i)]
        return cls(data, name=name, max_batch_size=max_batch_size)

    async def __call__(self, training_client: tinker.TrainingClient) -> dict[str, float]:
        chunks = [self.data[i : i + self.max_batch_size] for i in range(0, len(self.data), self.max_batch_size)]
        futures = [await training_client.forward_async(chunk, "cross_entropy") for chunk in chunks]
        logprobs: list[Any] = []
        weights: list[Any] = []
        for chunk, future in zip(chunks, futures, strict=True):
            output = await future.result_async()
            logprobs.extend(out["logprobs"] for out in output.loss_fn_outputs)
            weights.extend(datum.loss_fn_inputs["weights"] for datum in chunk)
        return {f"{self.name}/nll": compute_mean_nll(logprobs, weights)}
