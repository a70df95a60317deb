"""Reinforcement learning: env abstractions, rollouts, data processing, metrics and the training loop.

The production loop is ``tinker_cookbook.rl.train``; ``recipes/rl_loop.py`` is its flat, pedagogical twin on the
raw API.
"""
