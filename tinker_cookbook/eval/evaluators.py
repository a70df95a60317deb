"""The two evaluator interfaces the training loops call, and the builder aliases their configs hold.

- ``TrainingClientEvaluator``: needs the training client itself, e.g. a held-out loss computed with ``forward``
  (``supervised.nll_evaluator.NLLEvaluator``). It sees the weights after every request submitted before it.
- ``SamplingClientEvaluator``: needs only a sampling client, e.g. generate answers and grade them. The loops hand
  it a sampling client on a snapshot of the current weights.

Configs hold *builders* (zero-argument callables returning an evaluator) rather than evaluators, so that configs
stay serializable and heavy objects (datasets, tokenizers) are made only when the run starts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TypeAlias

from tinker_cookbook import tinker


class _RunFiles:
    """What every evaluator may do with the directory of the run it is attached to."""

    def attach_to_run(self, log_path: str) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Called by the training loop with the run's ``log_path`` before the first evaluation: an evaluator that
        writes files of its own (logs, transcripts) puts them there unless told otherwise."""


class TrainingClientEvaluator(_RunFiles, ABC):
    """An evaluation that runs requests on the training client (``forward``) and returns named metrics."""

    @abstractmethod
    async def __call__(self, training_client: tinker.TrainingClient) -> dict[str, float]:
        """Metrics such as ``{"test/nll": 1.23}``."""


class SamplingClientEvaluator(_RunFiles, ABC):
    """An evaluation that samples from the model and returns named metrics."""

    @abstractmethod
    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        """Metrics such as ``{"gsm8k/accuracy": 0.41}``."""


Evaluator: TypeAlias = TrainingClientEvaluator | SamplingClientEvaluator
EvaluatorBuilder: TypeAlias = Callable[[], Evaluator]
SamplingClientEvaluatorBuilder: TypeAlias = Callable[[], SamplingClientEvaluator]
