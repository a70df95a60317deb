"""Chat conversations to datums, and the datasets that batch them.

- ``conversation_to_datum``: render one conversation and make its training datum (see ``supervised.common``).
- ``SupervisedDatasetFromHFDataset``: batches over any indexable rows (a Hugging Face ``Dataset`` or a list),
  mapped to datums on demand and reshuffled deterministically by ``set_epoch``.
- ``FromConversationFileBuilder``: a JSONL file with one ``{"messages": [...]}`` conversation per line, rendered
  and checked when the dataset is built, so that a bad line is reported with its file and line number before
  training starts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import chz
import numpy as np

from tinker_cookbook.exceptions import DataError, DataFormatError, RendererError
from tinker_cookbook.supervised.common import Reduction, datum_from_model_input_weights
from tinker_cookbook.supervised.formats import ROW_FORMATS, RowFormat, row_to_messages
from tinker_cookbook.supervised.types import ChatDatasetBuilder, SupervisedDataset
from tinker_cookbook.tinker import types

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Message, Renderer

logger = logging.getLogger(__name__)

DEFAULT_TRAIN_ON_WHAT = "all_assistant_messages"
InvalidRowPolicy = Literal["raise", "skip"]


def conversation_to_datum(
    messages: Sequence[Message],
    renderer: Renderer,
    max_length: int | None,
    train_on_what: str = DEFAULT_TRAIN_ON_WHAT,
    reduction: Reduction = "mean",
) -> types.Datum:
    """Render ``messages`` and make a datum that trains on the tokens ``train_on_what`` selects.

    Raises ``DataError`` when nothing would be trained: the selection is empty (e.g. no assistant message), or
    ``max_length`` cuts the sequence before the first trained token (the prompt alone is longer).
    """
    from tinker_cookbook.renderers import TrainOnWhat

    model_input, weights = renderer.build_supervised_example(messages, TrainOnWhat(train_on_what))
    w = [float(x) for x in weights.tolist()]
    # Position 0 is never a target, so only weights from position 1 on can train anything.
    trained_positions = [i for i, x in enumerate(w) if i > 0 and x > 0]
    if not trained_positions:
        roles = [m.get("role") for m in messages]
        raise DataError(
            f"conversation has no trainable tokens under train_on_what={TrainOnWhat(train_on_what).value} "
            f"(roles {roles}); add an assistant reply or choose another train_on_what"
        )
    if max_length is not None and trained_positions[0] >= max_length:
        raise DataError(
            f"max_length={max_length} is shorter than the prompt: the first trained token is at position "
            f"{trained_positions[0]} of {len(w)}; raise max_length to at least {trained_positions[0] + 1} "
            "or shorten the conversation"
        )
    return datum_from_model_input_weights(model_input, w, max_length=max_length, reduction=reduction)


def check_conversation(row: Any, fmt: str = "auto", columns: Mapping[str, str] | None = None) -> list[Message]:
    """The conversation of a data row in any of the shapes of ``supervised.formats`` (``messages``, ShareGPT,
    Alpaca, prompt/completion; ``fmt`` names one, ``auto`` detects it), after checking its structure; raises
    ``DataFormatError``."""
    return row_to_messages(row, fmt, columns)  # type: ignore[return-value]  # checked to have the Message shape


class SupervisedDatasetFromHFDataset(SupervisedDataset):
    """Batch ``i`` = rows ``order[i*B:(i+1)*B]`` mapped to datums; ``len`` drops the last partial batch.

    Give ``map_fn(row) -> Datum`` or ``flatmap_fn(row) -> list[Datum]``. ``set_epoch(seed)`` draws the row order
    from ``seed`` (the same seed, the same order). A row whose mapping raises ``DataError``/``RendererError`` is
    reported with ``row_name(index)``; with ``on_invalid_row="skip"`` it is left out of its batch instead (except
    errors of the ``raise_on`` types, which always stop: a row of the wrong shape is not the odd row to skip).
    """

    def __init__(
        self,
        hf_dataset: Sequence[Any],
        batch_size: int,
        map_fn: Callable[[Any], types.Datum] | None = None,
        flatmap_fn: Callable[[Any], list[types.Datum]] | None = None,
        on_invalid_row: InvalidRowPolicy = "raise",
        row_name: Callable[[int], str] | None = None,
        raise_on: type[Exception] | tuple[type[Exception], ...] = (),
    ) -> None:
        if (map_fn is None) == (flatmap_fn is None):
            raise ValueError("SupervisedDatasetFromHFDataset needs exactly one of map_fn= or flatmap_fn=")
        if batch_size <= 0:
            raise ValueError(f"batch_size={batch_size} must be positive")
        self.rows = hf_dataset
        self.batch_size = batch_size
        self._flatmap = flatmap_fn if flatmap_fn is not None else (lambda row: [map_fn(row)])  # type: ignore[misc]
        self.on_invalid_row = on_invalid_row
        self._row_name = row_name or (lambda i: f"row {i}")
        self._always_raise = raise_on
        self._order = np.arange(len(hf_dataset))

    def set_epoch(self, seed: int = 0) -> None:
        self._order = np.random.default_rng(seed).permutation(len(self.rows))

    def __len__(self) -> int:
        return len(self.rows) // self.batch_size

    def get_batch(self, index: int) -> list[types.Datum]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch index {index} out of range for {len(self)} batches")
        data: list[types.Datum] = []
        for row_index in self._order[index * self.batch_size : (index + 1) * self.batch_size]:
            try:
                data.extend(self._flatmap(self.rows[int(row_index)]))
            except (DataError, RendererError) as exc:
                message = f"{self._row_name(int(row_index))}: {exc}"
                if self.on_invalid_row == "raise" or isinstance(exc, self._always_raise):
                    raise DataError(message) from exc
                logger.warning("skipping %s", message)
        return data


def _read_conversation_file(path: Path, on_invalid_line: InvalidRowPolicy, fmt: str = "auto",
                            columns: Mapping[str, str] | None = None) -> list[tuple[int, list[Message]]]:
    """``(line number, messages)`` of every valid line."""
    rows: list[tuple[int, list[Message]]] = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((number, check_conversation(json.loads(line), fmt, columns)))
            except (json.JSONDecodeError, DataFormatError) as exc:
                message = f"{path}:{number}: not a conversation: {exc}"
                if on_invalid_line == "raise":
                    raise DataFormatError(message + " (pass on_invalid_line=skip to skip such lines)") from exc
                logger.warning("skipping %s", message)
    return rows


@chz.chz
class FromConversationFileBuilder(ChatDatasetBuilder):
    """Conversations from a JSONL file, one row per line: ``{"messages": [...]}``, or a ShareGPT, Alpaca or
    prompt/completion row (``supervised.formats``; detected per row unless ``format`` names one).

    The rows are shuffled with ``shuffle_seed``; the first ``test_size`` become the test set (one batch). Every
    conversation is rendered up front: a line that is not a conversation, has no trainable tokens, or does not
    fit ``max_length`` is reported as ``file:line``, and either stops the build (``on_invalid_line="raise"``) or
    is skipped with a warning (``"skip"``).
    """

    file_path: str
    """The JSONL file."""
    test_size: int = 0
    """Conversations held out as the test set (0: none)."""
    shuffle_seed: int = 0
    """Seed of the shuffle before the test rows are split off."""
    on_invalid_line: InvalidRowPolicy = "raise"
    """``raise``: stop at the first line that cannot train, naming it; ``skip``: warn and leave it out."""
    format: RowFormat = "auto"
    """The rows' shape: messages, sharegpt, alpaca, prompt_completion, or auto (detected from each row's keys)."""
    columns: dict[str, str] = chz.field(default_factory=dict)
    """Read these columns as the expected keys: ``columns.prompt=question`` reads column ``question`` as the prompt."""

    @chz.validate
    def _check(self) -> None:
        if self.test_size < 0:
            raise ValueError(f"test_size={self.test_size} must be >= 0")
        if self.on_invalid_line not in ("raise", "skip"):
            raise ValueError(f"on_invalid_line={self.on_invalid_line!r} must be 'raise' or 'skip'")
        if self.format not in ROW_FORMATS:
            raise ValueError(f"format={self.format!r} must be one of {list(ROW_FORMATS)}")

    def _datums(self, path: Path) -> list[types.Datum]:
        cfg = self.common_config
        train_on_what = cfg.train_on_what or DEFAULT_TRAIN_ON_WHAT
        datums: list[types.Datum] = []
        for number, messages in _read_conversation_file(path, self.on_invalid_line, self.format, self.columns):
            try:
                datums.append(conversation_to_datum(messages, self.renderer, cfg.max_length, train_on_what))
            except (DataError, RendererError) as exc:
                message = f"{path}:{number}: {exc}"
                if self.on_invalid_line == "raise":
                    raise DataError(message + " (pass on_invalid_line=skip to skip such lines)") from exc
                logger.warning("skipping %s", message)
        return datums

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        path = Path(self.file_path).expanduser()
        if not path.is_file():
            raise DataError(f"file_path={self.file_path!r} does not exist or is not a file")
        datums = self._datums(path)
        order = np.random.default_rng(self.shuffle_seed).permutation(len(datums))
        datums = [datums[i] for i in order]
        test, train = datums[: self.test_size], datums[self.test_size :]
        batch_size = self.common_config.batch_size
        if len(train) < batch_size:
            raise DataError(
                f"{path} has {len(train)} training conversations after test_size={self.test_size}, fewer than "
                f"batch_size={batch_size}; lower batch_size or test_size, or add data"
            )
        train_ds = SupervisedDatasetFromHFDataset(train, batch_size, map_fn=lambda d: d)
        test_ds = SupervisedDatasetFromHFDataset(test, len(test), map_fn=lambda d: d) if test else None
        logger.info("%s: %d train conversations (%d batches of %d), %d test", path, len(train), len(train_ds),
                    batch_size, len(test))
        return train_ds, test_ds
