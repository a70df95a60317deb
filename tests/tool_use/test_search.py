"""The search_tool task: its corpus, BM25 retrieval over it, answer matching and the datasets."""

from __future__ import annotations

import asyncio

import pytest

from tinker_cookbook.base.example_data import example_data_path
from tinker_cookbook.exceptions import ConfigurationError, RendererError
from tinker_cookbook.tool_use.search import (
    BM25Index,
    SearchGroupBuilder,
    SearchToolDatasetBuilder,
    answer_matches,
    load_articles,
    load_questions,
    make_search_tool,
    normalize_answer,
)

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
ARTICLES = example_data_path("search_tool", "articles.jsonl")
QUESTIONS = example_data_path("search_tool", "questions.jsonl")


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index(load_articles(ARTICLES))


def test_corpus_is_small_and_consistent() -> None:
    articles, questions = load_articles(ARTICLES), load_questions(QUESTIONS)
    assert ARTICLES.stat().st_size + QUESTIONS.stat().st_size < 200_000
    assert 40 <= len(articles) <= 50 and len({a.title for a in articles}) == len(articles)
    assert len(questions) >= 3 * len(articles)
    by_title = {a.title: a for a in articles}
    for q in questions:
        # Every question is answered by its article: one of its answers is in the text.
        assert answer_matches(by_title[q.article].text, q.answers), q


def test_bm25_finds_the_article_of_almost_every_question(index: BM25Index) -> None:
    questions = load_questions(QUESTIONS)
    hits = sum(index.search(q.question, 1)[0].title == q.article for q in questions)
    in_top_2 = sum(q.article in [a.title for a in index.search(q.question, 2)] for q in questions)
    # The questions name their subject, which is rare in the corpus; a few share a place name with another article.
    assert hits >= 0.95 * len(questions) and in_top_2 >= 0.98 * len(questions), (hits, in_top_2, len(questions))


def test_search_tool(index: BM25Index) -> None:
    search = make_search_tool(index, top_k=2)
    assert search.spec()["parameters"]["required"] == ["query"]
    result = search.fn(query="Quarrowby founded")
    assert result.startswith("Quarrowby: Quarrowby is a hill town") and result.count("\n\n") == 1
    assert search.fn(query="zzzz qqqq") == "No article matches this query."
    assert search.fn(query="the of and") == "No article matches this query."  # only stopwords


@pytest.mark.parametrize(("reply", "answers", "expected"), [
    ("It was Ilsa Thorne.", ["Ilsa Thorne"], True),
    ("ILSA  THORNE!", ["Ilsa Thorne"], True),
    ("The Amber Oar", ["Amber Oar"], True),
    ("Ilsa Thornewood", ["Ilsa Thorne"], False),  # whole words only
    ("In 14120.", ["1412"], False),
    ("nine minutes", ["nine", "9"], True),
    ("", ["x"], False),
])
def test_answer_matches(reply: str, answers: list[str], expected: bool) -> None:
    assert answer_matches(reply, answers) is expected


def test_normalize_answer() -> None:
    assert normalize_answer("  The Ledger of Oam! ") == "ledger of oam"


def _builder(**kwargs: object) -> SearchToolDatasetBuilder:
    settings = {"batch_size": 3, "group_size": 2, "model_name_for_tokenizer": SMOLLM2, "renderer_name": "chatml_tools",
                "n_batches": 4, "n_test_questions": 5, **kwargs}
    return SearchToolDatasetBuilder(**settings)  # type: ignore[arg-type]


def test_datasets() -> None:
    train, test = asyncio.run(_builder()())
    assert len(train) == 4 and test is not None and len(test) == 1
    batch = train.get_batch(1)
    assert [b.question for b in batch] == [b.question for b in train.get_batch(1)]  # type: ignore[attr-defined]
    test_groups = test.get_batch(0)
    assert [g.logging_tags() for g in test_groups] == [["with_tool"]] * 5 + [["closed_book"]] * 5
    held_out = {g.question.question for g in test_groups}  # type: ignore[attr-defined]
    trained = {b.question.question for i in range(4) for b in train.get_batch(i)}  # type: ignore[attr-defined]
    assert not held_out & trained
    with pytest.raises(IndexError):
        train.get_batch(4)


def test_episode_prompts() -> None:
    train, test = asyncio.run(_builder()())
    group = train.get_batch(0)[0]
    assert isinstance(group, SearchGroupBuilder)
    env = asyncio.run(group.make_envs())[0]
    ob, _ = asyncio.run(env.initial_observation())
    text = group.renderer.decode(ob.to_ints())
    assert '"name": "search"' in text and "Who carved the Zellbrook Fountain?" in text
    assert text.endswith(group.question.question + '<|im_end|>\n<|im_start|>assistant\n<tool_call>\n'
                         '{"name": "search", "arguments": {"query": "')
    assert test is not None
    closed = test.get_batch(0)[-1]
    closed_env = asyncio.run(closed.make_envs())[0]
    closed_text = group.renderer.decode(asyncio.run(closed_env.initial_observation())[0].to_ints())
    assert "search" not in closed_text and closed_text.endswith("<|im_start|>assistant\n")


def test_builder_errors() -> None:
    with pytest.raises(ConfigurationError, match="batch_size=0 must be at least 1"):
        _builder(batch_size=0)
    with pytest.raises(ConfigurationError, match="batch_size=200 is more than the 130 training questions"):
        asyncio.run(_builder(batch_size=200)())
    with pytest.raises(RendererError, match="ChatMLRenderer has no tool-calling format"):
        asyncio.run(_builder(renderer_name="chatml")())
