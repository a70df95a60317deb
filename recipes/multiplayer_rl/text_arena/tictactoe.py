"""Tic-tac-toe's fixed players under the official cookbook's names: a random player, a perfect (minimax) player,
and the base model, made by name with ``make_opponent``.

The players are library code (``tinker_cookbook.rl.multiturn.text_arena``), shared with the recipe's test set
(``dataset_builder.test_opponents``); this module names them as the official recipe does.
"""

from __future__ import annotations

from typing import Literal

from tinker_cookbook.completers import MessageCompleter, StopCondition
from tinker_cookbook.renderers import Renderer
from tinker_cookbook.rl.multiturn import text_arena
from tinker_cookbook.rl.multiturn.text_arena import OptimalOpponent, RandomOpponent, minimax, read_board

__all__ = ["OpponentType", "OptimalOpponent", "RandomOpponent", "make_opponent", "minimax", "read_board"]

OpponentType = Literal["base_model", "random", "optimal"]


def make_opponent(opponent_type: OpponentType, model_name: str, renderer: Renderer, base_url: str | None = None,
                  stop_condition: StopCondition | None = None, seed: int | None = None) -> MessageCompleter:
    """``random`` (a random legal move), ``optimal`` (minimax, never loses) or ``base_model`` (``model_name``'s base
    weights, sampled with the game's stop condition). ``base_url`` and ``stop_condition`` are the official
    signature's; the local service needs no URL and the game's stop is ``]``."""
    if opponent_type not in ("base_model", "random", "optimal"):
        raise ValueError(f"opponent_type={opponent_type!r}; choose base_model, random or optimal")
    if stop_condition not in (None, text_arena.STOP_CONDITION):
        raise ValueError(f"stop_condition={stop_condition!r}; the game's replies stop at {text_arena.STOP_CONDITION}")
    kind: text_arena.OpponentKind = "initial" if opponent_type == "base_model" else opponent_type
    return text_arena.make_opponent(kind, model_name, renderer, seed=seed)
