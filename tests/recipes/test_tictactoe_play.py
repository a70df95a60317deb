"""The official text_arena layout's tic-tac-toe players and play script with scripted players: legal moves,
minimax, outcomes (no model)."""

from __future__ import annotations

import asyncio

import pytest

from recipes.multiplayer_rl.text_arena.play import HumanPlayer, evaluate, play_game
from recipes.multiplayer_rl.text_arena.tictactoe import (
    OptimalOpponent,
    RandomOpponent,
    make_opponent,
    minimax,
)
from tinker_cookbook.completers import MessageCompleter
from tinker_cookbook.rl.multiturn.message_env import renderer_for
from tinker_cookbook.rl.multiturn.text_arena import TicTacToe, prompt_for, read_board


def run(coro):
    return asyncio.run(coro)


def board(rows: str) -> tuple[str, ...]:
    """``"XO.|.X.|..O"`` -> cells, "." empty."""
    return tuple("" if c == "." else c for c in rows.replace("|", ""))


class Scripted(MessageCompleter):
    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)

    async def __call__(self, messages):
        return {"role": "assistant", "content": self.replies.pop(0)}


def test_the_board_and_mark_are_read_back_from_the_prompt():
    game = TicTacToe()
    for seat, move in ((0, 4), (1, 0), (0, 8)):
        game.play(seat, move)
    assert read_board(prompt_for(game, 1)) == (["O", "", "", "", "X", "", "", "", "X"], "O")
    with pytest.raises(ValueError, match="no 3x3 board"):
        read_board("Your move?")


@pytest.mark.parametrize(("cells", "mark", "value", "move"), [
    ("XX.|OO.|...", "X", 1, 2),   # complete the row
    ("XX.|OO.|...", "O", 1, 5),   # O to move wins at once rather than block
    ("XX.|O..|...", "O", -1, 2),  # block (the latest loss): X then forks at 4 (1-4-7 and 0-4-8)
    ("...|...|...", "X", 0, 0),   # perfect play from the start is a draw
    ("X..|...|...", "O", 0, 4),   # the only reply to a corner that holds the draw is the centre
])
def test_minimax_finds_wins_blocks_and_the_drawn_value(cells, mark, value, move):
    assert minimax(board(cells), mark) == (value, move)


def test_two_perfect_players_draw_and_perfect_play_never_loses_to_random():
    game = run(play_game([OptimalOpponent(), OptimalOpponent()]))
    assert game.outcome(0) == "draw" and all(game.cells)
    results = run(evaluate(OptimalOpponent(), RandomOpponent(seed=0), num_games=20))
    assert results["loss"] == 0 and results["illegal_move"] == 0 and results["win"] >= 10


def test_random_plays_only_legal_moves():
    for seed in range(30):
        game = run(play_game([RandomOpponent(seed), RandomOpponent(seed + 100)]))
        assert game.illegal_by is None and game.outcome(0) in ("win", "loss", "draw")


def test_an_illegal_or_unreadable_move_loses_the_game():
    # X takes the centre, O names the taken centre: O forfeits; in eval the policy's forfeit counts as illegal_move.
    game = run(play_game([Scripted("[4]"), Scripted("[4]")]))
    assert game.illegal_by == 1 and game.outcome(0) == "opponent_illegal_move"
    results = run(evaluate(Scripted("no idea", "[9]"), OptimalOpponent(), num_games=2))
    assert results == {"illegal_move": 2}


def test_a_human_types_moves_with_or_without_brackets():
    shown: list[str] = []
    moves = iter(["4", "[0]"])
    human = HumanPlayer(read=lambda _: next(moves), show=shown.append)
    game = TicTacToe()
    reply = run(human([{"role": "user", "content": prompt_for(game, 0)}]))
    assert reply["content"] == "[4]" and "Legal moves: [0], [1]" in shown[0]
    assert run(human([{"role": "user", "content": prompt_for(game, 0)}]))["content"] == "[0]"


def test_make_opponent_builds_fixed_players_by_the_official_names():
    chatml = renderer_for("HuggingFaceTB/SmolLM2-135M-Instruct")  # the packaged tokenizer only
    assert isinstance(make_opponent("optimal", "m", chatml), OptimalOpponent)
    assert isinstance(make_opponent("random", "m", chatml, seed=1), RandomOpponent)
    with pytest.raises(ValueError, match="opponent_type='minimax'"):
        make_opponent("minimax", "m", chatml)  # type: ignore[arg-type]
