"""Generate the offline data of the RLHF pipeline (``recipes/preference/rlhf/rlhf_pipeline.py``) in this directory.

    python example-data/rlhf/make_rlhf_data.py       # rewrites the four files (deterministic, fixed seed)

Short factual questions ("What is the capital of Peru?", "What is 7 plus 5?", ...), each answerable in three
styles, ranked by the (simulated) human labeller:

1. ``full``: a complete, helpful sentence that answers the question ("The capital of Peru is Lima.");
2. ``curt``: the bare answer, lower case, no sentence ("lima");
3. ``evasive``: no answer at all ("I'm not sure about that. You could look it up.").

Files:

- ``sft.jsonl``: ``{"messages": [...]}`` conversations for stage 1. The replies mix the three styles (about 30%
  full, 35% curt, 35% evasive), as a first policy trained on uneven human demonstrations would, so the SFT
  policy answers helpfully only some of the time and RL has room to improve it.
- ``comparisons_train.jsonl`` / ``comparisons_test.jsonl``: ``{"prompt", "chosen", "rejected", "styles"}``
  pairs of two different styles of the same question, the better-ranked one chosen (stage 2; the format of the
  DPO pairs, so ``dataset=jsonl`` reads them too). Their prompts are also stage 3's RL prompts (train) and
  held-out evaluation prompts (test).

The test questions are about subjects no train or SFT question mentions (other countries, words, numbers), so
held-out accuracy and win rate measure generalisation, not memory.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

SEED = 4242
HERE = Path(__file__).resolve().parent
NUM_SFT = 192
NUM_TRAIN_PAIRS = 192
NUM_TEST_PAIRS = 64
TEST_FRACTION = 0.25  # of each subject list, held out for the test pairs

CAPITALS = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
    ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Canada", "Ottawa"), ("Norway", "Oslo"), ("Greece", "Athens"),
    ("Russia", "Moscow"), ("China", "Beijing"), ("Mexico", "Mexico City"), ("Portugal", "Lisbon"),
    ("Ireland", "Dublin"), ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Thailand", "Bangkok"), ("Chile", "Santiago"),
    ("Cuba", "Havana"), ("Peru", "Lima"), ("Ghana", "Accra"), ("Nepal", "Kathmandu"), ("Hungary", "Budapest"),
    ("Belgium", "Brussels"), ("Vietnam", "Hanoi"), ("Latvia", "Riga"), ("Czechia", "Prague"),
    ("Colombia", "Bogota"),
]
OPPOSITES = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("happy", "sad"), ("light", "dark"),
    ("open", "closed"), ("early", "late"), ("hard", "soft"), ("wet", "dry"), ("full", "empty"), ("loud", "quiet"),
    ("rich", "poor"), ("thick", "thin"), ("strong", "weak"), ("high", "low"), ("near", "far"), ("clean", "dirty"),
    ("first", "last"), ("push", "pull"), ("day", "night"), ("young", "old"), ("heavy", "light"), ("long", "short"),
    ("sweet", "sour"), ("wide", "narrow"), ("true", "false"), ("north", "south"),
]
COLOURS = [
    ("snow", "white"), ("coal", "black"), ("grass", "green"), ("the sky", "blue"), ("a banana", "yellow"),
    ("a tomato", "red"), ("a carrot", "orange"), ("milk", "white"), ("a crow", "black"), ("a lemon", "yellow"),
    ("a strawberry", "red"), ("a lime", "green"), ("a frog", "green"), ("a pumpkin", "orange"),
    ("a cloud", "white"), ("a cherry", "red"),
]
PLURALS = [
    ("mouse", "mice"), ("child", "children"), ("foot", "feet"), ("tooth", "teeth"), ("goose", "geese"),
    ("man", "men"), ("woman", "women"), ("person", "people"), ("leaf", "leaves"), ("knife", "knives"),
    ("wolf", "wolves"), ("box", "boxes"), ("city", "cities"), ("baby", "babies"), ("bus", "buses"),
    ("fish", "fish"), ("sheep", "sheep"), ("cactus", "cacti"), ("ox", "oxen"), ("half", "halves"),
]
EVASIVE = [
    "I'm not sure about that. You could look it up.",
    "That is hard to say. Maybe ask someone else.",
    "I don't know, sorry.",
    "Good question! I would rather not guess.",
    "Hmm, I cannot help with that right now.",
]

# A question: (prompt, full-sentence answer, bare answer).
Question = tuple[str, str, str]


def _capital(country: str, city: str) -> Question:
    return f"What is the capital of {country}?", f"The capital of {country} is {city}.", city.lower()


def _opposite(word: str, other: str) -> Question:
    return f"What is the opposite of {word}?", f"The opposite of {word} is {other}.", other


def _colour(thing: str, colour: str) -> Question:
    subject = thing[0].upper() + thing[1:]
    return f"What colour is {thing}?", f"{subject} is {colour}.", colour


def _plural(word: str, plural: str) -> Question:
    return f"What is the plural of {word}?", f'The plural of "{word}" is "{plural}".', plural


def _sum(a: int, b: int) -> Question:
    return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}.", str(a + b)


def _split(items: list[tuple[str, str]], make: Callable[[str, str], Question], rng: random.Random
           ) -> tuple[list[Question], list[Question]]:
    order = list(items)
    rng.shuffle(order)
    cut = max(1, round(len(order) * TEST_FRACTION))
    return [make(*x) for x in order[cut:]], [make(*x) for x in order[:cut]]


def questions(rng: random.Random) -> tuple[list[Question], list[Question]]:
    """Train and test questions; the test ones are about held-out subjects."""
    train: list[Question] = []
    test: list[Question] = []
    for items, make in ((CAPITALS, _capital), (OPPOSITES, _opposite), (COLOURS, _colour), (PLURALS, _plural)):
        tr, te = _split(items, make, rng)
        train += tr
        test += te
    # Sums: train on operands 2..29, test on 31..59 (numbers the train data never shows as operands).
    train += [_sum(a, b) for a, b in ((rng.randint(2, 29), rng.randint(2, 29)) for _ in range(30))]
    test += [_sum(a, b) for a, b in ((rng.randint(31, 59), rng.randint(31, 59)) for _ in range(12))]
    return train, test


STYLES = ("full", "curt", "evasive")
RANK = {"full": 2, "curt": 1, "evasive": 0}


def reply(question: Question, style: str, rng: random.Random) -> str:
    _, full, bare = question
    if style == "full":
        return full
    if style == "curt":
        return bare.lower()
    return rng.choice(EVASIVE)


def sft_rows(train: list[Question], rng: random.Random) -> list[dict]:
    rows = []
    for _ in range(NUM_SFT):
        question = rng.choice(train)
        style = rng.choices(STYLES, weights=(0.30, 0.35, 0.35))[0]
        rows.append({"messages": [{"role": "user", "content": question[0]},
                                  {"role": "assistant", "content": reply(question, style, rng)}]})
    return rows


def pair_rows(pool: list[Question], n: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(n):
        question = pool[i % len(pool)] if i < len(pool) else rng.choice(pool)
        a, b = rng.sample(STYLES, 2)
        chosen, rejected = (a, b) if RANK[a] > RANK[b] else (b, a)
        rows.append({"prompt": question[0], "chosen": reply(question, chosen, rng),
                     "rejected": reply(question, rejected, rng), "styles": f"{chosen}>{rejected}"})
    rng.shuffle(rows)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main() -> None:
    rng = random.Random(SEED)
    train, test = questions(rng)
    write_jsonl(HERE / "sft.jsonl", sft_rows(train, rng))
    write_jsonl(HERE / "comparisons_train.jsonl", pair_rows(train, NUM_TRAIN_PAIRS, rng))
    write_jsonl(HERE / "comparisons_test.jsonl", pair_rows(test, NUM_TEST_PAIRS, rng))
    print(f"{len(train)} train questions, {len(test)} test questions")


if __name__ == "__main__":
    main()
