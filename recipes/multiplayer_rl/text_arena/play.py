"""Play tic-tac-toe against a policy on the terminal, or measure it against a fixed player.

    python -m recipes.multiplayer_rl.text_arena.play                                   # you (X) against the base model
    python -m recipes.multiplayer_rl.text_arena.play checkpoint_path=tinker://.../sampler_weights/final human_player_id=1
    python -m recipes.multiplayer_rl.text_arena.play mode=eval opponent=random num_games=20
    python -m recipes.multiplayer_rl.text_arena.play mode=eval opponent=optimal checkpoint_path=tinker://...

The policy is ``checkpoint_path`` (a sampler checkpoint the training recipe saved) or, without one, ``model_name``'s
base weights. ``mode=eval`` plays ``num_games`` games against ``opponent`` (``random``, ``optimal``: minimax, or
``base_model``), the policy taking X in even games and O in odd ones, and prints wins, draws and losses (an
illegal move loses the game). Prompts and move parsing are the training env's (``prompt_for``, ``parse_move``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal

import chz

from recipes.multiplayer_rl.text_arena.tictactoe import OpponentType, make_opponent
from tinker_cookbook import tinker
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.completers import MessageCompleter, TinkerMessageCompleter
from tinker_cookbook.renderers import Message
from tinker_cookbook.rl.multiturn.message_env import renderer_for
from tinker_cookbook.rl.multiturn.text_arena import MARKS, STOP_CONDITION, TicTacToe, parse_move, prompt_for
from tinker_cookbook.rl.problem_env import message_text


class HumanPlayer(MessageCompleter):
    """Shows the prompt (board and legal moves) and reads a move, ``4`` or ``[4]``, from ``read``."""

    def __init__(self, read: Callable[[str], str] = input, show: Callable[[str], None] = print) -> None:
        self.read, self.show = read, show

    async def __call__(self, messages: list[Message]) -> Message:
        self.show(message_text(messages[-1]))
        move = self.read("your move: ").strip()
        return {"role": "assistant", "content": move if move.startswith("[") else f"[{move}]"}


async def play_game(players: Sequence[MessageCompleter], show: Callable[[str], None] | None = None) -> TicTacToe:
    """One game, ``players[0]`` playing X (moving first) and ``players[1]`` O; an unreadable or illegal move ends
    it (``TicTacToe.illegal_by``)."""
    game = TicTacToe()
    while not game.done:
        seat = game.to_move
        reply = message_text(await players[seat]([{"role": "user", "content": prompt_for(game, seat)}]))
        legal = game.play(seat, parse_move(reply))
        if show is not None:
            show(f"{MARKS[seat]}: {reply.strip()}" + ("" if legal else "  (illegal move)"))
    return game


async def evaluate(policy: MessageCompleter, opponent: MessageCompleter, num_games: int) -> Counter[str]:
    """Outcomes for the policy (``win``, ``draw``, ``loss``, ``illegal_move``, and ``win`` when the opponent
    forfeits), taking X in even games and O in odd ones."""
    results: Counter[str] = Counter()
    for g in range(num_games):
        seat = g % 2
        game = await play_game([policy, opponent] if seat == 0 else [opponent, policy])
        outcome = game.outcome(seat)
        results["win" if outcome == "opponent_illegal_move" else str(outcome)] += 1
    return results


@chz.chz
class PlayConfig:
    """Which policy plays, against whom, and how."""

    checkpoint_path: str | None = None
    """A sampler checkpoint (``tinker://...``); None: ``model_name``'s base weights."""
    model_name: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    renderer_name: str | None = None
    mode: Literal["human_vs_model", "eval"] = "human_vs_model"
    opponent: OpponentType = "random"
    """``mode=eval``'s fixed player: random, optimal (minimax) or base_model."""
    human_player_id: int = 0
    """0: you play X and move first; 1: you play O."""
    num_games: int = 20
    max_tokens: int = 8
    temperature: float = 1.0
    seed: int = 0


def make_policy(cfg: PlayConfig) -> MessageCompleter:
    service = tinker.ServiceClient()
    client = (service.create_sampling_client(model_path=cfg.checkpoint_path) if cfg.checkpoint_path
              else service.create_sampling_client(base_model=cfg.model_name))
    return TinkerMessageCompleter(client, renderer_for(cfg.model_name, cfg.renderer_name), cfg.max_tokens,
                                  temperature=cfg.temperature, stop_condition=STOP_CONDITION)


async def run(cfg: PlayConfig) -> None:
    if cfg.human_player_id not in (0, 1):
        raise ValueError(f"human_player_id={cfg.human_player_id}; 0 plays X (first), 1 plays O")
    policy = make_policy(cfg)
    if cfg.mode == "eval":
        opponent = make_opponent(cfg.opponent, cfg.model_name, renderer_for(cfg.model_name, cfg.renderer_name),
                                 seed=cfg.seed)
        results = await evaluate(policy, opponent, cfg.num_games)
        print(f"against {cfg.opponent}, {cfg.num_games} games: " +
              ", ".join(f"{k} {results[k]}" for k in ("win", "draw", "loss", "illegal_move")))
        return
    while True:
        players: list[MessageCompleter] = [HumanPlayer(), policy]
        if cfg.human_player_id == 1:
            players.reverse()
        game = await play_game(players, show=print)
        print(game.render(), f"\nyou: {game.outcome(cfg.human_player_id)}", sep="\n")
        if input("play again? [y/n] ").strip().lower() != "y":
            return


def main(cfg: PlayConfig) -> None:
    asyncio.run(run(cfg))


if __name__ == "__main__":
    run_recipe(main)
