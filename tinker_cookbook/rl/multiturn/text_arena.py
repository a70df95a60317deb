"""Tic-tac-toe for two players, where one or both seats are the policy (self-play RL, in the spirit of TextArena).

A ``Match`` is one game shared by the two seats. Each seat is either a policy env (``TwoPlayerEnv``: the RL loop
rolls it out like any env) or a fixed opponent (a ``MessageCompleter``: ``RandomOpponent``, ``OptimalOpponent``
(minimax: it never loses), or a sampling client
of a checkpoint or of the initial policy through ``TinkerMessageCompleter``). In self-play both seats of a match
are envs of one group, so the group's rewards are one game seen from both sides.

Every turn the mover sees a fresh prompt (the rules, the board, the legal moves) and answers with a cell in square
brackets, ``[4]``; sampling stops at ``]``. The last bracketed number of the reply is the move. A reply without one,
or naming a taken or out-of-range cell, is an illegal move: the game ends there, the offender gets
``illegal_move_reward`` and the other seat 0 (it did nothing to earn it). Otherwise the game ends on three in a row
(winner ``win_reward``, loser ``loss_reward``) or a full board (both ``draw_reward``). The reward comes on each
seat's last step; earlier steps earn 0.

Metrics on each seat's last step (means over episodes): ``win``, ``loss``, ``draw`` (on the board, or ``win`` by the
opponent's illegal move), ``illegal_move`` (this seat forfeited), ``opponent_illegal_move``, ``moves``; and
``idle_seat`` per episode: the seat's game ended before its first move (X forfeited at once). An idle seat still has
to answer one prompt (an env cannot end before its first action); its group reward makes its advantage exactly 0. Test groups
are tagged ``vs_random`` or ``vs_initial`` (or ``vs_optimal``, ``vs_checkpoint``), so ``test/env/vs_random/win`` is the win rate
against a random player and ``test/env/vs_initial/win`` the win rate against the policy before training.
"""

from __future__ import annotations

import asyncio
import functools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import chz

from tinker_cookbook import tinker
from tinker_cookbook.completers import MessageCompleter, StopCondition
from tinker_cookbook.renderers import Message, Renderer
from tinker_cookbook.rl.multiturn.message_env import renderer_for
from tinker_cookbook.rl.problem_env import message_text
from tinker_cookbook.rl.types import (
    Action,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    RLDataset,
    RLDatasetBuilder,
    StepResult,
    Trajectory,
)
from tinker_cookbook.utils import logtree

MARKS = ("X", "O")
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
STOP_CONDITION: StopCondition = ["]"]
ILLEGAL_MOVE_REWARD = -2.0
_MOVE = re.compile(r"\[\s*(\d+)\s*\]?")  # "]" is the stop string, so a sampled reply usually ends before it

OpponentKind = Literal["random", "optimal", "initial", "checkpoint"]


@dataclass
class TicTacToe:
    """The board (``cells[i]`` is "X", "O" or ""), whose turn it is (0 plays X and moves first) and the outcome."""

    cells: list[str] = field(default_factory=lambda: [""] * 9)
    to_move: int = 0
    illegal_by: int | None = None
    """The seat that forfeited by an illegal move, if one did."""

    def legal_moves(self) -> list[int]:
        return [] if self.done else [i for i, c in enumerate(self.cells) if not c]

    def winner(self) -> int | None:
        """The seat with three in a row, if any."""
        for a, b, c in LINES:
            if self.cells[a] and self.cells[a] == self.cells[b] == self.cells[c]:
                return MARKS.index(self.cells[a])
        return None

    @property
    def done(self) -> bool:
        return self.illegal_by is not None or self.winner() is not None or all(self.cells)

    def play(self, seat: int, move: int | None) -> bool:
        """Seat ``seat`` plays cell ``move`` (None: no move could be read). False, and the game ends with the seat
        forfeiting, when the move is illegal; a ValueError when it is not the seat's turn or the game is over."""
        if self.done or seat != self.to_move:
            raise ValueError(f"seat {seat} cannot move: {'the game is over' if self.done else f'seat {self.to_move} is to move'}")
        if move is None or move not in self.legal_moves():
            self.illegal_by = seat
            return False
        self.cells[move] = MARKS[seat]
        self.to_move = 1 - seat
        return True

    def outcome(self, seat: int) -> Literal["win", "loss", "draw", "illegal_move", "opponent_illegal_move"] | None:
        """How the game ended for ``seat`` (None while it goes on)."""
        if self.illegal_by is not None:
            return "illegal_move" if self.illegal_by == seat else "opponent_illegal_move"
        winner = self.winner()
        if winner is not None:
            return "win" if winner == seat else "loss"
        return "draw" if all(self.cells) else None

    def render(self) -> str:
        rows = [" | ".join(self.cells[r * 3 + c] or str(r * 3 + c) for c in range(3)) for r in range(3)]
        return "\n---------\n".join(rows)


def parse_move(text: str) -> int | None:
    """The cell of the last ``[n]`` in ``text`` (a closing bracket is optional: sampling stops at it)."""
    found = _MOVE.findall(text)
    return int(found[-1]) if found else None


def prompt_for(game: TicTacToe, seat: int) -> str:
    """What the seat to move is shown: the rules, the board (free cells by number) and the legal moves."""
    if game.done:  # only a seat whose opponent forfeited before this seat's first move sees this
        return (f"We were playing tic-tac-toe; you play {MARKS[seat]}. The game is already over: "
                f"{game.outcome(seat)}.\n\n{game.render()}\n\nReply with [0].")
    moves = ", ".join(f"[{m}]" for m in game.legal_moves())
    return (f"We are playing tic-tac-toe. You play {MARKS[seat]}, your opponent plays {MARKS[1 - seat]}. Three "
            f"in a row (across, down or diagonal) wins. Free cells show their number.\n\n{game.render()}\n\n"
            f"Legal moves: {moves}\nReply with your move as a cell number in square brackets, for example "
            f"[{game.legal_moves()[0]}].")


@dataclass(frozen=True)
class Rewards:
    win: float = 1.0
    loss: float = -1.0
    draw: float = 0.0
    illegal_move: float = ILLEGAL_MOVE_REWARD
    opponent_illegal_move: float = 0.0

    def of(self, outcome: str) -> float:
        return float(getattr(self, outcome))


class Match:
    """One game shared by its two seats; a seat waits here until it is its turn or the game is over."""

    def __init__(self, game: TicTacToe | None = None) -> None:
        self.game = game or TicTacToe()
        self.changed = asyncio.Condition()

    async def wait_for_turn(self, seat: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: self.game.done or self.game.to_move == seat)

    async def play(self, seat: int, move: int | None) -> bool:
        async with self.changed:
            legal = self.game.play(seat, move)
            self.changed.notify_all()
            return legal


# The official cookbook's name of the object that keeps the two seats in step.
TwoPlayerCoordinator = Match


class RandomOpponent(MessageCompleter):
    """Plays a uniformly random legal move, read from the prompt's ``Legal moves:`` line."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)

    async def __call__(self, messages: list[Message]) -> Message:
        line = next((ln for ln in message_text(messages[-1]).splitlines() if ln.startswith("Legal moves:")), "")
        moves = [int(m) for m in re.findall(r"\[(\d+)\]", line)]
        if not moves:
            raise ValueError("RandomOpponent was shown no 'Legal moves:' line; it plays only prompts of prompt_for()")
        return {"role": "assistant", "content": f"[{self.rng.choice(moves)}]"}


def read_board(prompt: str) -> tuple[list[str], str]:
    """The cells ("X", "O" or "") and the mover's mark, read back from a ``prompt_for`` prompt."""
    mark = re.search(r"You play ([XO])", prompt)
    rows = [ln for ln in prompt.splitlines() if ln.count("|") == 2]
    cells = [c.strip() for row in rows[-3:] for c in row.split("|")]
    if mark is None or len(cells) != 9:
        raise ValueError("the prompt has no 'You play X|O' or no 3x3 board; an opponent reads prompt_for() prompts")
    return [c if c in MARKS else "" for c in cells], mark.group(1)


@functools.cache  # a few thousand positions: the whole game tree is memoised after one call
def _search(cells: tuple[str, ...], mark: str) -> tuple[int, int | None]:
    """(score, best cell) for ``mark`` to move: positive a forced win, the larger the sooner (1 + the cells left
    empty when it ends), negative a forced loss, the nearer 0 the later, 0 a draw. Ties go to the lowest cell."""
    game = TicTacToe(list(cells), MARKS.index(mark))
    if game.winner() is not None:  # the previous mover has won
        return -(1 + cells.count("")), None
    if all(cells):
        return 0, None
    other = MARKS[1 - MARKS.index(mark)]
    best: tuple[int, int | None] = (-100, None)
    for move in game.legal_moves():
        score = -_search((*cells[:move], mark, *cells[move + 1:]), other)[0]
        if score > best[0]:
            best = (score, move)
    return best


def minimax(cells: tuple[str, ...], mark: str) -> tuple[int, int | None]:
    """(value, best cell) for ``mark`` to move: value +1 a forced win, 0 a draw, -1 a forced loss. The best cell
    wins soonest (or loses latest); among equal ones the lowest, so the player is deterministic."""
    score, move = _search(cells, mark)
    return (score > 0) - (score < 0), move


class OptimalOpponent(MessageCompleter):
    """Perfect play by minimax on the board in the prompt: it never loses (two of them always draw)."""

    async def __call__(self, messages: list[Message]) -> Message:
        cells, mark = read_board(message_text(messages[-1]))
        return {"role": "assistant", "content": f"[{minimax(tuple(cells), mark)[1]}]"}


def make_opponent(kind: OpponentKind, model_name: str, renderer: Renderer, *, seed: int | None = None,
                  checkpoint: str | None = None, max_tokens: int = 8, temperature: float = 1.0) -> MessageCompleter:
    """A fixed player by kind: ``random``, ``optimal`` (minimax), ``initial`` (``model_name``'s base weights) or
    ``checkpoint`` (the sampler checkpoint ``checkpoint``)."""
    if kind == "random":
        return RandomOpponent(seed)
    if kind == "optimal":
        return OptimalOpponent()
    from tinker_cookbook.completers import TinkerMessageCompleter

    if kind == "checkpoint" and checkpoint is None:
        raise ValueError("a 'checkpoint' opponent needs a sampler checkpoint path (tinker://...)")
    service = tinker.ServiceClient()
    client = (service.create_sampling_client(model_path=checkpoint) if kind == "checkpoint"
              else service.create_sampling_client(base_model=model_name))
    return TinkerMessageCompleter(client, renderer, max_tokens, temperature=temperature, stop_condition=STOP_CONDITION)


class TwoPlayerEnv(Env):
    """One seat of a match, played by the policy. With ``opponent`` set the other seat is that fixed player, and
    this env makes its moves; without, the other seat is another ``TwoPlayerEnv`` on the same match."""

    def __init__(self, seat: int, match: Match, renderer: Renderer, opponent: MessageCompleter | None = None,
                 rewards: Rewards | None = None) -> None:
        if seat not in (0, 1):
            raise ValueError(f"seat={seat}; a tic-tac-toe seat is 0 (X, moves first) or 1 (O)")
        self.seat, self.match, self.renderer, self.opponent = seat, match, renderer, opponent
        self.rewards = rewards or Rewards()
        self.moves = 0

    async def _other_side(self) -> None:
        """Until it is this seat's turn or the game is over: the fixed opponent moves, or the other env does."""
        game = self.match.game
        if self.opponent is None:
            await self.match.wait_for_turn(self.seat)
        elif not game.done and game.to_move != self.seat:
            reply = await self.opponent([{"role": "user", "content": prompt_for(game, 1 - self.seat)}])
            text = message_text(reply)
            await self.match.play(1 - self.seat, parse_move(text))
            logtree.log_text(f"opponent ({MARKS[1 - self.seat]}): {text}")

    def _prompt(self) -> Observation:
        return self.renderer.build_generation_prompt([{"role": "user", "content": prompt_for(self.match.game, self.seat)}])

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        await self._other_side()
        # An env must show a first observation even when the opponent forfeited before this seat moved: it is told
        # the game is over, and its step ends the episode whatever it replies.
        return self._prompt(), STOP_CONDITION

    async def step(self, action: Action) -> StepResult:
        game = self.match.game
        if not game.done:  # turn order: this seat's turn, since the other side has moved (see _other_side)
            message, _ = self.renderer.parse_response(action)
            text = message_text(message)
            legal = await self.match.play(self.seat, parse_move(text))
            self.moves += 1
            logtree.log_text(f"policy ({MARKS[self.seat]}): {text}" + ("" if legal else "  [illegal move]"))
            await self._other_side()
        outcome = game.outcome(self.seat)
        if outcome is None:
            return StepResult(0.0, False, self._prompt(), STOP_CONDITION)
        with logtree.scope_header(f"Final board ({MARKS[self.seat]}: {outcome})"):
            logtree.log_text(game.render(), div_class="prompt")
        metrics = {name: float(outcome == name) for name in ("loss", "draw", "illegal_move", "opponent_illegal_move")}
        metrics["win"] = float(outcome in ("win", "opponent_illegal_move"))
        metrics["moves"] = float(self.moves)
        return StepResult(self.rewards.of(outcome), True, tinker.ModelInput.empty(), STOP_CONDITION,
                          metrics=metrics)


class TwoPlayerEnvGroupBuilder(EnvGroupBuilder):
    """``num_games`` games. Self-play (``opponent=None``): both seats of each game are envs of this group. Against a
    fixed opponent: one env per game, the policy playing X in even games and O in odd ones."""

    def __init__(self, renderer: Renderer, num_games: int, opponent: MessageCompleter | None = None,
                 tag: str = "self_play", rewards: Rewards | None = None) -> None:
        if num_games < 1:
            raise ValueError(f"num_games={num_games} must be at least 1")
        self.renderer, self.num_games, self.opponent, self.tag = renderer, num_games, opponent, tag
        self.rewards = rewards or Rewards()

    async def make_envs(self) -> Sequence[Env]:
        envs: list[Env] = []
        for g in range(self.num_games):
            match = Match()
            if self.opponent is None:
                envs += [TwoPlayerEnv(seat, match, self.renderer, None, self.rewards) for seat in (0, 1)]
            else:
                envs.append(TwoPlayerEnv(g % 2, match, self.renderer, self.opponent, self.rewards))
        return envs

    async def compute_group_rewards(self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
                                    ) -> list[tuple[float, Metrics]]:
        """0 for seats that played; a seat whose game ended before its first move (its one action answered a "the
        game is over" prompt) gets the group's mean return of the others, so its advantage is exactly 0: nothing
        it did is reinforced or punished."""
        totals = [sum(t.reward for t in traj.transitions) for traj in trajectory_group]
        idle = [isinstance(env, TwoPlayerEnv) and env.moves == 0 for env in env_group]
        played = [total for total, is_idle in zip(totals, idle, strict=True) if not is_idle]
        baseline = sum(played) / len(played) if played else 0.0
        return [(baseline - total if is_idle else 0.0, {"idle_seat": float(is_idle)})
                for total, is_idle in zip(totals, idle, strict=True)]

    def logging_tags(self) -> list[str]:
        return ["tictactoe", self.tag]


class TwoPlayerTextArenaDataset(RLDataset):
    """``num_batches`` batches of ``groups_per_batch`` identical group builders (every game starts empty)."""

    def __init__(self, builders: Sequence[EnvGroupBuilder], num_batches: int) -> None:
        if num_batches < 1 or not builders:
            raise ValueError(f"num_batches={num_batches} and {len(builders)} builders: need at least one of each")
        self.builders, self.num_batches = list(builders), num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.num_batches:
            raise IndexError(f"batch index {index} is outside [0, {self.num_batches})")
        return self.builders

    def __len__(self) -> int:
        return self.num_batches


@chz.chz
class TwoPlayerTextArenaDatasetBuilder(RLDatasetBuilder):
    """Train by self-play (or against ``train_opponent``); test against a random player and the initial policy."""

    model_name_for_tokenizer: str
    renderer_name: str | None = None
    """None: the model's recommended renderer."""
    batch_size: int = 2
    """Groups per training batch."""
    games_per_group: int = 4
    """Self-play: games per group (two envs each); against a fixed opponent: envs per group."""
    num_batches: int = 50
    train_opponent: OpponentKind | None = None
    """None: self-play. ``random``, ``optimal`` (minimax), ``initial`` (the base model) or ``checkpoint``
    (``opponent_checkpoint``)."""
    test_opponents: tuple[OpponentKind, ...] = ("random", "initial")
    """Fixed players the test set plays against (each a tag: ``test/env/vs_<kind>/win``)."""
    test_games: int = 16
    """Games against each test opponent (half as X, half as O)."""
    opponent_checkpoint: str | None = None
    """A sampler checkpoint path (``tinker://...``) for the ``checkpoint`` opponent."""
    opponent_max_tokens: int = 8
    opponent_temperature: float = 1.0
    illegal_move_reward: float = ILLEGAL_MOVE_REWARD
    seed: int = 0

    @chz.validate
    def _check(self) -> None:
        for name in ("batch_size", "games_per_group", "num_batches", "test_games", "opponent_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        uses_checkpoint = "checkpoint" in (self.train_opponent, *self.test_opponents)
        if uses_checkpoint and self.opponent_checkpoint is None:
            raise ValueError("a 'checkpoint' opponent needs opponent_checkpoint=tinker://... (a sampler checkpoint)")

    def make_opponent(self, kind: OpponentKind, seed: int) -> MessageCompleter:
        return make_opponent(kind, self.model_name_for_tokenizer,
                             renderer_for(self.model_name_for_tokenizer, self.renderer_name), seed=seed,
                             checkpoint=self.opponent_checkpoint, max_tokens=self.opponent_max_tokens,
                             temperature=self.opponent_temperature)

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = renderer_for(self.model_name_for_tokenizer, self.renderer_name)
        rewards = Rewards(illegal_move=self.illegal_move_reward)
        if self.train_opponent is None:
            train_builder = TwoPlayerEnvGroupBuilder(renderer, self.games_per_group, None, "self_play", rewards)
        else:
            train_builder = TwoPlayerEnvGroupBuilder(renderer, self.games_per_group,
                                                     self.make_opponent(self.train_opponent, self.seed),
                                                     f"vs_{self.train_opponent}", rewards)
        train = TwoPlayerTextArenaDataset([train_builder] * self.batch_size, self.num_batches)
        if not self.test_opponents:
            return train, None
        tests = [TwoPlayerEnvGroupBuilder(renderer, self.test_games, self.make_opponent(kind, self.seed + 1),
                                          f"vs_{kind}", rewards) for kind in self.test_opponents]
        return train, TwoPlayerTextArenaDataset(tests, 1)
