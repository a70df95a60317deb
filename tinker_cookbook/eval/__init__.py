"""Evaluators that run inside the training loops (inline evals) or on saved checkpoints (offline evals)."""
