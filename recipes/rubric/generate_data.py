"""Write the offline rubric set (``example-data/rubric/{train,test}.jsonl``) from the templates below.

    python -m recipes.rubric.generate_data                     # rewrite the shipped files (deterministic)
    python -m recipes.rubric.generate_data out_dir=/tmp/rubric seed=1   # another draw elsewhere

Each datapoint is one short instruction about a topic and two to four criteria, weighted so the weights of a
datapoint sum to 1: those about form (length, sentences, lines, first word, naming the topic) are checked by rule,
those about content are graded by the grader model. Topics are split between train and
test, so the test instructions are about topics never trained on.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import chz

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.rl.rubric import EXAMPLE_DATA, Rubric, RubricBasedDatapoint

TOPICS = ["apples", "the moon", "bicycles", "rain", "libraries", "coffee", "volcanoes", "trains", "honey bees",
          "winter", "the ocean", "chess", "bread", "mountains", "music", "clocks", "forests", "bridges", "tea",
          "snow", "cats", "maps", "gardens", "rivers", "candles"]

# (instruction template, [(criterion template, weight, check or None), ...]); weights of one template sum to 1.
# Criteria about form carry a check (rules in tinker_cookbook.rl.rubric_checks) and are scored by rule; the grader
# model judges content. A one-word reply fails most checks, so it cannot win on a grader's indecision.
Criterion = tuple[str, float, dict[str, Any] | None]
TEMPLATES: list[tuple[str, list[Criterion]]] = [
    ("Write one sentence about {topic}.",
     [("The reply is about {topic}.", 0.4, None),
      ("The reply is a single sentence of at least five words.", 0.3, {"sentences": 1, "min_words": 5}),
      ("The reply has fewer than 25 words.", 0.1, {"max_words": 24}),
      ("The reply names {topic}.", 0.2, {"mentions": ["{topic_word}"]})]),
    ("List three facts about {topic}.",
     [("The reply gives exactly three items, one per line.", 0.4, {"lines": 3}),
      ("Every item is about {topic}.", 0.4, None),
      ("The reply names {topic}.", 0.2, {"mentions": ["{topic_word}"]})]),
    ("Describe {topic} in at most ten words.",
     [("The reply has three to ten words.", 0.5, {"min_words": 3, "max_words": 10}),
      ("The reply describes {topic}.", 0.5, None)]),
    ("Give a title for a short story about {topic}.",
     [("The reply is a title, not a story.", 0.4, None),
      ("The title mentions {topic}.", 0.4, {"mentions": ["{topic_word}"]}),
      ("The reply has two to eight words.", 0.2, {"min_words": 2, "max_words": 8})]),
    ("Explain {topic} to a child in two sentences.",
     [("The reply explains {topic}.", 0.4, None),
      ("The reply has exactly two sentences.", 0.3, {"sentences": 2, "min_words": 8}),
      ("The reply uses simple words a child knows.", 0.2, None),
      ("The reply is friendly in tone.", 0.1, None)]),
    ("Answer with yes or no, then one short reason: is {topic} something you can hold in your hand?",
     [("The reply starts with yes or no.", 0.4, {"starts_with": ["yes", "no"]}),
      ("The reply gives a reason.", 0.3, None),
      ("The reply gives a reason after its yes or no, in 4 to 29 words in all.", 0.3,
       {"min_words": 4, "max_words": 29})]),
]


def topic_word(topic: str) -> str:
    """The stem a reply about ``topic`` names: its last word without a plural ending, so that the singular and the
    plural both match ("honey bees" -> "bee", "libraries" -> "librar", "volcanoes" -> "volcano")."""
    word = topic.split()[-1]
    for plural, cut in (("ies", 3), ("oes", 2), ("s", 1)):
        if word.endswith(plural) and not word.endswith("ss"):
            return word[:-cut]
    return word


def fill(check: dict[str, Any] | None, topic: str) -> dict[str, Any] | None:
    if check is None:
        return None
    return {k: [w.format(topic_word=topic_word(topic)) for w in v] if isinstance(v, list) else v
            for k, v in check.items()}


def datapoint(template: tuple[str, list[Criterion]], topic: str) -> RubricBasedDatapoint:
    instruction, criteria = template
    return RubricBasedDatapoint(
        convo=[{"role": "user", "content": instruction.format(topic=topic)}],
        rubric_items=[Rubric(text.format(topic=topic), weight=weight, check=fill(check, topic))
                      for text, weight, check in criteria],
    )


def generate(seed: int, num_test_topics: int) -> tuple[list[RubricBasedDatapoint], list[RubricBasedDatapoint]]:
    """Every template for every topic; the last ``num_test_topics`` topics (seeded order) are the test set's."""
    topics = list(TOPICS)
    random.Random(seed).shuffle(topics)
    train_topics, test_topics = topics[:-num_test_topics], topics[-num_test_topics:]
    train = [datapoint(t, topic) for topic in train_topics for t in TEMPLATES]
    test = [datapoint(t, topic) for topic in test_topics for t in TEMPLATES]
    random.Random(seed + 1).shuffle(train)
    return train, test


@chz.chz
class Config:
    """Where to write the set, and its draw."""

    out_dir: str = str(EXAMPLE_DATA)
    seed: int = 0
    num_test_topics: int = 3
    """Topics held out for the test set (each gives one datapoint per template)."""


def main(cfg: Config) -> None:
    if not 1 <= cfg.num_test_topics < len(TOPICS):
        raise ValueError(f"num_test_topics={cfg.num_test_topics} must be in [1, {len(TOPICS) - 1}]")
    train, test = generate(cfg.seed, cfg.num_test_topics)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, points in (("train", train), ("test", test)):
        (out / f"{name}.jsonl").write_text("".join(p.to_json() + "\n" for p in points), encoding="utf-8")
    print(f"wrote {len(train)} train and {len(test)} test datapoints to {out}")


if __name__ == "__main__":
    run_recipe(main)
