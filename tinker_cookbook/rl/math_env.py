"""Grade-school math word problems (GSM8K format) with answers in ``\\boxed{}``.

``MathEnv`` appends " Write your answer in \\boxed{} format." to the question; a reply is well-formed when it has a
``\\boxed{...}`` and correct when the last boxed answer equals the reference (numbers compared after removing
``$``, ``,`` and spaces). ``Gsm8kDatasetBuilder`` reads ``openai/gsm8k`` (config ``main``; the answer follows
``####``) with ``source="hub"``; the default ``source="offline"`` generates word problems of the same shape and
answer format from templates, so the env works on machines without a model hub.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import chz

from tinker_cookbook.rl.problem_env import ProblemEnv, problem_group
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Message, Renderer

logger = logging.getLogger(__name__)

BOXED_INSTRUCTION = " Write your answer in \\boxed{} format."

STANDARD_FEWSHOT: list[Message] = [
    {"role": "user", "content": "How many r's are in strawberry?" + BOXED_INSTRUCTION},
    {"role": "assistant",
     "content": "Let's spell the word out: s-t-r-a-w-b-e-r-r-y. The letter r appears at positions 3, 8 and 9. "
                "\\boxed{3}"},
]


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    begin = i
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
        i += 1
    return None


def normalize_answer(answer: str) -> str:
    """A canonical form: no ``$``, ``,``, spaces or trailing period; numbers as their shortest decimal form."""
    cleaned = answer.strip().replace("$", "").replace(",", "").replace(" ", "").rstrip(".")
    cleaned = re.sub(r"^\\text\{(.*)\}$", r"\1", cleaned)
    try:
        value = float(cleaned)
    except ValueError:
        return cleaned.lower()
    return str(int(value)) if value.is_integer() else repr(value)


def grade_answer(given: str, reference: str) -> bool:
    return normalize_answer(given) == normalize_answer(reference)


def gsm8k_final_answer(solution: str) -> str:
    """The final answer of a GSM8K solution (the text after ``####``), commas removed."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution has no '####' answer marker: {solution[-80:]!r}")
    return solution.split("####")[-1].strip().replace(",", "")


class MathEnv(ProblemEnv):
    def __init__(self, problem: str, answer: str, renderer: Renderer, convo_prefix: list[Message] | None = None,
                 format_coef: float = 0.1) -> None:
        super().__init__(renderer, convo_prefix, format_coef=format_coef)
        self.problem = problem
        self.answer = answer

    def get_question(self) -> str:
        return self.problem + BOXED_INSTRUCTION

    def check_format(self, sample_str: str) -> bool:
        return extract_boxed(sample_str) is not None

    def check_answer(self, sample_str: str) -> bool:
        boxed = extract_boxed(sample_str)
        return boxed is not None and grade_answer(boxed, self.answer)

    def get_reference_answer(self) -> str:
        return self.answer


# -- offline word problems --------------------------------------------------------------------------------

_NAMES = [("Ava", "she"), ("Liam", "he"), ("Maya", "she"), ("Noah", "he"), ("Zoe", "she"), ("Omar", "he"),
          ("Lena", "she"), ("Ravi", "he"), ("Iris", "she"), ("Theo", "he")]
_ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells"]


@dataclass(frozen=True)
class WordProblem:
    question: str
    solution: str
    """Worked solution ending in ``#### <answer>``, as in GSM8K."""


def _word_problem(rng: random.Random) -> WordProblem:
    name, pronoun = rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    kind = rng.randrange(6)
    a, b, c = rng.randint(2, 20), rng.randint(2, 12), rng.randint(1, 9)
    if kind == 0:
        q = f"{name} has {a} {item}. {pronoun.capitalize()} buys {b} more. How many {item} does {name} have now?"
        s, ans = f"{name} has {a} + {b} = {a + b} {item}.", a + b
    elif kind == 1:
        total = a + b
        q = f"{name} had {total} {item} and gave {b} of them to a friend. How many {item} does {name} have left?"
        s, ans = f"{name} has {total} - {b} = {a} {item} left.", a
    elif kind == 2:
        q = f"A box holds {a} {item}. {name} buys {b} boxes. How many {item} does {pronoun} get?"
        s, ans = f"{name} gets {a} * {b} = {a * b} {item}.", a * b
    elif kind == 3:
        q = f"{name} shares {a * b} {item} equally among {b} friends. How many {item} does each friend get?"
        s, ans = f"Each friend gets {a * b} / {b} = {a} {item}.", a
    elif kind == 4:
        q = (f"{name} earns ${a} per hour. {pronoun.capitalize()} works {b} hours on Monday and {c} hours on "
             f"Tuesday. How many dollars does {name} earn in total?")
        s, ans = f"{name} works {b} + {c} = {b + c} hours and earns {a} * {b + c} = {a * (b + c)} dollars.", \
            a * (b + c)
    else:
        q = (f"{name} reads {a} pages a day for {b} days and then {c} more pages. How many pages does {name} read "
             f"in total?")
        s, ans = f"{name} reads {a} * {b} = {a * b} pages, then {a * b} + {c} = {a * b + c} pages.", a * b + c
    return WordProblem(q, f"{s}\n#### {ans}")


def generate_word_problems(n: int, seed: int) -> list[WordProblem]:
    """``n`` grade-school word problems in GSM8K's format, the same for the same seed."""
    rng = random.Random(seed)
    return [_word_problem(rng) for _ in range(n)]


def load_gsm8k(split: Literal["train", "test"]) -> list[WordProblem]:
    """The ``openai/gsm8k`` (``main``) split from the hub or the local cache."""
    from tinker_cookbook.supervised.chat_datasets import load_hub_dataset

    # Offline, a clear one-line error within seconds instead of the hub client's retries and traceback.
    rows = load_hub_dataset("openai/gsm8k", split, "main",
                            instead="Use source=offline (generated problems in GSM8K's format)")
    return [WordProblem(row["question"], row["answer"]) for row in rows]


class MathDataset(RLDataset):
    """Batches of ``batch_size`` problems (in a seeded shuffled order), each rolled out ``group_size`` times."""

    def __init__(self, problems: list[WordProblem], batch_size: int, group_size: int, renderer: Renderer,
                 convo_prefix: list[Message] | None, seed: int = 0, dataset_name: str = "gsm8k") -> None:
        if len(problems) < batch_size:
            raise ValueError(f"the dataset has {len(problems)} problems, fewer than batch_size={batch_size}; "
                             "lower batch_size or use more problems")
        self.problems = list(problems)
        random.Random(seed).shuffle(self.problems)
        self.batch_size = batch_size
        self.group_size = group_size
        self.renderer = renderer
        self.convo_prefix = convo_prefix
        self.dataset_name = dataset_name

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} is outside [0, {len(self)})")
        chunk = self.problems[index * self.batch_size : (index + 1) * self.batch_size]
        return [problem_group(MathEnv, self.group_size, self.dataset_name, problem=p.question,
                              answer=gsm8k_final_answer(p.solution), renderer=self.renderer,
                              convo_prefix=self.convo_prefix) for p in chunk]

    def __len__(self) -> int:
        return len(self.problems) // self.batch_size


@chz.chz
class Gsm8kDatasetBuilder(RLDatasetBuilder):
    """GSM8K train/test (``source="hub"``) or generated problems of the same format (``source="offline"``)."""

    batch_size: int
    """Problems per batch (each sampled ``group_size`` times)."""
    group_size: int
    """Samples per problem; rewards are centred within each group."""
    model_name_for_tokenizer: str
    """Whose tokenizer renders the prompts."""
    renderer_name: str
    """How prompts are rendered (``renderers.get_renderer``)."""
    convo_prefix: Literal["standard"] | None = "standard"
    """``standard``: prompts start with solved examples; None: no examples."""
    seed: int = 0
    """Shuffling and problem-generation seed."""
    source: Literal["offline", "hub"] = "offline"
    """``offline``: generated problems of the GSM8K format; ``hub``: the real GSM8K (needs the hub or its cache)."""
    n_offline_train: int = 2000
    """Generated training problems (``source=offline``)."""
    n_test: int = 64
    """Test problems."""

    @chz.validate
    def _check(self) -> None:
        for name in ("batch_size", "group_size", "n_offline_train"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        from tinker_cookbook import renderers
        from tinker_cookbook.tokenizer_utils import get_tokenizer

        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name_for_tokenizer))
        prefix = list(STANDARD_FEWSHOT) if self.convo_prefix == "standard" else None
        if self.source == "hub":
            train_problems, test_problems = load_gsm8k("train"), load_gsm8k("test")[: self.n_test]
        else:
            train_problems = generate_word_problems(self.n_offline_train, self.seed)
            test_problems = generate_word_problems(self.n_test, self.seed + 1_000_003)
        train = MathDataset(train_problems, self.batch_size, self.group_size, renderer, prefix, self.seed)
        test = None
        if test_problems:
            test = MathDataset(test_problems, len(test_problems), 1, renderer, prefix, self.seed)
        return train, test
