"""Write the offline rubric set (``example-data/rubric/{train,test}.jsonl``) from the templates below.

    python -m recipes.rubric.generate_data                     # rewrite the shipped files (deterministic)
    python -m recipes.rubric.generate_data out_dir=/tmp/rubric seed=1   # another draw elsewhere

Each datapoint is one short instruction about a topic and two to four criteria a grader can check by reading the
reply (length, form, content), weighted so the weights of a datapoint sum to 1. Topics are split between train and
test, so the test instructions are about topics never trained on.
"""

from __future__ import annotations

import random
from pathlib import Path

import chz

from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.rl.rubric import EXAMPLE_DATA, Rubric, RubricBasedDatapoint

TOPICS = ["apples", "the moon", "bicycles", "rain", "libraries", "coffee", "volcanoes", "trains", "honey bees",
          "winter", "the ocean", "chess", "bread", "mountains", "music", "clocks", "forests", "bridges", "tea",
          "snow", "cats", "maps", "gardens", "rivers", "candles"]

# (instruction template, [(criterion template, weight), ...]); weights of one template sum to 1.
TEMPLATES: list[tuple[str, list[tuple[str, float]]]] = [
    ("Write one sentence about {topic}.",
     [("The reply is about {topic}.", 0.5), ("The reply is a single sentence.", 0.3),
      ("The reply has fewer than 25 words.", 0.2)]),
    ("List three facts about {topic}.",
     [("The reply gives exactly three items.", 0.4), ("Every item is about {topic}.", 0.4),
      ("The items are on separate lines.", 0.2)]),
    ("Describe {topic} in at most ten words.",
     [("The reply has at most ten words.", 0.5), ("The reply describes {topic}.", 0.5)]),
    ("Give a title for a short story about {topic}.",
     [("The reply is a title, not a story.", 0.4), ("The title mentions or clearly refers to {topic}.", 0.4),
      ("The reply has at most eight words.", 0.2)]),
    ("Explain {topic} to a child in two sentences.",
     [("The reply explains {topic}.", 0.4), ("The reply has exactly two sentences.", 0.3),
      ("The reply uses simple words a child knows.", 0.2), ("The reply is friendly in tone.", 0.1)]),
    ("Answer with yes or no, then one short reason: is {topic} something you can hold in your hand?",
     [("The reply starts with yes or no.", 0.5), ("The reply gives a reason.", 0.3),
      ("The reply has fewer than 30 words.", 0.2)]),
]


def datapoint(template: tuple[str, list[tuple[str, float]]], topic: str) -> RubricBasedDatapoint:
    instruction, criteria = template
    return RubricBasedDatapoint(
        convo=[{"role": "user", "content": instruction.format(topic=topic)}],
        rubric_items=[Rubric(text.format(topic=topic), weight=weight) for text, weight in criteria],
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
