"""Question answering with a search tool over a small local corpus (the ``search_tool`` recipe's task).

The corpus (``example-data/search_tool/articles.jsonl``, one ``{"title", "text"}`` per line) is an invented
mini-encyclopedia: its facts are made up, so a model can answer its questions
(``questions.jsonl``: ``{"question", "answers", "article"}``) only by reading the articles. ``BM25Index`` (the
``bm25s`` package, extra ``tool-use``) ranks the articles for a query; the ``search`` tool returns the best
``top_k``. An episode is a ``ToolUseEnv``: the model searches, reads the result and answers; the answer is right
when it contains one of the question's answers after normalisation (``answer_matches``).

Small models rarely open a tool call by themselves, so ``prefill_first_call`` (default on) starts the first reply
with the opening of a search call (``<tool_call>\\n{"name": "search", "arguments": {"query": "``): the model writes
the query, and learns from the reward what to do with the result. ``include_example`` shows one solved episode
(about an article that is not in the corpus) before the question. The test set plays each held-out question twice:
with the tool (tag ``with_tool``) and closed-book, without tools (tag ``closed_book``), so
``test/env/closed_book/episode/success`` is what the model knows without searching.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import chz

from tinker_cookbook.base.example_data import example_data_path
from tinker_cookbook.exceptions import ConfigurationError, DataFormatError
from tinker_cookbook.renderers import FunctionBody, Message, Renderer, ToolCall
from tinker_cookbook.rl.multiturn.message_env import EnvFromMessageEnv, renderer_for
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tool_use.env import ToolUseEnv
from tinker_cookbook.tool_use.registry import ToolRegistry
from tinker_cookbook.tool_use.tools import Tool, tool

INSTRUCTIONS = "Answer the user's question about the encyclopedia in a few words. Search it first."
CLOSED_BOOK_INSTRUCTIONS = "Answer the user's question in a few words."
EXAMPLE_ARTICLE = ("Zellbrook Fountain", "The Zellbrook Fountain is a fountain in the town square of Zellbrook. It "
                   "was carved from black marble in 1650 by the sculptor Anna Grieve.")
EXAMPLE_QUESTION, EXAMPLE_QUERY, EXAMPLE_ANSWER = (
    "Who carved the Zellbrook Fountain?", "Zellbrook Fountain carved", "Anna Grieve")


@dataclass(frozen=True)
class Article:
    title: str
    text: str

    def render(self) -> str:
        return f"{self.title}: {self.text}"


@dataclass(frozen=True)
class Question:
    question: str
    answers: tuple[str, ...]
    article: str
    """The title of the article that answers it."""


def load_articles(path: Path) -> list[Article]:
    return [Article(str(row["title"]), str(row["text"])) for row in _read_jsonl(path, ("title", "text"))]


def load_questions(path: Path) -> list[Question]:
    rows = _read_jsonl(path, ("question", "answers", "article"))
    return [Question(str(r["question"]), tuple(str(a) for a in r["answers"]), str(r["article"])) for r in rows]


def _read_jsonl(path: Path, keys: tuple[str, ...]) -> list[dict]:
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [k for k in keys if k not in row]
        if missing:
            raise DataFormatError(f"{path}:{n} lacks {missing}; every line needs the keys {list(keys)}")
        rows.append(row)
    return rows


class BM25Index:
    """BM25 ranking of articles (title and text) with English stopwords removed."""

    def __init__(self, articles: Sequence[Article]) -> None:
        try:
            import bm25s
        except ImportError as e:
            raise ImportError("the search tool needs the bm25s package: pip install -e '.[tool-use]'") from e
        self.articles = list(articles)
        self._bm25s = bm25s
        self._retriever = bm25s.BM25()
        corpus = [a.render() for a in self.articles]
        self._retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)

    def search(self, query: str, k: int = 1) -> list[Article]:
        """The ``k`` best articles for ``query``, best first (none when no query word is in the corpus)."""
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:
            return []
        k = min(k, len(self.articles))
        ids, scores = self._retriever.retrieve(tokens, k=k, show_progress=False)
        return [self.articles[int(i)] for i, s in zip(ids[0], scores[0], strict=True) if s > 0]


def make_search_tool(index: BM25Index, top_k: int = 1) -> Tool:
    """The ``search`` tool over ``index``: the ``top_k`` best articles as text."""

    @tool
    def search(query: str) -> str:
        """Search the encyclopedia; returns the best matching article.

        Args:
            query: Words to look for, such as the names in the question.
        """
        found = index.search(query, top_k)
        return "\n\n".join(a.render() for a in found) if found else "No article matches this query."

    return search


def normalize_answer(text: str) -> str:
    """Lowercase, without punctuation, articles (a, an, the) or extra spaces (SQuAD's normalisation)."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def answer_matches(reply: str, answers: Sequence[str]) -> bool:
    """Whether the normalised reply contains a normalised answer as whole words."""
    padded = f" {normalize_answer(reply)} "
    return any(f" {normalize_answer(a)} " in padded for a in answers if normalize_answer(a))


def search_prompt(renderer: Renderer, registry: ToolRegistry, question: str, include_example: bool) -> list[Message]:
    """The tool-declaring system message, an optional solved example, and the question."""
    messages = renderer.create_conversation_prefix_with_tools(registry.specs(), INSTRUCTIONS)
    if include_example:
        call = ToolCall(function=FunctionBody(name="search", arguments=json.dumps({"query": EXAMPLE_QUERY})))
        messages += [
            {"role": "user", "content": EXAMPLE_QUESTION},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": f"{EXAMPLE_ARTICLE[0]}: {EXAMPLE_ARTICLE[1]}", "name": "search"},
            {"role": "assistant", "content": EXAMPLE_ANSWER},
        ]
    return [*messages, {"role": "user", "content": question}]


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int
    max_tool_calls: int
    format_penalty: float
    prefill_first_call: bool
    include_example: bool


class SearchGroupBuilder(EnvGroupBuilder):
    """``group_size`` episodes of one question, with the search tool or closed-book."""

    def __init__(self, renderer: Renderer, search: Tool, question: Question, group_size: int,
                 settings: EpisodeSettings, closed_book: bool = False) -> None:
        self.renderer, self.search, self.question = renderer, search, question
        self.group_size, self.settings, self.closed_book = group_size, settings, closed_book

    def _env(self) -> ToolUseEnv:
        s, grade = self.settings, partial(answer_matches, answers=self.question.answers)
        if self.closed_book:
            prompt: list[Message] = [{"role": "system", "content": CLOSED_BOOK_INSTRUCTIONS},
                                     {"role": "user", "content": self.question.question}]
            return ToolUseEnv(prompt, ToolRegistry([]), grade, max_turns=1, max_tool_calls=0,
                              format_penalty=s.format_penalty)
        registry = ToolRegistry([self.search])
        prefill = self.renderer.tool_call_prefix("search") + '{"query": "' if s.prefill_first_call else None
        prompt = search_prompt(self.renderer, registry, self.question.question, s.include_example)
        return ToolUseEnv(prompt, registry, grade, max_turns=s.max_turns, max_tool_calls=s.max_tool_calls,
                          format_penalty=s.format_penalty, first_reply_prefill=prefill)

    async def make_envs(self) -> Sequence[Env]:
        return [EnvFromMessageEnv(self.renderer, self._env()) for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return ["closed_book" if self.closed_book else "with_tool"]


class SearchDataset(RLDataset):
    """Batch ``i``: ``batch_size`` questions drawn by a generator seeded with ``(seed, i)``."""

    def __init__(self, make_group: partial[SearchGroupBuilder], questions: Sequence[Question], batch_size: int,
                 n_batches: int, seed: int) -> None:
        self.make_group, self.questions = make_group, list(questions)
        self.batch_size, self.n_batches, self.seed = batch_size, n_batches, seed

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.n_batches:
            raise IndexError(f"batch index {index} is outside [0, {self.n_batches})")
        rng = random.Random(f"{self.seed}-{index}")
        return [self.make_group(question=q) for q in rng.sample(self.questions, self.batch_size)]

    def __len__(self) -> int:
        return self.n_batches


class SearchTestSet(RLDataset):
    """One batch: every held-out question with the tool and closed-book."""

    def __init__(self, make_group: partial[SearchGroupBuilder], questions: Sequence[Question]) -> None:
        self.make_group, self.questions = make_group, list(questions)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if index != 0:
            raise IndexError(f"batch index {index} is outside [0, 1)")
        return [self.make_group(question=q, closed_book=cb) for cb in (False, True) for q in self.questions]

    def __len__(self) -> int:
        return 1


@chz.chz
class SearchToolDatasetBuilder(RLDatasetBuilder):
    """Questions about the invented encyclopedia; ``n_test_questions`` of them (a seeded draw) are held out."""

    batch_size: int
    group_size: int
    model_name_for_tokenizer: str
    renderer_name: str | None = None
    """None: the model's recommended renderer; it must have a tool-call format (chatml_tools, qwen3*, llama3)."""
    articles_path: str = str(example_data_path("search_tool", "articles.jsonl"))
    questions_path: str = str(example_data_path("search_tool", "questions.jsonl"))
    top_k: int = 1
    """Articles per search result."""
    max_turns: int = 3
    max_tool_calls: int = 2
    format_penalty: float = 0.1
    prefill_first_call: bool = True
    """Start the first reply with the opening of a search call (see the module docstring)."""
    include_example: bool = True
    """Show one solved episode before the question."""
    n_batches: int = 100
    n_test_questions: int = 0
    test_group_size: int = 2
    seed: int = 0

    @chz.validate
    def _check(self) -> None:
        for name in ("batch_size", "group_size", "n_batches", "top_k", "max_turns", "test_group_size"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}={getattr(self, name)} must be at least 1")
        if self.max_tool_calls < 0 or self.n_test_questions < 0:
            raise ConfigurationError(f"max_tool_calls={self.max_tool_calls} and n_test_questions="
                                     f"{self.n_test_questions} must be >= 0")

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = renderer_for(self.model_name_for_tokenizer, self.renderer_name)
        renderer.tool_call_prefix()  # fail now, naming the renderer, if it has no tool-call format
        questions = load_questions(Path(self.questions_path))
        random.Random(self.seed).shuffle(questions)
        test, train = questions[: self.n_test_questions], questions[self.n_test_questions :]
        if len(train) < self.batch_size:
            raise ConfigurationError(f"batch_size={self.batch_size} is more than the {len(train)} training "
                                     f"questions left after n_test_questions={self.n_test_questions}")
        search = make_search_tool(BM25Index(load_articles(Path(self.articles_path))), self.top_k)
        settings = EpisodeSettings(self.max_turns, self.max_tool_calls, self.format_penalty,
                                   self.prefill_first_call, self.include_example)
        group = partial(SearchGroupBuilder, renderer, search, settings=settings)
        train_set = SearchDataset(partial(group, group_size=self.group_size), train, self.batch_size,
                                  self.n_batches, self.seed)
        test_set = SearchTestSet(partial(group, group_size=self.test_group_size), test) if test else None
        return train_set, test_set


