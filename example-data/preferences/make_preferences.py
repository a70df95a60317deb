"""Generate the project's example preference pairs: ``train.jsonl`` and ``test.jsonl`` in this directory.

    python example-data/preferences/make_preferences.py       # rewrites both files (deterministic, fixed seed)

Every prompt asks a simple question and states a format instruction ("Answer in capital letters only.",
"Answer as a numbered list.", 'Reply in JSON with the key "answer".', ...). Both completions give the same,
correct content; the chosen one follows the instruction and the rejected one breaks it: it ignores the
instruction (a plain sentence), or follows a different one (lowercase instead of capitals, bullets instead of
numbers), so that telling them apart means reading the instruction, not preferring one style everywhere.

The test split asks about subjects that no training prompt mentions (other countries, words, objects, list
categories and numbers), with the same kinds of instruction, so held-out accuracy measures whether the preference
for following the stated format generalises. One line::

    {"prompt": "What is the capital of Peru? Answer in capital letters only.",
     "chosen": "THE CAPITAL OF PERU IS LIMA.", "rejected": "The capital of Peru is Lima.", "constraint": "upper"}
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SEED = 1234
NUM_TRAIN = 192
NUM_TEST = 64
HERE = Path(__file__).resolve().parent

CAPITALS = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
    ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Canada", "Ottawa"), ("Norway", "Oslo"), ("Greece", "Athens"),
    ("Russia", "Moscow"), ("China", "Beijing"), ("India", "New Delhi"), ("Mexico", "Mexico City"),
    ("Portugal", "Lisbon"), ("Ireland", "Dublin"), ("Austria", "Vienna"), ("Poland", "Warsaw"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Thailand", "Bangkok"),
    ("Argentina", "Buenos Aires"), ("Chile", "Santiago"), ("Cuba", "Havana"), ("Iran", "Tehran"),
    ("Turkey", "Ankara"), ("Hungary", "Budapest"), ("Belgium", "Brussels"), ("Vietnam", "Hanoi"),
    # test only (below the split index)
    ("Peru", "Lima"), ("Ghana", "Accra"), ("Nepal", "Kathmandu"), ("Iraq", "Baghdad"), ("Cyprus", "Nicosia"),
    ("Latvia", "Riga"), ("Czechia", "Prague"), ("Colombia", "Bogota"), ("Ethiopia", "Addis Ababa"),
    ("South Korea", "Seoul"),
]
OPPOSITES = [
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("happy", "sad"), ("light", "dark"),
    ("open", "closed"), ("early", "late"), ("hard", "soft"), ("wet", "dry"), ("full", "empty"), ("old", "new"),
    ("loud", "quiet"), ("rich", "poor"), ("thick", "thin"), ("strong", "weak"), ("high", "low"), ("near", "far"),
    ("clean", "dirty"), ("first", "last"), ("win", "lose"), ("buy", "sell"), ("inside", "outside"),
    ("push", "pull"), ("day", "night"),
    # test only
    ("young", "old"), ("heavy", "light"), ("long", "short"), ("sweet", "sour"), ("brave", "afraid"),
    ("wide", "narrow"), ("true", "false"), ("north", "south"),
]
COLOURS = [
    ("the sky on a clear day", "blue"), ("fresh grass", "green"), ("snow", "white"), ("coal", "black"),
    ("a ripe banana", "yellow"), ("a ripe tomato", "red"), ("an orange", "orange"), ("milk", "white"),
    ("a crow", "black"), ("a lemon", "yellow"), ("a strawberry", "red"), ("a carrot", "orange"),
    ("a lime", "green"), ("a polar bear", "white"), ("the sea in a postcard", "blue"), ("a fire engine", "red"),
    # test only
    ("a frog", "green"), ("a pumpkin", "orange"), ("a raven", "black"), ("a cloud", "white"),
    ("a sunflower", "yellow"), ("a cherry", "red"),
]
CATEGORIES = [
    ("fruits", ["apple", "banana", "cherry", "grape", "mango", "pear", "peach", "plum", "kiwi", "lemon"]),
    ("animals", ["dog", "cat", "horse", "lion", "tiger", "rabbit", "bear", "wolf", "fox", "deer"]),
    ("colours", ["red", "blue", "green", "yellow", "purple", "orange", "pink", "brown", "black", "white"]),
    ("vehicles", ["car", "bus", "train", "bicycle", "truck", "boat", "plane", "tram", "scooter", "van"]),
    ("musical instruments", ["piano", "guitar", "violin", "drum", "flute", "trumpet", "cello", "harp", "banjo"]),
    ("planets", ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn", "Uranus", "Neptune"]),
    ("sports", ["football", "tennis", "golf", "rugby", "cricket", "hockey", "boxing", "rowing", "skiing"]),
    ("vegetables", ["carrot", "potato", "onion", "pea", "cabbage", "leek", "spinach", "pepper", "garlic"]),
    ("birds", ["robin", "eagle", "owl", "sparrow", "parrot", "swan", "crow", "pigeon", "duck", "goose"]),
    ("tools", ["hammer", "saw", "drill", "wrench", "screwdriver", "chisel", "file", "spanner", "axe"]),
    ("drinks", ["water", "tea", "coffee", "milk", "juice", "lemonade", "cocoa", "soda"]),
    ("shapes", ["circle", "square", "triangle", "oval", "star", "hexagon", "rectangle", "diamond"]),
    # test only
    ("trees", ["oak", "pine", "birch", "maple", "willow", "ash", "elm", "cedar", "beech"]),
    ("flowers", ["rose", "tulip", "daisy", "lily", "orchid", "poppy", "violet", "lotus"]),
    ("metals", ["iron", "copper", "gold", "silver", "tin", "zinc", "lead", "nickel"]),
    ("pieces of furniture", ["chair", "table", "bed", "sofa", "desk", "shelf", "stool", "wardrobe"]),
]
TEST_CAPITALS, TEST_OPPOSITES, TEST_COLOURS, TEST_CATEGORIES = 10, 8, 6, 4
TRAIN_NUMBERS, TEST_NUMBERS = range(2, 30), range(30, 60)


@dataclass(frozen=True)
class Answer:
    """One question's answer in three shapes: a word or number, a full sentence, and (lists only) its items."""

    question: str
    short: str
    sentence: str
    items: tuple[str, ...] = ()


def _split(pool: list, n_test: int, test: bool) -> list:
    return pool[-n_test:] if test else pool[:-n_test]


def make_answer(rng: random.Random, test: bool, want_list: bool) -> Answer:
    """A random question (from the train or test subjects) with its answer."""
    if want_list:
        category, members = rng.choice(_split(CATEGORIES, TEST_CATEGORIES, test))
        items = tuple(rng.sample(members, 3))
        return Answer(f"Name three {category}.", items[0], f"Three {category} are {items[0]}, {items[1]} and "
                      f"{items[2]}.", items)
    kind = rng.choice(["capital", "opposite", "colour", "sum"])
    if kind == "capital":
        country, capital = rng.choice(_split(CAPITALS, TEST_CAPITALS, test))
        return Answer(f"What is the capital of {country}?", capital, f"The capital of {country} is {capital}.")
    if kind == "opposite":
        word, opposite = rng.choice(_split(OPPOSITES, TEST_OPPOSITES, test))
        return Answer(f"What is the opposite of {word}?", opposite, f"The opposite of {word} is {opposite}.")
    if kind == "colour":
        thing, colour = rng.choice(_split(COLOURS, TEST_COLOURS, test))
        return Answer(f"What colour is {thing}?", colour, f"{thing[0].upper()}{thing[1:]} is {colour}.")
    numbers = TEST_NUMBERS if test else TRAIN_NUMBERS
    a, b = rng.choice(numbers), rng.choice(numbers)
    return Answer(f"What is {a} plus {b}?", str(a + b), f"{a} plus {b} equals {a + b}.")


# Each constraint: the instruction's phrasings, whether it needs a list question, how to follow it, and which
# other constraints a rejected completion may follow instead (besides ignoring the instruction).
@dataclass(frozen=True)
class Constraint:
    name: str
    instructions: tuple[str, ...]
    follow: Callable[[Answer], str]
    rivals: tuple[str, ...] = ()
    needs_list: bool = False
    needs_short: bool = False


def _bullets(a: Answer) -> str:
    return "\n".join(f"- {item}" for item in a.items)


def _numbered(a: Answer) -> str:
    return "\n".join(f"{i}. {item}" for i, item in enumerate(a.items, start=1))


CONSTRAINTS = {c.name: c for c in [
    Constraint("upper", ("Answer in capital letters only.", "Write your whole answer in UPPERCASE."),
               lambda a: a.sentence.upper(), rivals=("lower",)),
    Constraint("lower", ("Answer in lowercase letters only.", "Do not use any capital letters."),
               lambda a: a.sentence.lower(), rivals=("upper",)),
    Constraint("one_word", ("Answer with a single word or number.", "Reply with just the answer, nothing else."),
               lambda a: a.short, rivals=("prefix",), needs_short=True),
    Constraint("prefix", ('Start your answer with "Answer:".', 'Begin your reply with "Answer:".'),
               lambda a: f"Answer: {a.sentence}", rivals=("suffix",)),
    Constraint("suffix", ('End your answer with the word "Done."', 'Finish your reply with "Done."'),
               lambda a: f"{a.sentence} Done.", rivals=("prefix",)),
    Constraint("json", ('Reply in JSON with the key "answer".', 'Answer with a JSON object like {"answer": ...}.'),
               lambda a: json.dumps({"answer": list(a.items) if a.items else a.short}), rivals=("quotes",)),
    Constraint("quotes", ("Put your whole answer in double quotes.", "Wrap your answer in quotation marks."),
               lambda a: f'"{a.sentence}"', rivals=("json",)),
    Constraint("bullets", ("Answer as a bulleted list.", "Give your answer as a list of bullet points."),
               _bullets, rivals=("numbered",), needs_list=True),
    Constraint("numbered", ("Answer as a numbered list.", "Give your answer as a numbered list."),
               _numbered, rivals=("bullets",), needs_list=True),
]}


def make_pair(rng: random.Random, test: bool) -> dict[str, str]:
    constraint = rng.choice(list(CONSTRAINTS.values()))
    answer = make_answer(rng, test, want_list=constraint.needs_list)
    chosen = constraint.follow(answer)
    # Rejected: either the plain sentence (the instruction ignored) or a rival instruction followed instead.
    rivals = [CONSTRAINTS[r] for r in constraint.rivals if not CONSTRAINTS[r].needs_list or answer.items]
    rejected = rng.choice(rivals).follow(answer) if rivals and rng.random() < 0.5 else answer.sentence
    if rejected == chosen:
        rejected = answer.sentence if chosen != answer.sentence else answer.sentence.upper()
    instruction = rng.choice(constraint.instructions)
    prompt = f"{answer.question} {instruction}" if rng.random() < 0.7 else f"{instruction} {answer.question}"
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "constraint": constraint.name}


def make_split(rng: random.Random, count: int, test: bool) -> list[dict[str, str]]:
    pairs: list[dict[str, str]] = []
    seen: set[str] = set()
    while len(pairs) < count:
        pair = make_pair(rng, test)
        if pair["prompt"] not in seen:  # distinct prompts, so no pair is counted twice
            seen.add(pair["prompt"])
            pairs.append(pair)
    return pairs


def main() -> None:
    rng = random.Random(SEED)
    train, test = make_split(rng, NUM_TRAIN, test=False), make_split(rng, NUM_TEST, test=True)
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in test}
    for name, pairs in (("train", train), ("test", test)):
        path = HERE / f"{name}.jsonl"
        path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
        print(f"wrote {len(pairs)} pairs to {path}")


if __name__ == "__main__":
    main()
