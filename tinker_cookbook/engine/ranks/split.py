"""Splitting a request's work over the ranks: parts of nearly equal cost (tokens for training, tokens to
prefill and decode for sampling)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def balanced_shards(costs: Sequence[int], parts: int) -> list[list[int]]:
    """The indices of ``costs`` in ``parts`` groups of nearly equal total cost, each group's indices ascending.

    Largest first, each item goes to the group with the least cost so far (ties: the lower rank), which keeps the
    largest group within the largest single item of the mean. A step takes as long as its slowest rank, so a split
    by datum count (RL rollouts of very different lengths) would leave ranks idle. Deterministic.
    """
    if parts < 1:
        raise ValueError(f"parts={parts} must be at least 1")
    heap = [(0, rank) for rank in range(parts)]
    groups: list[list[int]] = [[] for _ in range(parts)]
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, rank = heapq.heappop(heap)
        groups[rank].append(index)
        heapq.heappush(heap, (load + max(int(costs[index]), 0), rank))
    return [sorted(group) for group in groups]
