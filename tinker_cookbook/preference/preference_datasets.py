"""Preference datasets: where labelled comparisons come from, and how DPO turns them into datums.

Comparison builders (chz configs; each returns ``(train, test | None)`` as ``Comparisons``):

- ``example`` (``ExampleComparisonBuilder``): the project's offline set, ``example-data/preferences/``
  (the chosen reply follows a format instruction stated in the prompt, the rejected one breaks it);
- ``rlhf_example`` (``RLHFExampleComparisonBuilder``): the RLHF pipeline's offline pairs, ``example-data/rlhf/``
  (helpful full-sentence answers over curt ones over evasive ones);
- ``jsonl`` (``JsonlComparisonBuilder``): your own pairs, one ``{"prompt": ..., "chosen": ..., "rejected": ...}``
  per line (see ``parse_pair_row``);
- ``hhh`` (Anthropic/hh-rlhf), ``helpsteer3`` (nvidia/HelpSteer3), ``ultrafeedback``
  (argilla/ultrafeedback-binarized-preferences): hub datasets. Without the hub (and no local copy) they stop at
  once with a message that names the dataset and the offline alternatives.

The short names are module attributes, so chz finds them: ``dataset_builder.comparison_builder=hhh``.

``DPODatasetBuilder`` renders each comparison into two datums (``comparison_to_datums``): the prompt followed by
the chosen completion, then by the rejected one, with weight 1 on the completion's tokens only and no
normalisation (``reduction="none"``), because DPO sums logprobs over each completion. A batch is
``[chosen_0, rejected_0, chosen_1, rejected_1, ...]``; ``batch_size`` counts pairs.

Bad pairs (a tie, an empty completion, identical chosen and rejected, a prompt that does not fit ``max_length``,
a JSONL line without ``chosen``/``rejected``) are errors that name the file and line, found when the dataset is
built, before training starts. ``on_invalid_line="skip"`` on the JSONL builder skips them with a warning instead.
Hub datasets skip such rows (with a warning), since real-world data always has a few.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chz
import numpy as np

from tinker_cookbook.base.example_data import example_data_path
from tinker_cookbook.exceptions import ConfigurationError, DataError, DataFormatError, RendererError
from tinker_cookbook.preference.types import LabeledComparison, check_trainable_pair
from tinker_cookbook.renderers import Message, Renderer
from tinker_cookbook.renderers.messages import validate_conversation
from tinker_cookbook.supervised.data import (
    InvalidRowPolicy,
    SupervisedDatasetFromHFDataset,
    conversation_to_datum,
)
from tinker_cookbook.supervised.types import ChatDatasetBuilder, SupervisedDataset
from tinker_cookbook.tinker import types

logger = logging.getLogger(__name__)

EXAMPLE_DATA_DIR = example_data_path("preferences")
SKIP_HINT = "pass on_invalid_line=skip to the dataset builder (dataset.on_invalid_line=skip in the DPO recipe) to skip"


# ---------------------------------------------------------------------------------------------------------
# Comparisons and their builders
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparisons:
    """Labelled comparisons, converted from raw rows on access (hub datasets have 100k+ rows).

    ``describe(i)`` names row ``i`` in error messages (``file.jsonl:12``). ``check_up_front`` (file data): every
    row is converted and rendered when the dataset is built, so a bad row stops the run before training.
    """

    rows: Sequence[Any]
    to_comparison: Callable[[Any], LabeledComparison]
    describe: Callable[[int], str]
    on_invalid: InvalidRowPolicy = "raise"
    check_up_front: bool = True

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, index: int) -> LabeledComparison:
        return self.to_comparison(self.rows[index])


@chz.chz
class ComparisonDatasetBuilder:
    """Config that builds the train comparisons and optional test comparisons."""

    def __call__(self) -> tuple[Comparisons, Comparisons | None]:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")


def _messages(value: Any, field: str, default_role: str) -> list[Message]:
    """A string (one ``default_role`` message), a message object, or a list of messages."""
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    messages = [value] if isinstance(value, dict) else value
    if not isinstance(messages, list):
        raise DataFormatError(f"'{field}' must be a string, a message or a list of messages, got {type(value).__name__}")
    try:
        validate_conversation(messages, field)
    except RendererError as exc:
        raise DataFormatError(f"'{field}': {exc}") from exc
    return messages


def parse_pair_row(row: Any) -> LabeledComparison:
    """One JSONL row: ``{"prompt": P, "chosen": C, "rejected": R}``.

    ``P`` is a string (one user message) or a list of messages ending with a user message; ``C`` and ``R`` are
    strings (one assistant message), a message, or a list of messages. Raises ``DataFormatError``.
    """
    if not isinstance(row, dict):
        raise DataFormatError(f"expected a JSON object with prompt, chosen and rejected, got {type(row).__name__}")
    missing = [key for key in ("prompt", "chosen", "rejected") if key not in row]
    if missing:
        raise DataFormatError(f"missing {missing} (each line needs 'prompt', 'chosen' and 'rejected'; has {sorted(row)})")
    prompt = _messages(row["prompt"], "prompt", "user")
    if prompt[-1]["role"] != "user":
        raise DataFormatError(f"the prompt must end with a user message, not {prompt[-1]['role']!r}")
    chosen = _messages(row["chosen"], "chosen", "assistant")
    rejected = _messages(row["rejected"], "rejected", "assistant")
    return LabeledComparison.from_pair(prompt, chosen, rejected)


def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    """``(line number, parsed JSON or the decode error)`` of every non-blank line; errors are reported later."""
    rows: list[tuple[int, Any]] = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    rows.append((number, json.loads(line)))
                except json.JSONDecodeError as exc:
                    rows.append((number, exc))
    return rows


def _parse_numbered(item: tuple[int, Any]) -> LabeledComparison:
    _, row = item
    if isinstance(row, json.JSONDecodeError):
        raise DataFormatError(f"not valid JSON ({row})")
    return parse_pair_row(row)


def jsonl_comparisons(path: str | Path, on_invalid: InvalidRowPolicy = "raise") -> Comparisons:
    """The pairs of a JSONL file (see ``parse_pair_row``); rows are named ``path:line``."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"preference file {str(path)!r} does not exist or is not a file")
    rows = _read_jsonl(path)
    return Comparisons(rows, _parse_numbered, lambda i: f"{path}:{rows[i][0]}", on_invalid)


@chz.chz
class JsonlComparisonBuilder(ComparisonDatasetBuilder):
    """Your own pairs: ``train_path`` (and ``test_path``, or the first ``test_size`` shuffled train lines)."""

    train_path: str
    test_path: str | None = None
    test_size: int = 0
    shuffle_seed: int = 0
    on_invalid_line: InvalidRowPolicy = "raise"

    @chz.validate
    def _check(self) -> None:
        if self.on_invalid_line not in ("raise", "skip"):
            raise ValueError(f"on_invalid_line={self.on_invalid_line!r} must be 'raise' or 'skip'")
        if self.test_size < 0 or (self.test_size and self.test_path):
            raise ValueError(f"test_size={self.test_size} must be >= 0, and 0 when test_path is given")

    def __call__(self) -> tuple[Comparisons, Comparisons | None]:
        train = jsonl_comparisons(self.train_path, self.on_invalid_line)
        if self.test_path is not None:
            return train, jsonl_comparisons(self.test_path, self.on_invalid_line)
        if self.test_size == 0:
            return train, None
        order = np.random.default_rng(self.shuffle_seed).permutation(len(train.rows))
        rows = [train.rows[i] for i in order]
        head, tail = rows[: self.test_size], rows[self.test_size :]
        path = Path(self.train_path).expanduser()
        return (
            Comparisons(tail, _parse_numbered, lambda i: f"{path}:{tail[i][0]}", self.on_invalid_line),
            Comparisons(head, _parse_numbered, lambda i: f"{path}:{head[i][0]}", self.on_invalid_line),
        )


@chz.chz
class ExampleComparisonBuilder(ComparisonDatasetBuilder):
    """The project's offline preference set (``example-data/preferences/{train,test}.jsonl``; see the generator,
    ``make_preferences.py`` beside them):
    prompts that state a format instruction; chosen follows it, rejected breaks it. Test prompts are unseen."""

    def __call__(self) -> tuple[Comparisons, Comparisons | None]:
        return jsonl_comparisons(EXAMPLE_DATA_DIR / "train.jsonl"), jsonl_comparisons(EXAMPLE_DATA_DIR / "test.jsonl")


RLHF_DATA_DIR = EXAMPLE_DATA_DIR.parent / "rlhf"


@chz.chz
class RLHFExampleComparisonBuilder(ComparisonDatasetBuilder):
    """The RLHF pipeline's offline pairs (``example-data/rlhf/comparisons_{train,test}.jsonl``, see
    ``make_rlhf_data.py`` there): a full-sentence answer beats a curt one, which beats an evasive one; the test
    questions are about unseen subjects."""

    def __call__(self) -> tuple[Comparisons, Comparisons | None]:
        return (jsonl_comparisons(RLHF_DATA_DIR / "comparisons_train.jsonl"),
                jsonl_comparisons(RLHF_DATA_DIR / "comparisons_test.jsonl"))


# ---------------------------------------------------------------------------------------------------------
# Hub datasets
# ---------------------------------------------------------------------------------------------------------


def load_hub_rows(name: str, path: str, split: str, config_name: str | None = None) -> Any:
    """Rows of a hub dataset, or a ConfigurationError naming the dataset and what to use offline instead."""
    from tinker_cookbook.base.hub import hub_offline
    from tinker_cookbook.supervised.chat_datasets import load_hub_dataset
    from tinker_cookbook.tokenizer_utils import hub_is_reachable

    try:
        return load_hub_dataset(path, split, config_name)
    except ConfigurationError as exc:
        why = ("the hub is switched off (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)" if hub_offline(datasets=True) else "the Hugging Face hub is not reachable"
               if not hub_is_reachable() else f"loading it failed ({exc.__cause__!r:.200})")
        raise ConfigurationError(
            f"dataset={name} needs {path!r} (split {split!r}) from the Hugging Face hub: {why}, and it is not in the "
            "local cache. Offline, use the project's preference set (dataset=example, the default) or your own "
            'pairs (dataset=jsonl dataset.train_path=pairs.jsonl, one {"prompt": ..., "chosen": ..., "rejected": '
            "...} per line)"
        ) from exc


def _hub_comparisons(rows: Any, to_comparison: Callable[[Any], LabeledComparison], what: str) -> Comparisons:
    return Comparisons(rows, to_comparison, lambda i: f"{what} row {i}", on_invalid="skip", check_up_front=False)


_HH_TURN = re.compile(r"\n\n(Human|Assistant): ")


def parse_hh_transcript(text: str) -> list[Message]:
    """``"\\n\\nHuman: ...\\n\\nAssistant: ..."`` (Anthropic HH) as messages."""
    parts = _HH_TURN.split(text)
    if len(parts) < 3 or parts[0].strip():
        raise DataFormatError(f"not a Human/Assistant transcript: {text[:80]!r}")
    roles = {"Human": "user", "Assistant": "assistant"}
    return [{"role": roles[parts[i]], "content": parts[i + 1].strip()} for i in range(1, len(parts), 2)]


def hh_row_to_comparison(row: dict[str, Any]) -> LabeledComparison:
    """Both transcripts share the conversation up to the last assistant turn, which differs."""
    chosen, rejected = parse_hh_transcript(row["chosen"]), parse_hh_transcript(row["rejected"])
    if chosen[-1]["role"] != "assistant" or chosen[:-1] != rejected[:-1]:
        raise DataFormatError("the chosen and rejected transcripts do not share their prompt")
    return LabeledComparison.from_pair(chosen[:-1], chosen[-1:], rejected[-1:])


@chz.chz
class HHHComparisonBuilder(ComparisonDatasetBuilder):
    """Anthropic/hh-rlhf (helpful and harmless, ~160k pairs); the first ``test_size`` rows of its test split."""

    test_size: int = 1024

    def __call__(self) -> tuple[Comparisons, Comparisons | None]:
        train = load_hub_rows("hhh", "Anthropic/hh-rlhf", "train")
        test = load_hub_rows("hhh", "Anthropic/hh-rlhf", "test")
        test = test.select(range(min(self.test_size, len(test))))
        return (_hub_comparisons(train, hh_row_to_comparison, "hh-rlhf train"),
                _hub_comparisons(test, hh_row_to_comparison, "hh-rlhf test"))


def helpsteer3_row_to_comparison(row: dict[str, Any]) -> LabeledComparison:
    """``overall_preference`` < 0: response1 is better, > 0: response2 (ties are filtered out before)."""
    prompt = _messages(row["context"], "context", "user")
    first: list[Message] = [{"role": "assistant", "content": row["response1"]}]
    second: list[Message] = [{"role": "assistant", "content": row["response2"]}]
    better_first = row["overall_preference"] < 0
    return LabeledComparison.from_pair(prompt, first if better_first else second, second if better_first else first)


@chz.chz
class HelpSteer3ComparisonBuilder(ComparisonDatasetBuilder):
    """nvidia/HelpSteer3 (``preference`` subset); its validation split is the test set; ties dropped."""

    def __call__(self) -> tuple[Comparisons, Comparisons | None]:
        splits = [load_hub_rows("helpsteer3", "nvidia/HelpSteer3", split, "preference")
                  for split in ("train", "validation")]
        train, test = (rows.filter(lambda r: r["overall_preference"] != 0) for rows in splits)
        return (_hub_comparisons(train, helpsteer3_row_to_comparison, "HelpSteer3 train"),
                _hub_comparisons(test, helpsteer3_row_to_comparison, "HelpSteer3 validation"))


def ultrafeedback_row_to_comparison(row: dict[str, Any]) -> LabeledComparison:
    return LabeledComparison.from_pair(
        [{"role": "user", "content": row["instruction"]}],
        [{"role": "assistant", "content": row["chosen_response"]}],
        [{"role": "assistant", "content": row["rejected_response"]}],
    )


@chz.chz
class UltraFeedbackComparisonBuilder(ComparisonDatasetBuilder):
    """argilla/ultrafeedback-binarized-preferences; shuffled with seed 0, the first ``test_size`` rows are test."""

    test_size: int = 1024

    def __call__(self) -> tuple[Comparisons, Comparisons | None]:
        rows = load_hub_rows("ultrafeedback", "argilla/ultrafeedback-binarized-preferences", "train").shuffle(seed=0)
        test, train = rows.select(range(self.test_size)), rows.select(range(self.test_size, len(rows)))
        return (_hub_comparisons(train, ultrafeedback_row_to_comparison, "UltraFeedback train"),
                _hub_comparisons(test, ultrafeedback_row_to_comparison, "UltraFeedback test"))


# The names the command line uses (``dataset=hhh``); chz looks them up in this module.
example = ExampleComparisonBuilder
rlhf_example = RLHFExampleComparisonBuilder
jsonl = JsonlComparisonBuilder
hhh = HHHComparisonBuilder
helpsteer3 = HelpSteer3ComparisonBuilder
ultrafeedback = UltraFeedbackComparisonBuilder


# ---------------------------------------------------------------------------------------------------------
# Comparisons to DPO datums
# ---------------------------------------------------------------------------------------------------------


def comparison_to_datums(
    labeled: LabeledComparison, renderer: Renderer, max_length: int | None
) -> tuple[types.Datum, types.Datum]:
    """``(chosen, rejected)`` datums: prompt + completion, weight 1 on the completion's tokens only, unnormalised.

    Raises ``DataError`` for a pair that cannot train (see ``check_trainable_pair``), a prompt that leaves no
    completion token within ``max_length``, or a pair that truncation makes identical.
    """
    check_trainable_pair(labeled)
    prompt = labeled.comparison.prompt_conversation
    chosen, rejected = (
        # LAST_ASSISTANT_TURN: every assistant message after the prompt's final user message, i.e. the completion.
        conversation_to_datum([*prompt, *completion], renderer, max_length, "last_assistant_turn", reduction="none")
        for completion in (labeled.chosen, labeled.rejected)
    )
    if _datum_key(chosen) == _datum_key(rejected):
        raise DataError(
            f"cut to max_length={max_length}, the chosen and rejected sequences are identical (the completions only "
            "differ past the cut); raise max_length"
        )
    return chosen, rejected


def _datum_key(datum: types.Datum) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
    return (tuple(datum.model_input.to_ints()), tuple(datum.loss_fn_inputs["target_tokens"].tolist()),
            tuple(datum.loss_fn_inputs["weights"].tolist()))


@chz.chz
class DPODatasetBuilder(ChatDatasetBuilder):
    """Pairs of datums for DPO from a comparison builder; ``common_config.batch_size`` counts pairs.

    The test set (if any) is one batch of all its pairs.
    """

    comparison_builder: ComparisonDatasetBuilder

    def _render(self, comparisons: Comparisons, index: int) -> list[types.Datum]:
        return list(comparison_to_datums(comparisons.get(index), self.renderer, self.common_config.max_length))

    def _render_all(self, comparisons: Comparisons) -> list[list[types.Datum]]:
        """Every pair rendered now; a bad one raises (naming its row) or is skipped with a warning."""
        pairs: list[list[types.Datum]] = []
        for index in range(len(comparisons)):
            try:
                pairs.append(self._render(comparisons, index))
            except (DataError, RendererError) as exc:
                message = f"{comparisons.describe(index)}: {exc}"
                if comparisons.on_invalid == "raise":
                    raise DataError(f"{message} ({SKIP_HINT} such lines)") from exc
                logger.warning("skipping %s", message)
        if not pairs:
            raise DataError(f"no usable preference pair in {comparisons.describe(0) if len(comparisons) else 'the data'}")
        return pairs

    def _dataset(self, comparisons: Comparisons, batch_size: int | None) -> SupervisedDataset:
        if comparisons.check_up_front:
            pairs = self._render_all(comparisons)
            return SupervisedDatasetFromHFDataset(pairs, batch_size or len(pairs), flatmap_fn=lambda pair: pair)
        return SupervisedDatasetFromHFDataset(
            range(len(comparisons)), batch_size or len(comparisons), flatmap_fn=lambda i: self._render(comparisons, i),
            on_invalid_row="skip", row_name=comparisons.describe,
        )

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        train, test = self.comparison_builder()
        batch_size = self.common_config.batch_size
        train_ds = self._dataset(train, batch_size)
        if len(train_ds) == 0:
            raise DataError(f"{len(train)} training pairs make no full batch of batch_size={batch_size}; lower it")
        test_ds = None if test is None else self._dataset(test, None)
        logger.info("preference data: %d training rows (%d batches of %d pairs), %d test rows", len(train),
                    len(train_ds), batch_size, 0 if test is None else len(test))
        return train_ds, test_ds
