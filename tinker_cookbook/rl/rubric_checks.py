"""Rubric criteria checked by rule instead of by a grader model.

A criterion about a reply's form (how many words, sentences or lines; its first word; a word it must mention) has
an answer a program can read off the text. Graded by a model, such a criterion is only as reliable as the model:
a small grader that is unsure of everything gives a one-word reply about 0.5 on every criterion, and a policy
trained against it learns to answer in one word. A criterion with a ``check`` is scored 1 when every rule of the
check holds and 0 otherwise, and the grader model is not asked.

A check is a mapping of rule names to values, e.g. ``{"sentences": 1, "min_words": 4}``::

    min_words, max_words   bounds on the number of words (runs of letters, digits and apostrophes)
    sentences              the exact number of sentences (text ending in . ! or ?, or a line; empty ones not counted)
    lines                  the exact number of non-empty lines
    starts_with            a list of words; the reply's first word must be one of them (case ignored)
    mentions               a list of words or phrases; one must start at a word of the reply (case ignored), so a
                           stem such as "librar" matches "library" and "libraries"
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tinker_cookbook.exceptions import DataError

_WORD = re.compile(r"[A-Za-z0-9']+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def sentences(text: str) -> list[str]:
    """The sentences of ``text``: split after . ! ? and at line breaks; pieces without a word do not count."""
    return [s for s in _SENTENCE_END.split(text.strip()) if words(s)]


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _int_rule(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"check rule {name}={value!r} must be a non-negative integer")
    return value


def _words_rule(name: str, value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not (isinstance(value, list) and value and all(isinstance(v, str) and v.strip() for v in value)):
        raise DataError(f"check rule {name}={value!r} must be a non-empty list of words, e.g. [\"yes\", \"no\"]")
    return [v.strip().lower() for v in value]


def _count(kind: str, counted: Callable[[str], list[str]], compare: Callable[[int, int], bool],
           relation: str) -> Callable[[str, Any], str | None]:
    def rule(text: str, bound: Any) -> str | None:
        n = len(counted(text))
        return None if compare(n, bound) else f"{n} {kind}, {relation} {bound}"
    return rule


def _starts_with(text: str, allowed: Any) -> str | None:
    found = words(text)
    first = found[0].lower() if found else ""
    return None if first in allowed else f"starts with {first or 'nothing'!r}, not one of {allowed}"


def _mentions(text: str, wanted: Any) -> str | None:
    lowered = text.lower()
    found = any(re.search(r"\b" + re.escape(w), lowered) for w in wanted)
    return None if found else f"mentions none of {wanted}"


# rule name -> (how its value is validated, how a reply is checked: None when it holds, else why not)
RULES: dict[str, tuple[Callable[[str, Any], Any], Callable[[str, Any], str | None]]] = {
    "min_words": (_int_rule, _count("words", words, lambda n, b: n >= b, "wanted at least")),
    "max_words": (_int_rule, _count("words", words, lambda n, b: n <= b, "wanted at most")),
    "sentences": (_int_rule, _count("sentences", sentences, lambda n, b: n == b, "wanted")),
    "lines": (_int_rule, _count("lines", lines, lambda n, b: n == b, "wanted")),
    "starts_with": (_words_rule, _starts_with),
    "mentions": (_words_rule, _mentions),
}


def validate_check(check: Mapping[str, Any]) -> dict[str, Any]:
    """The check with its values normalised; a DataError names an unknown rule or a bad value."""
    if not isinstance(check, Mapping) or not check:
        raise DataError(f"a criterion's check must be a non-empty mapping of rules, e.g. {{\"max_words\": 10}}; "
                        f"got {check!r}")
    unknown = sorted(set(check) - set(RULES))
    if unknown:
        raise DataError(f"unknown check rule(s) {unknown}; the rules are {sorted(RULES)}")
    return {name: RULES[name][0](name, value) for name, value in check.items()}


def run_check(check: Mapping[str, Any], text: str) -> tuple[float, str]:
    """1.0 when every rule holds, else 0.0; and what was found (the failed rules, or that all held)."""
    failures = [why for name, value in check.items() if (why := RULES[name][1](text, value)) is not None]
    if failures:
        return 0.0, "check failed: " + "; ".join(failures)
    return 1.0, "check passed: " + ", ".join(f"{name}={value}" for name, value in check.items())
