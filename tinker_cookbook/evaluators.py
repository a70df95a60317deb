"""Evaluator interfaces at the path the Tinker docs import them from (``tinker_cookbook.evaluators``).

The definitions live in :mod:`tinker_cookbook.eval.evaluators`.
"""

from tinker_cookbook.eval.evaluators import (
    EvaluatorBuilder,
    SamplingClientEvaluator,
    SamplingClientEvaluatorBuilder,
    TrainingClientEvaluator,
)

__all__ = ["EvaluatorBuilder", "SamplingClientEvaluator", "SamplingClientEvaluatorBuilder", "TrainingClientEvaluator"]
