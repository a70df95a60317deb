"""Pairwise preference data: a prompt conversation with two completions, and which one is preferred.

- ``Comparison``: a prompt conversation and two candidate completions, ``completion_A`` and ``completion_B``
  (each a list of messages, usually one assistant message). This is what a preference model judges.
- ``LabeledComparison``: a comparison with its label, ``"A"``, ``"B"`` or ``"Tie"``. DPO trains on the labelled
  ones that are not ties (``chosen``/``rejected``); a preference model is trained to predict the label.

``LabeledComparison.from_pair(prompt, chosen, rejected)`` builds the usual DPO record (label ``"A"``).
``check_trainable_pair`` says why a comparison cannot be a DPO pair (tie, empty or identical completions).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from tinker_cookbook.exceptions import DataValidationError
from tinker_cookbook.renderers import Message, get_text_content

Label: TypeAlias = Literal["A", "B", "Tie"]
LABELS: tuple[str, ...] = ("A", "B", "Tie")
_SWAPPED: dict[Label, Label] = {"A": "B", "B": "A", "Tie": "Tie"}


@dataclass(frozen=True)
class Comparison:
    """A prompt conversation and two candidate completions of it."""

    prompt_conversation: list[Message]
    completion_A: list[Message]
    completion_B: list[Message]

    def swap(self) -> Comparison:
        """The same comparison with A and B exchanged (to remove position bias from preference models)."""
        return Comparison(self.prompt_conversation, self.completion_B, self.completion_A)


@dataclass(frozen=True)
class LabeledComparison:
    """A comparison and which completion is preferred."""

    comparison: Comparison
    label: Label

    def __post_init__(self) -> None:
        if self.label not in LABELS:
            raise DataValidationError(f"label={self.label!r} is not one of {list(LABELS)}")

    @classmethod
    def from_pair(
        cls, prompt: Sequence[Message], chosen: Sequence[Message], rejected: Sequence[Message]
    ) -> LabeledComparison:
        """A DPO record: ``chosen`` is completion A and preferred."""
        return cls(Comparison(list(prompt), list(chosen), list(rejected)), "A")

    def swap(self) -> LabeledComparison:
        return LabeledComparison(self.comparison.swap(), _SWAPPED[self.label])

    @property
    def chosen(self) -> list[Message]:
        """The preferred completion (a DataValidationError for a tie)."""
        return self._side(preferred=True)

    @property
    def rejected(self) -> list[Message]:
        """The other completion (a DataValidationError for a tie)."""
        return self._side(preferred=False)

    def _side(self, preferred: bool) -> list[Message]:
        if self.label == "Tie":
            raise DataValidationError("a tie has no chosen or rejected completion, so it cannot be a DPO pair")
        a_is_chosen = self.label == "A"
        c = self.comparison
        return c.completion_A if a_is_chosen == preferred else c.completion_B


def completion_text(completion: Sequence[Message]) -> str:
    """The text of a completion's messages, joined (what "empty" and "identical" are judged on)."""
    return "\n".join(get_text_content(m) for m in completion)


def check_trainable_pair(labeled: LabeledComparison) -> None:
    """Raise a DataValidationError when ``labeled`` cannot train DPO: a tie, a completion without text or without
    an assistant message, or chosen and rejected completions that are identical (the loss would be constant)."""
    chosen, rejected = labeled.chosen, labeled.rejected
    for side, completion in (("chosen", chosen), ("rejected", rejected)):
        if not any(m.get("role") == "assistant" for m in completion):
            raise DataValidationError(f"the {side} completion has no assistant message; give it an assistant reply")
        if not completion_text(completion).strip():
            raise DataValidationError(f"the {side} completion is empty; give it some text or drop the pair")
    if list(chosen) == list(rejected):
        raise DataValidationError(
            "the chosen and rejected completions are identical, so the pair carries no preference; drop it"
        )
