"""Twenty questions: the policy (the player) asks an answerer model yes/no questions to find a secret word.

Each turn the player writes one message. A message whose first ``Guess:`` line names the secret word (compared
case-insensitively, ignoring quotes, trailing punctuation and a leading article) wins: reward 1 and the episode
ends. A wrong guess is answered "No, the word is not X." by the env itself; any other message is a question,
answered by the answerer: a ``MessageCompleter`` that sees a system prompt holding the secret word and only the
latest question. The episode also ends after ``max_questions`` turns (reward 0). Questions earn nothing, so the only
signal is finding the word. An empty or cut-off message counts as a format error (``format_penalty`` each).

Words (``example-data/``): ``nouns`` (181 common nouns) or ``animals`` (41 animals; the player is told the topic),
or any file with one word per line. The list is shuffled with a fixed seed and its last fifth are the test words,
never seen in training; the train words are repeated ``num_epochs`` times (reshuffled per epoch). With
``include_example`` the player first sees a short finished game (questions, a wrong guess, a right one).

A small answerer does not keep the secret: asked "What animal is it?" it replies "The answer is a zebra.", and a
player can learn to ask for the word and repeat it. ``hide_word_in_answers`` masks the word in its replies.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import chz

from tinker_cookbook.base.example_data import example_data_dir
from tinker_cookbook.completers import MessageCompleter
from tinker_cookbook.rl.multiturn.message_env import (
    EnvFromMessageEnv,
    MessageEnv,
    MessageStepResult,
    renderer_for,
)
from tinker_cookbook.rl.problem_env import message_text
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, Logs, Metrics, RLDataset, RLDatasetBuilder

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Message, Renderer

EXAMPLE_DATA = example_data_dir()
WORD_LISTS: dict[str, tuple[Path, str]] = {
    # name: (file, the topic the player is told)
    "nouns": (EXAMPLE_DATA / "twenty_questions_nouns.txt", "a common noun such as an animal, a food or an object"),
    "animals": (EXAMPLE_DATA / "twenty_questions_animals.txt", "an animal"),
}
TAG = "twenty_questions"

PLAYER_PROMPT = (
    "Let's play twenty questions. I am thinking of a secret word: {topic}. Find it by asking me questions that I "
    "can answer with yes or no, one short question per message. When you know the word, reply with one line: "
    "Guess: <word>. You have {max_questions} messages."
)
FIRST_USER_MESSAGE = "I have chosen my word. Ask your first question."
ANSWERER_PROMPT = (
    'You are the answerer in a game of twenty questions. The secret word is "{word}". The player asks a '
    "question about the secret word. Answer it truthfully with yes or no and at most a few words. Never say "
    "the secret word."
)
NEW_GAME_MESSAGE = "Correct! Let's play again with a new word. Ask your first question."
EXAMPLE_GAME: list[Message] = [  # a finished game shown first when include_example is set; its word is not in the lists
    {"role": "user", "content": FIRST_USER_MESSAGE},
    {"role": "assistant", "content": "Is it an animal?"},
    {"role": "user", "content": "Yes."},
    {"role": "assistant", "content": "Guess: cat"},
    {"role": "user", "content": "No, the word is not cat."},
    {"role": "assistant", "content": "Does it live where it is cold?"},
    {"role": "user", "content": "Yes."},
    {"role": "assistant", "content": "Guess: penguin"},
    {"role": "user", "content": NEW_GAME_MESSAGE},
]
HIDDEN_WORD = "[secret]"
FORMAT_HINT = "Ask one yes/no question, or make a guess with one line: Guess: <word>."

_GUESS_LINE = re.compile(r"^\s*\**guess\**\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)
_ARTICLE = re.compile(r"^(a|an|the)\s+")


def word_list_file(word_list: str) -> tuple[Path, str]:
    """The file and topic of a shipped word list (``nouns``, ``animals``), or of a file path (topic: a noun)."""
    if word_list in WORD_LISTS:
        return WORD_LISTS[word_list]
    path = Path(word_list).expanduser()
    if not path.is_file():
        raise ValueError(f"word_list={word_list!r} is neither a shipped list {sorted(WORD_LISTS)} nor a file; "
                         "pass one of those names or the path of a file with one word per line")
    return path, "a common noun"


def load_words(path: str | Path) -> list[str]:
    """The words of a word-list file: one per line, lower-cased; blank lines and ``#`` comments skipped."""
    path = Path(path)
    words = [line.split("#", 1)[0].strip().lower() for line in path.read_text().splitlines()]
    words = [w for w in words if w]
    if len(words) < 2:
        raise ValueError(f"word list {path} has {len(words)} words; it needs at least 2 (train and test)")
    return words


def split_words(words: Sequence[str], seed: int = 0) -> tuple[list[str], list[str]]:
    """(train, test): the words shuffled with ``seed``; test is the last fifth (at least 1, at most 100)."""
    shuffled = sorted(set(words))
    random.Random(seed).shuffle(shuffled)
    n_test = min(max(len(shuffled) // 5, 1), 100)
    return shuffled[:-n_test], shuffled[-n_test:]


def normalize_word(text: str) -> str:
    """Lower case without surrounding quotes, punctuation, markup or a leading article."""
    word = text.strip().lower().strip(" \t\"'`*_.,!?;:()[]")
    return _ARTICLE.sub("", word).strip()


def parse_guess(text: str) -> str | None:
    """The normalized word of the first ``Guess: <word>`` line of ``text``, or None when there is none."""
    match = _GUESS_LINE.search(text)
    return normalize_word(match.group(1)) if match else None


class TwentyQuestionsEnv(MessageEnv):
    """One game for one secret word (see the module docstring)."""

    def __init__(self, word: str, answerer: MessageCompleter, max_questions: int = 20,
                 format_penalty: float = 0.0, include_example: bool = False,
                 topic: str = WORD_LISTS["nouns"][1], hide_word_in_answers: bool = False) -> None:
        if max_questions < 1:
            raise ValueError(f"max_questions={max_questions} must be at least 1")
        self.word = normalize_word(word)
        self.answerer = answerer
        self.max_questions = max_questions
        self.format_penalty = format_penalty
        self.include_example = include_example
        self.topic = topic
        self.hide_word_in_answers = hide_word_in_answers
        self.turns = 0
        self.success = False
        self.format_errors = 0

    async def initial_messages(self) -> list[Message]:
        rules: Message = {"role": "system", "content": PLAYER_PROMPT.format(topic=self.topic,
                                                                          max_questions=self.max_questions)}
        if self.include_example:
            return [rules, *EXAMPLE_GAME]
        return [rules, {"role": "user", "content": FIRST_USER_MESSAGE}]

    async def answer(self, question: str) -> str:
        """The answerer's reply to ``question`` alone (it never sees the earlier turns)."""
        reply = await self.answerer([{"role": "system", "content": ANSWERER_PROMPT.format(word=self.word)},
                                     {"role": "user", "content": question}])
        text = message_text(reply).strip()
        text = text.splitlines()[0].strip() if text else "I don't know."
        if self.hide_word_in_answers:
            text = re.sub(rf"\b{re.escape(self.word)}(s|es)?\b", HIDDEN_WORD, text, flags=re.IGNORECASE)
        return text

    async def step(self, reply: Message, ended_cleanly: bool) -> MessageStepResult:
        self.turns += 1
        text = message_text(reply).strip()
        guess = parse_guess(text)
        self.success = guess == self.word
        bad_format = not ended_cleanly or not text or guess == ""
        self.format_errors += int(bad_format)
        reward = float(self.success) - self.format_penalty * float(bad_format)
        done = self.success or self.turns >= self.max_questions
        metrics: Metrics = {"format": float(not bad_format), "guessed": float(guess is not None)}
        logs: Logs = {"secret": self.word, "player": text}
        if done:
            return MessageStepResult(reward, True, metrics=metrics, logs=logs)
        if guess:
            answer = f"No, the word is not {guess}."
        elif not text or guess == "":
            answer = FORMAT_HINT
        else:
            answer = await self.answer(text)
        logs["answer"] = answer
        return MessageStepResult(reward, False, [{"role": "user", "content": answer}], metrics, logs)

    def episode_metrics(self) -> Metrics:
        return {"episode/success": float(self.success), "episode/questions_used": self.turns,
                "episode/format_errors": self.format_errors}


class TwentyQuestionsGroupBuilder(EnvGroupBuilder):
    """``group_size`` games for the same secret word; ``make_game`` makes one (a picklable partial, no lambda)."""

    def __init__(self, renderer: Renderer, make_game: Callable[[], TwentyQuestionsEnv], group_size: int) -> None:
        self.renderer = renderer
        self.make_game = make_game
        self.group_size = group_size

    async def make_envs(self) -> Sequence[Env]:
        return [EnvFromMessageEnv(self.renderer, self.make_game()) for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return [TAG]


class TwentyQuestionsDataset(RLDataset):
    """Batches of ``batch_size`` words (the last batch may be shorter), each played ``group_size`` times.

    ``make_game(word)`` makes one game (``TwentyQuestionsEnv`` with the answerer and the rules bound).
    """

    def __init__(self, words: Sequence[str], batch_size: int, group_size: int, renderer: Renderer,
                 make_game: Callable[[str], TwentyQuestionsEnv]) -> None:
        if batch_size < 1 or group_size < 1:
            raise ValueError(f"batch_size={batch_size} and group_size={group_size} must be at least 1")
        self.words = list(words)
        self.batch_size, self.group_size = batch_size, group_size
        self.renderer = renderer
        self.make_game = make_game

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} is outside [0, {len(self)})")
        words = self.words[index * self.batch_size : (index + 1) * self.batch_size]
        return [TwentyQuestionsGroupBuilder(self.renderer, partial(self.make_game, word), self.group_size)
                for word in words]

    def __len__(self) -> int:
        return -(-len(self.words) // self.batch_size)


def epoch_words(train_words: Sequence[str], num_epochs: int, seed: int) -> list[str]:
    """The train words ``num_epochs`` times over, each epoch in its own seeded order."""
    out: list[str] = []
    for epoch in range(num_epochs):
        order = list(train_words)
        random.Random(f"{seed}-epoch-{epoch}").shuffle(order)
        out += order
    return out


@chz.chz
class TwentyQuestionsDatasetBuilder(RLDatasetBuilder):
    """Train on the train words, test on the unseen test words; the answerer shares the player's base weights.

    ``answerer_model=None`` uses ``model_name_for_tokenizer``: a sampling client of that base model, which the
    local engine serves from the base weights it already loaded for training (the model is not loaded twice).
    """

    batch_size: int
    group_size: int
    model_name_for_tokenizer: str
    renderer_name: str | None = None
    """None: the model's recommended renderer."""

    num_epochs: int = 1
    max_questions: int = 20
    format_penalty: float = 0.0
    include_example: bool = True
    """Show a short finished example game before each game (small models learn the format from it)."""

    hide_word_in_answers: bool = False
    """Replace the secret word in the answerer's replies by ``[secret]``: a weak answerer names the word when
    asked directly ("What animal is it?" -> "The answer is a zebra."), which the player can learn to exploit."""

    word_list: str = "nouns"
    """A shipped list (``nouns``: 181 common nouns; ``animals``: 41 animals, and the player is told the topic) or
    the path of a file with one word per line."""

    split_seed: int = 0
    seed: int = 0
    test_group_size: int = 8
    max_test_words: int | None = None
    """Evaluate on at most this many test words (None: all of them)."""

    answerer_model: str | None = None
    answerer_renderer_name: str | None = None
    answerer_max_tokens: int = 8
    answerer_temperature: float = 0.0
    """0: the answerer replies greedily, so a question always gets the same answer for the same word."""

    @chz.validate
    def _check(self) -> None:
        for name in ("batch_size", "group_size", "num_epochs", "max_questions", "test_group_size",
                     "answerer_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.max_test_words is not None and self.max_test_words < 1:
            raise ValueError(f"max_test_words={self.max_test_words} must be at least 1 (or None for all)")
        if self.answerer_temperature < 0:
            raise ValueError(f"answerer_temperature={self.answerer_temperature} must be >= 0 (0 is greedy)")

    def make_answerer(self) -> MessageCompleter:
        from tinker_cookbook import tinker
        from tinker_cookbook.completers import TinkerMessageCompleter

        model = self.answerer_model or self.model_name_for_tokenizer
        client = tinker.ServiceClient().create_sampling_client(base_model=model)
        return TinkerMessageCompleter(client, renderer_for(model, self.answerer_renderer_name),
                                      self.answerer_max_tokens, temperature=self.answerer_temperature)

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        path, topic = word_list_file(self.word_list)
        train_words, test_words = split_words(load_words(path), self.split_seed)
        if self.max_test_words is not None:
            test_words = test_words[: self.max_test_words]
        renderer = renderer_for(self.model_name_for_tokenizer, self.renderer_name)
        make_game = partial(TwentyQuestionsEnv, answerer=self.make_answerer(), max_questions=self.max_questions,
                            format_penalty=self.format_penalty, include_example=self.include_example, topic=topic,
                            hide_word_in_answers=self.hide_word_in_answers)
        train = TwentyQuestionsDataset(epoch_words(train_words, self.num_epochs, self.seed), self.batch_size,
                                       self.group_size, renderer, make_game)
        test = TwentyQuestionsDataset(test_words, len(test_words), self.test_group_size, renderer, make_game)
        return train, test


# The official cookbook's name of the group builder.
TwentyQuestionsEnvGroupBuilder = TwentyQuestionsGroupBuilder
