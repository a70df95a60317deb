"""Code RL: the policy writes a Python function, its unit tests run in the local sandbox, reward = tests passed.

``CodeEnv`` shows one problem (after one solved example), takes the reply's last fenced code block, runs the
problem's tests on it in ``tinker_cookbook.sandbox`` and scores ``reward = passed / total + format_coef ·
(format − 1)``: a reply is well-formed when it has a code block and ended with the stop token. A run that loops,
allocates without bound, forks, prints too much or crashes passes nothing (reward 0 or −``format_coef``); the
transcript shows the sandbox's reason. Metrics: ``correct`` (every test passed), ``format``, ``pass_fraction``
and one of ``ok``/``timeout``/``memory``/``output_limit``/``crash`` per reply (``no_code`` when nothing ran).

``CodeRLDatasetBuilder`` serves the offline problems of ``tinker_cookbook.rl.code_problems`` (default) or, with
``source="deepcoder"``, the stdin/stdout problems of the DeepCoder set (where the hub or its cache has it).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import chz

from tinker_cookbook import tinker
from tinker_cookbook.completers import StopCondition
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.rl.code_grading import extract_code, run_tests
from tinker_cookbook.rl.code_problems import CodeProblem, split_offline
from tinker_cookbook.rl.problem_env import is_stop_sequence_termination, message_text
from tinker_cookbook.rl.types import Action, Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.sandbox import Outcome, Sandbox, SandboxConfig

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Message, Renderer

ANSWER_FORMAT = "Reply with only the code, in a ```python code block."
STDIN_FORMAT = "Read the input from standard input and print the answer. " + ANSWER_FORMAT
FEWSHOT_PREFIX: list[Message] = [
    {"role": "user", "content": "Write a Python function `times_ten(x)` that returns x multiplied by ten. "
     + ANSWER_FORMAT},
    {"role": "assistant", "content": "```python\ndef times_ten(x):\n    return x * 10\n```"},
]
OUTCOME_METRICS = [*(o.value for o in Outcome), "no_code"]


class CodeEnv(Env):
    """One problem, one reply, reward from its unit tests run in ``sandbox``."""

    def __init__(self, problem: CodeProblem, renderer: Renderer, sandbox: Sandbox,
                 convo_prefix: list[Message] | None = None, format_coef: float = 0.1) -> None:
        self.problem = problem
        self.renderer = renderer
        self.sandbox = sandbox
        self.convo_prefix = list(convo_prefix or [])
        self.format_coef = format_coef

    def question(self) -> str:
        return f"{self.problem.prompt} {STDIN_FORMAT if self.problem.io_tests else ANSWER_FORMAT}"

    @property
    def stop_condition(self) -> StopCondition:
        return self.renderer.get_stop_sequences()

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        messages = [*self.convo_prefix, {"role": "user", "content": self.question()}]
        return self.renderer.build_generation_prompt(messages), self.stop_condition  # type: ignore[arg-type]

    async def step(self, action: Action) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        text = message_text(message)
        code = extract_code(text)
        report = await run_tests(self.sandbox, self.problem, code)
        formatted = code is not None and is_stop_sequence_termination(termination)
        outcome = report.outcome.value if report.outcome is not None else "no_code"
        return StepResult(
            reward=report.fraction + self.format_coef * (float(formatted) - 1.0),
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self.stop_condition,
            metrics={"correct": float(report.passed == report.total), "format": float(formatted),
                     "pass_fraction": report.fraction, **{m: float(m == outcome) for m in OUTCOME_METRICS}},
            logs={"problem": self.problem.name, "response": text, "sandbox": f"{outcome}: {report.reason}"},
        )


class CodeGroupBuilder(EnvGroupBuilder):
    """``group_size`` fresh envs of one problem."""

    def __init__(self, make_env: partial[CodeEnv], group_size: int, dataset_name: str) -> None:
        self.make_env, self.group_size, self.dataset_name = make_env, group_size, dataset_name

    async def make_envs(self) -> Sequence[Env]:
        return [self.make_env() for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return [self.dataset_name]


class CodeDataset(RLDataset):
    """``n_batches`` batches of ``batch_size`` problems drawn (without repeats within a batch) from ``problems``;
    batch ``i`` is drawn from a generator seeded by ``(seed, i)``, so a resumed run replays the same batches."""

    def __init__(self, problems: Sequence[CodeProblem], batch_size: int, group_size: int, n_batches: int,
                 env_factory: partial[CodeEnv], seed: int = 0, dataset_name: str = "code") -> None:
        if batch_size > len(problems):
            raise ConfigurationError(f"batch_size={batch_size} is more than the {len(problems)} problems; lower it")
        self.problems = list(problems)
        self.batch_size, self.group_size, self.n_batches = batch_size, group_size, n_batches
        self.env_factory = env_factory
        self.seed = seed
        self.dataset_name = dataset_name

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < self.n_batches:
            raise IndexError(f"batch index {index} is outside [0, {self.n_batches})")
        chosen = random.Random(f"{self.seed}-{index}").sample(self.problems, self.batch_size)
        return [CodeGroupBuilder(partial(self.env_factory, problem), self.group_size, self.dataset_name)
                for problem in chosen]

    def __len__(self) -> int:
        return self.n_batches


DEEPCODER = "agentica-org/DeepCoder-Preview-Dataset"


def _deepcoder_tests(raw: Any) -> tuple[tuple[str, str], ...]:
    """The stdin/stdout tests of a DeepCoder row (functional tests, which call a named function, are skipped)."""
    tests = json.loads(raw) if isinstance(raw, str) else raw
    if isinstance(tests, dict) and "inputs" in tests:  # TACO's layout: parallel lists
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=False)]
    return tuple((str(t.get("input", "")), str(t.get("output", ""))) for t in tests or []
                 if isinstance(t, dict) and t.get("testtype", "stdin_stdout") == "stdin_stdout")


def load_deepcoder(subsets: Sequence[str], split: str, limit: int) -> list[CodeProblem]:
    """Up to ``limit`` stdin/stdout problems of ``DEEPCODER``'s ``subsets`` (``lcbv5`` = LiveCodeBench v5)."""
    from tinker_cookbook.supervised.chat_datasets import load_hub_dataset

    problems: list[CodeProblem] = []
    for subset in subsets:
        rows = load_hub_dataset(DEEPCODER, split, subset, instead="Use source=offline (the built-in problems)")
        for k, row in enumerate(rows):
            io_tests = _deepcoder_tests(row.get("tests"))
            if io_tests and row.get("problem"):
                problems.append(CodeProblem(f"{subset}-{k}", str(row["problem"]), (), io_tests))
            if len(problems) >= limit:
                return problems
    return problems


@chz.chz
class CodeRLDatasetBuilder(RLDatasetBuilder):
    """Python problems whose unit tests run in a local sandbox; the offline set, or DeepCoder from the hub."""

    batch_size: int
    """Problems per batch (each sampled ``group_size`` times)."""
    group_size: int
    """Samples per problem; rewards are centred within each group."""
    model_name_for_tokenizer: str
    """Whose tokenizer renders the prompts."""
    renderer_name: str
    """How prompts are rendered (``renderers.get_renderer``)."""
    n_batches: int = 20
    """Training batches (iterations)."""
    seed: int = 0
    """Batch ``i`` is drawn from ``(seed, i)``."""
    source: Literal["offline", "deepcoder"] = "offline"
    """``offline``: the built-in function problems; ``deepcoder``: DeepCoder's stdin/stdout problems (hub)."""
    deepcoder_subsets: tuple[str, ...] = ("lcbv5",)
    """DeepCoder configs for ``source=deepcoder``: ``lcbv5`` (LiveCodeBench), ``primeintellect``, ``taco``."""
    max_hub_problems: int = 2000
    """At most this many problems per split from the hub."""
    test_group_size: int = 4
    """Samples per held-out problem."""
    include_fewshot: bool = True
    """Start every prompt with one solved example (the answer format)."""
    format_coef: float = 0.1
    """Penalty for a reply without a code block or cut off before its stop token."""
    sandbox: SandboxConfig = chz.field(default_factory=SandboxConfig)
    """Limits and isolation of the test runs."""

    @chz.validate
    def _check(self) -> None:
        for name in ("batch_size", "group_size", "n_batches", "test_group_size", "max_hub_problems"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}={getattr(self, name)} must be at least 1")

    def problems(self) -> tuple[list[CodeProblem], list[CodeProblem]]:
        if self.source == "offline":
            return split_offline()
        return (load_deepcoder(self.deepcoder_subsets, "train", self.max_hub_problems),
                load_deepcoder(self.deepcoder_subsets, "test", self.max_hub_problems))

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        from tinker_cookbook import renderers
        from tinker_cookbook.tokenizer_utils import get_tokenizer

        renderer = renderers.get_renderer(self.renderer_name, get_tokenizer(self.model_name_for_tokenizer))
        train_problems, test_problems = self.problems()
        factory = partial(_make_env, renderer=renderer, sandbox=Sandbox(self.sandbox),
                          convo_prefix=list(FEWSHOT_PREFIX) if self.include_fewshot else None,
                          format_coef=self.format_coef)
        train = CodeDataset(train_problems, self.batch_size, self.group_size, self.n_batches, factory, self.seed)
        test = None
        if test_problems:
            test = CodeDataset(test_problems, len(test_problems), self.test_group_size, 1, factory, self.seed)
        return train, test


def _make_env(problem: CodeProblem, *, renderer: Renderer, sandbox: Sandbox, convo_prefix: list[Message] | None,
              format_coef: float) -> CodeEnv:
    return CodeEnv(problem, renderer, sandbox, convo_prefix, format_coef)
