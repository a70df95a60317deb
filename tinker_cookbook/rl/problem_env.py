"""Single-turn question/answer envs: the base of the arithmetic and math envs.

A ``ProblemEnv`` shows one question (after an optional few-shot conversation prefix), parses the sampled reply
with the renderer and scores it: ``reward = format_coef · (format − 1) + correct``. So a well-formed wrong answer
gets 0, a well-formed right one 1, and a malformed reply loses ``format_coef`` more. With
``require_stop_sequence_for_format`` a reply counts as well-formed only when it ended with the renderer's stop
sequence (not when it ran out of tokens).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from tinker_cookbook import tinker
from tinker_cookbook.completers import StopCondition
from tinker_cookbook.rl.types import Action, Env, EnvGroupBuilder, StepResult

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Message, Renderer


def message_text(message: Any) -> str:
    """The text of a parsed message whose content is a string or a list of parts (non-text parts skipped)."""
    content = message.get("content", "") if isinstance(message, dict) else message
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")


def is_stop_sequence_termination(termination: Any) -> bool:
    """Whether a parse ended at the renderer's stop sequence (accepts a termination enum or a plain bool)."""
    flag = getattr(termination, "is_stop_sequence", None)
    if flag is not None:
        return bool(flag)
    name = getattr(termination, "name", None)
    if name is not None:
        return name == "STOP_SEQUENCE"
    return bool(termination)


class ProblemEnv(Env):
    """One question, one reply, reward from ``check_format`` and ``check_answer``."""

    def __init__(self, renderer: Renderer, convo_prefix: list[Message] | None = None, format_coef: float = 0.1,
                 require_stop_sequence_for_format: bool = True) -> None:
        self.renderer = renderer
        self.convo_prefix = list(convo_prefix or [])
        self.format_coef = format_coef
        self.require_stop_sequence_for_format = require_stop_sequence_for_format

    @abstractmethod
    def get_question(self) -> str:
        """The user message's text."""

    @abstractmethod
    def check_answer(self, sample_str: str) -> bool:
        """Whether the reply's answer is right."""

    @abstractmethod
    def check_format(self, sample_str: str) -> bool:
        """Whether the reply has the required form (e.g. a ``\\boxed{}`` answer)."""

    @abstractmethod
    def get_reference_answer(self) -> str:
        """The right answer, for transcripts."""

    @property
    def stop_condition(self) -> StopCondition:
        return self.renderer.get_stop_sequences()

    async def initial_observation(self) -> tuple[tinker.ModelInput, StopCondition]:
        messages = [*self.convo_prefix, {"role": "user", "content": self.get_question()}]
        return self.renderer.build_generation_prompt(messages), self.stop_condition  # type: ignore[arg-type]

    async def step(self, action: Action) -> StepResult:
        message, termination = self.renderer.parse_response(action)
        text = message_text(message)
        ended_cleanly = (is_stop_sequence_termination(termination) if self.require_stop_sequence_for_format
                         else bool(termination))
        is_formatted = ended_cleanly and self.check_format(text)
        is_correct = self.check_answer(text)
        reward = self.format_coef * (float(is_formatted) - 1.0) + float(is_correct)
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker.ModelInput.empty(),
            next_stop_condition=self.stop_condition,
            metrics={"format": float(is_formatted), "correct": float(is_correct)},
            logs={"question": self.get_question(), "response": text, "reference": self.get_reference_answer()},
        )


class ProblemGroupBuilder(EnvGroupBuilder):
    """``num_envs`` fresh copies of one problem env (made by ``env_thunk``), tagged with the dataset name."""

    def __init__(self, env_thunk: Callable[[], ProblemEnv], num_envs: int, dataset_name: str = "problems") -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be at least 1 (it is the group size)")
        self.env_thunk = env_thunk
        self.num_envs = num_envs
        self.dataset_name = dataset_name

    async def make_envs(self) -> Sequence[Env]:
        return [self.env_thunk() for _ in range(self.num_envs)]

    def logging_tags(self) -> list[str]:
        return [self.dataset_name]


def problem_group(env_cls: type[ProblemEnv], num_envs: int, dataset_name: str, **env_kwargs: Any
                  ) -> ProblemGroupBuilder:
    """A group builder for ``env_cls(**env_kwargs)`` (a picklable partial, not a lambda)."""
    return ProblemGroupBuilder(partial(env_cls, **env_kwargs), num_envs, dataset_name)
