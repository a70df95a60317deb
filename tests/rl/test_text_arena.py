"""Tic-tac-toe (text_arena) with scripted players: legal moves, outcomes, rewards, self-play turn order, fixed
opponents and the metrics the win rates are read from."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

import pytest

from tinker_cookbook import tinker
from tinker_cookbook.completers import MessageCompleter, StopCondition, TokenCompleter, TokensWithLogprobs
from tinker_cookbook.rl.metric_util import compute_trajectory_metrics
from tinker_cookbook.rl.multiturn.text_arena import (
    ILLEGAL_MOVE_REWARD,
    RandomOpponent,
    TicTacToe,
    TwoPlayerEnvGroupBuilder,
    TwoPlayerTextArenaDatasetBuilder,
    parse_move,
    prompt_for,
)
from tinker_cookbook.rl.rollouts import do_group_rollout

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"  # only its (packaged) tokenizer is used here



def run(coro):
    return asyncio.run(coro)



class SeatScript(TokenCompleter):
    """Plays scripted replies per mark: it reads "You play X" / "You play O" from the prompt it is shown."""

    def __init__(self, renderer, replies: dict[str, Sequence[str]]) -> None:
        self.renderer = renderer
        self.replies = {mark: list(r) for mark, r in replies.items()}
        self.prompts: list[str] = []

    async def __call__(self, model_input: tinker.ModelInput, stop: StopCondition, *,
                       max_tokens: int | None = None) -> TokensWithLogprobs:
        prompt = self.renderer.tokenizer.decode(model_input.to_ints())
        self.prompts.append(prompt)
        mark = re.search(r"you play ([XO])", prompt, re.IGNORECASE).group(1)
        text = self.replies[mark].pop(0) if self.replies[mark] else "[0]"
        tokens = self.renderer.tokenizer.encode(text, add_special_tokens=False)
        return TokensWithLogprobs(tokens, [-0.5] * len(tokens), "stop")


class ScriptedOpponent(MessageCompleter):
    def __init__(self, moves: Sequence[str]) -> None:
        self.moves = list(moves)
        self.seen: list[str] = []

    async def __call__(self, messages):
        self.seen.append(messages[-1]["content"])
        return {"role": "assistant", "content": self.moves.pop(0)}


# -- the game ---------------------------------------------------------------------------------------------


def test_legal_moves_turns_and_outcomes():
    game = TicTacToe()
    assert game.legal_moves() == list(range(9)) and game.to_move == 0
    for seat, cell in [(0, 4), (1, 0), (0, 2), (1, 6), (0, 3)]:
        assert game.play(seat, cell)
    assert game.legal_moves() == [1, 5, 7, 8] and game.outcome(0) is None
    with pytest.raises(ValueError, match="seat 1 is to move"):
        game.play(0, 5)
    assert game.play(1, 5) and game.play(0, 8) is True  # X: 4, 2, 3, 8; O: 0, 6, 5 -> nobody has a line yet
    assert game.outcome(0) is None
    assert game.play(1, 7) and game.play(0, 1)  # X: 4, 2, 3, 8, 1 -> 1-4-7? no (7 is O); board is full
    assert all(game.cells) and game.winner() is None
    assert game.outcome(0) == game.outcome(1) == "draw" and game.legal_moves() == []


def test_a_line_wins_and_an_illegal_move_forfeits():
    game = TicTacToe()
    for seat, cell in [(0, 0), (1, 3), (0, 1), (1, 4), (0, 2)]:
        game.play(seat, cell)
    assert game.winner() == 0 and game.outcome(0) == "win" and game.outcome(1) == "loss" and game.done
    with pytest.raises(ValueError, match="game is over"):
        game.play(1, 5)
    taken = TicTacToe()
    taken.play(0, 4)
    assert taken.play(1, 4) is False  # an occupied cell
    assert taken.outcome(1) == "illegal_move" and taken.outcome(0) == "opponent_illegal_move"
    for bad in (None, 9, -1):
        fresh = TicTacToe()
        assert fresh.play(0, bad) is False and fresh.illegal_by == 0


def test_moves_are_read_from_the_last_bracketed_number():
    assert parse_move("I take the centre: [4]") == 4
    assert parse_move("[1] no, [7") == 7  # sampling stops at "]", so the bracket may be missing
    assert parse_move("centre please") is None and parse_move("[x]") is None


def test_the_prompt_shows_board_and_legal_moves():
    game = TicTacToe()
    game.play(0, 4)
    text = prompt_for(game, 1)
    assert "You play O" in text and "3 | X | 5" in text
    assert "Legal moves: [0], [1], [2], [3], [5], [6], [7], [8]" in text


# -- envs in groups ---------------------------------------------------------------------------------------


def _by_seat(group) -> dict[str, object]:
    # Self-play groups hold seat 0 (X) then seat 1 (O) of each game.
    return {"X": group.trajectories_G[0], "O": group.trajectories_G[1]}


def test_self_play_alternates_turns_and_rewards_win_and_loss(chatml):
    policy = SeatScript(chatml, {"X": ["[0]", "[1]", "[2]"], "O": ["[3]", "[4]"]})
    group = run(do_group_rollout(TwoPlayerEnvGroupBuilder(chatml, num_games=1), policy))
    trajs = _by_seat(group)
    assert [len(trajs["X"].transitions), len(trajs["O"].transitions)] == [3, 2]
    assert group.get_total_rewards() == [1.0, -1.0]
    # Turn order: X saw an empty board, O saw X's first move, X saw O's reply, ...
    assert "Legal moves: [0], [1], [2], [3], [4], [5], [6], [7], [8]" in policy.prompts[0]
    assert "You play O" in policy.prompts[1] and "X | 1 | 2" in policy.prompts[1]
    x_last, o_last = trajs["X"].transitions[-1].metrics, trajs["O"].transitions[-1].metrics
    assert x_last["win"] == 1.0 and x_last["moves"] == 3 and o_last["loss"] == 1.0 and o_last["win"] == 0.0


def test_self_play_draw(chatml):
    # X: 4, 2, 3, 8, 1; O: 0, 6, 5, 7 -> a full board without a line.
    policy = SeatScript(chatml, {"X": ["[4]", "[2]", "[3]", "[8]", "[1]"], "O": ["[0]", "[6]", "[5]", "[7]"]})
    group = run(do_group_rollout(TwoPlayerEnvGroupBuilder(chatml, num_games=1), policy))
    assert group.get_total_rewards() == [0.0, 0.0]
    assert all(t.transitions[-1].metrics["draw"] == 1.0 for t in group.trajectories_G)


def test_illegal_move_is_penalised_and_the_other_seat_gets_nothing(chatml):
    policy = SeatScript(chatml, {"X": ["[4]"], "O": ["[4]"]})  # O plays the taken centre
    group = run(do_group_rollout(TwoPlayerEnvGroupBuilder(chatml, num_games=1), policy))
    assert group.get_total_rewards() == [0.0, ILLEGAL_MOVE_REWARD]
    x_last, o_last = (t.transitions[-1].metrics for t in group.trajectories_G)
    assert o_last["illegal_move"] == 1.0 and x_last["opponent_illegal_move"] == 1.0 and x_last["win"] == 1.0


def test_a_forfeit_before_the_second_seat_moves_still_ends_its_episode(chatml):
    policy = SeatScript(chatml, {"X": ["no move"], "O": ["[4]"]})
    group = run(do_group_rollout(TwoPlayerEnvGroupBuilder(chatml, num_games=1), policy))
    assert "already over" in policy.prompts[-1]  # O was told, and its one step ends the episode
    o_last = group.trajectories_G[1].transitions[-1]
    assert o_last.reward == 0.0 and o_last.metrics["moves"] == 0 and o_last.metrics["opponent_illegal_move"] == 1.0
    # The idle seat's group reward makes its total the mean of the seats that played (here X's -2), so its
    # advantage (total - group mean) is exactly 0: the reply to "the game is over" is neither rewarded nor punished.
    assert group.get_total_rewards() == [ILLEGAL_MOVE_REWARD, ILLEGAL_MOVE_REWARD]
    assert group.final_rewards_G == [0.0, ILLEGAL_MOVE_REWARD]
    assert [m["idle_seat"] for m in group.metrics_G] == [0.0, 1.0]


def test_fixed_opponent_moves_for_the_other_seat_and_seats_alternate(chatml):
    opponent = ScriptedOpponent(["[3]", "[4]", "[0]", "[1]", "[2]"])
    policy = SeatScript(chatml, {"X": ["[0]", "[1]", "[2]"], "O": ["[6]", "[7]", "[8]"]})
    builder = TwoPlayerEnvGroupBuilder(chatml, num_games=2, opponent=opponent, tag="vs_scripted")
    envs = run(builder.make_envs())
    assert [e.seat for e in envs] == [0, 1]  # game 0 as X, game 1 as O
    group = run(do_group_rollout(builder, policy))
    # Game 0: X (policy) 0, 1, 2 wins over O's 3, 4. Game 1: X (opponent) 0, 1, 2 beats O (policy) at 6, 7.
    assert group.get_total_rewards() == [1.0, -1.0]
    assert "You play O" in opponent.seen[0] and "You play X" in opponent.seen[2]
    metrics = compute_trajectory_metrics([group], [builder.logging_tags()])
    assert metrics["env/all/win"] == 0.5 and metrics["env/all/loss"] == 0.5


def test_random_opponent_plays_only_legal_moves():
    opponent = RandomOpponent(seed=3)
    for _ in range(5):
        game = TicTacToe()
        seat = 0
        while not game.done:
            reply = run(opponent([{"role": "user", "content": prompt_for(game, seat)}]))
            assert game.play(seat, parse_move(reply["content"]))  # never illegal
            seat = 1 - seat
    with pytest.raises(ValueError, match="Legal moves"):
        run(opponent([{"role": "user", "content": "hello"}]))


def test_the_test_set_reports_win_rates_per_opponent(chatml):
    builder = TwoPlayerTextArenaDatasetBuilder(model_name_for_tokenizer=SMOLLM2, test_opponents=("random",),
                                               test_games=4, batch_size=2, num_batches=3)
    train, test = run(builder())
    assert len(train) == 3 and len(train.get_batch(0)) == 2 and train.get_batch(0)[0].logging_tags()[-1] == "self_play"
    assert [b.logging_tags() for b in test.get_batch(0)] == [["tictactoe", "vs_random"]]
    with pytest.raises(ValueError, match="opponent_checkpoint"):
        TwoPlayerTextArenaDatasetBuilder(model_name_for_tokenizer=SMOLLM2, test_opponents=("checkpoint",))
