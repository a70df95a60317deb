"""Named chat datasets: the project's example file and hub datasets, chosen by a name on the command line.

``get_chat_dataset_builder(name, common_config)`` accepts

- ``example``: ``example-data/conversations.jsonl`` shipped with the project (works offline);
- a path to a ``.jsonl`` file of ``{"messages": [...]}`` rows;
- ``HuggingFaceH4/no_robots`` (alias ``no_robots``) and ``allenai/tulu-3-sft-mixture`` (alias ``tulu3``), which
  need the Hugging Face hub or a local copy in its cache.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import chz
import numpy as np

from tinker_cookbook.base.example_data import example_data_path
from tinker_cookbook.base.hub import hub_offline
from tinker_cookbook.exceptions import ConfigurationError, DataError, DataFormatError
from tinker_cookbook.supervised.data import (
    DEFAULT_TRAIN_ON_WHAT,
    FromConversationFileBuilder,
    SupervisedDatasetFromHFDataset,
    conversation_to_datum,
)
from tinker_cookbook.supervised.formats import (
    ROW_FORMATS,
    RowFormat,
    detect_format,
    rename_columns,
    row_to_messages,
)
from tinker_cookbook.supervised.types import (
    ChatDatasetBuilder,
    ChatDatasetBuilderCommonConfig,
    SupervisedDataset,
)
from tinker_cookbook.tinker import types

logger = logging.getLogger(__name__)

EXAMPLE_DATA_NAME = "example"
EXAMPLE_TEST_SIZE = 48


def example_conversations_path() -> Path:
    """``example-data/conversations.jsonl`` (of the checkout, or of the installed wheel)."""
    return example_data_path("conversations.jsonl")


OFFLINE_CHAT_ALTERNATIVE = (f"Use dataset={EXAMPLE_DATA_NAME} (the project's example data) or a local .jsonl file "
                            "of {\"messages\": [...]} rows")


def load_hub_dataset(path: str, split: str, name: str | None = None, instead: str = OFFLINE_CHAT_ALTERNATIVE,
                     streaming: bool = False) -> Any:
    """``datasets.load_dataset(path, name, split=split, streaming=streaming)``, or a ConfigurationError that says
    what to do instead (``instead``: the offline alternative, in the caller's terms).

    When the hub does not answer a quick connection check, only the local cache is tried, so an offline machine
    gets its answer in seconds rather than after a minute of retries.
    """
    import datasets

    from tinker_cookbook.tokenizer_utils import hub_is_reachable

    offline = hub_offline(datasets=True) or not hub_is_reachable()
    saved = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = saved or offline
    try:
        return datasets.load_dataset(path, name, split=split, streaming=streaming)
    except Exception as exc:  # datasets raises many types (ConnectionError, FileNotFoundError, HfHubHTTPError, ...)
        why = "the hub is switched off (HF_HUB_OFFLINE=1)" if hub_offline(datasets=True) else (
            "the Hugging Face hub is not reachable" if offline else "loading it from the hub failed")
        raise ConfigurationError(
            f"dataset={path!r} could not be loaded: {why} and it is not in the local cache "
            f"({type(exc).__name__}: {str(exc)[:200]}). {instead}, or download it where the hub is reachable"
        ) from exc
    finally:
        datasets.config.HF_HUB_OFFLINE = saved


def _hub_chat_dataset(
    builder: ChatDatasetBuilder, rows: Any, batch_size: int, train_on_what: str, what: str
) -> SupervisedDataset:
    # Real-world hub data has the odd conversation that cannot train (e.g. cut by max_length): skip those.
    return rows_dataset(builder, rows, batch_size, train_on_what, "messages", what, columns={})


@chz.chz
class NoRobotsBuilder(ChatDatasetBuilder):
    """HuggingFaceH4/no_robots: 9.5k human-written instruction conversations; its own test split (500)."""

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        train_on_what = self.common_config.train_on_what or DEFAULT_TRAIN_ON_WHAT
        train = load_hub_dataset("HuggingFaceH4/no_robots", "train")
        test = load_hub_dataset("HuggingFaceH4/no_robots", "test")
        bs = self.common_config.batch_size
        return (
            _hub_chat_dataset(self, train, bs, train_on_what, "no_robots train"),
            _hub_chat_dataset(self, test, len(test), train_on_what, "no_robots test"),
        )


@chz.chz
class Tulu3Builder(ChatDatasetBuilder):
    """allenai/tulu-3-sft-mixture; shuffled with seed 0, the first ``test_size`` rows are the test set."""

    test_size: int = 1024

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        train_on_what = self.common_config.train_on_what or "last_assistant_message"
        rows = load_hub_dataset("allenai/tulu-3-sft-mixture", "train").shuffle(seed=0)
        test = rows.select(range(self.test_size))
        train = rows.select(range(self.test_size, len(rows)))
        bs = self.common_config.batch_size
        return (
            _hub_chat_dataset(self, train, bs, train_on_what, "tulu3 train"),
            _hub_chat_dataset(self, test, len(test), train_on_what, "tulu3 test"),
        )


LOCAL_TABLE_SUFFIXES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


@chz.chz
class FromDatasetBuilder(ChatDatasetBuilder):
    """Any dataset ``datasets`` loads, as conversations: a hub id (``org/name``; the hub or its local cache) or a
    local ``.json`` / ``.jsonl`` / ``.csv`` / ``.parquet`` file, with rows in any shape of ``supervised.formats``.

    The format is detected from the first row (unless ``format`` names one) and the first row is converted before
    training starts, so a wrong shape or column mapping fails at once, naming the row and the shapes expected.
    Rows that convert but cannot train (no assistant tokens within ``max_length``) are skipped with a warning.
    """

    source: str
    """A hub dataset id (``org/name``) or a local data file."""
    subset: str | None = None
    """The dataset's configuration name (``datasets.load_dataset(source, subset)``), if it has several."""
    split: str = "train"
    """The split trained on."""
    test_split: str | None = None
    """A split of the source used as the test set (e.g. ``test``); None: ``test_size`` rows of ``split``."""
    test_size: int = 0
    """Rows of ``split`` held out as the test set when ``test_split`` is None (0: no test set)."""
    format: RowFormat = "auto"
    """The rows' shape: messages, sharegpt, alpaca, prompt_completion, or auto (detected from the first row)."""
    columns: dict[str, str] = chz.field(default_factory=dict)
    """Read these columns as the expected keys: ``columns.prompt=question columns.completion=answer``."""
    streaming: bool = False
    """Stream the hub dataset instead of downloading it whole; reads the first ``max_rows`` rows (required)."""
    max_rows: int | None = None
    """Use at most this many rows of ``split`` (None: all)."""
    shuffle_seed: int = 0
    """Seed of the shuffle before the test rows are split off."""

    @chz.validate
    def _check(self) -> None:
        if self.format not in ROW_FORMATS:
            raise ConfigurationError(f"format={self.format!r} must be one of {list(ROW_FORMATS)}")
        if self.test_size < 0:
            raise ConfigurationError(f"test_size={self.test_size} must be >= 0")
        if self.max_rows is not None and self.max_rows < 1:
            raise ConfigurationError(f"max_rows={self.max_rows} must be at least 1 (or None: all rows)")
        if self.streaming and self.max_rows is None:
            raise ConfigurationError("streaming=true reads the first max_rows rows of the stream; set max_rows too "
                                     "(e.g. max_rows=10000)")

    def _local_file(self) -> Path | None:
        path = Path(self.source).expanduser()
        if path.suffix.lower() in LOCAL_TABLE_SUFFIXES:
            if not path.is_file():
                raise ConfigurationError(f"dataset {self.source!r}: no such file")
            return path
        return None

    def _load(self, split: str) -> Any:
        local = self._local_file()
        if local is not None:
            if split != "train":
                raise ConfigurationError(f"a local file has only the split 'train', not {split!r}; use test_size")
            import datasets

            return datasets.load_dataset(LOCAL_TABLE_SUFFIXES[local.suffix.lower()], data_files=str(local),
                                         split="train")
        rows = load_hub_dataset(self.source, split, self.subset, streaming=self.streaming)
        if self.streaming:
            import itertools

            return list(itertools.islice(rows, self.max_rows))  # only these rows are downloaded
        return rows

    def _format(self, rows: Any) -> str:
        if len(rows) == 0:
            raise DataError(f"dataset {self.source!r} split {self.split!r} has no rows")
        try:
            fmt = self.format if self.format != "auto" else detect_format(rename_columns(rows[0], self.columns))
            row_to_messages(rows[0], fmt, self.columns)
        except DataFormatError as exc:
            raise DataFormatError(f"dataset {self.source!r} row 0: {exc}") from exc
        return fmt

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        train_on_what = self.common_config.train_on_what or DEFAULT_TRAIN_ON_WHAT
        rows = self._load(self.split)
        if self.max_rows is not None and not isinstance(rows, list) and len(rows) > self.max_rows:
            rows = rows.select(range(self.max_rows))
        fmt = self._format(rows)
        if self.test_split is not None:
            test = self._load(self.test_split)
            train = rows
        else:
            order = [int(i) for i in np.random.default_rng(self.shuffle_seed).permutation(len(rows))]
            test, train = _subset(rows, order[: self.test_size]), _subset(rows, order[self.test_size:])
        batch_size = self.common_config.batch_size
        if len(train) < batch_size:
            raise DataError(f"dataset {self.source!r} has {len(train)} training rows, fewer than "
                            f"batch_size={batch_size}; lower batch_size or test_size, or add data")
        logger.info("%s (%s rows): %d train, %d test", self.source, fmt, len(train), len(test))
        train_ds = rows_dataset(self, train, batch_size, train_on_what, fmt, f"{self.source} {self.split}")
        test_ds = (rows_dataset(self, test, len(test), train_on_what, fmt, f"{self.source} test") if len(test)
                   else None)
        return train_ds, test_ds


def _subset(rows: Any, indices: list[int]) -> Any:
    return [rows[i] for i in indices] if isinstance(rows, list) else rows.select(indices)


def rows_dataset(builder: ChatDatasetBuilder, rows: Any, batch_size: int, train_on_what: str, fmt: str = "auto",
                 what: str = "dataset", columns: Mapping[str, str] | None = None) -> SupervisedDataset:
    """Batches of ``rows`` (a list of dicts or a ``datasets.Dataset``, in memory) in any shape of
    ``supervised.formats``, rendered with ``builder``'s renderer when a batch is read. A row of the wrong shape
    stops the run naming it; one that cannot train is skipped with a warning."""
    cfg = builder.common_config
    mapping = columns if columns is not None else getattr(builder, "columns", None)

    def to_datum(row: dict[str, Any]) -> types.Datum:
        messages = row_to_messages(row, fmt, mapping)
        return conversation_to_datum(messages, builder.renderer, cfg.max_length, train_on_what)  # type: ignore[arg-type]

    return SupervisedDatasetFromHFDataset(rows, batch_size, map_fn=to_datum, on_invalid_row="skip",
                                          row_name=lambda i: f"{what} row {i}", raise_on=DataFormatError)


_HUB_BUILDERS: dict[str, type[ChatDatasetBuilder]] = {
    "HuggingFaceH4/no_robots": NoRobotsBuilder,
    "no_robots": NoRobotsBuilder,
    "allenai/tulu-3-sft-mixture": Tulu3Builder,
    "tulu3": Tulu3Builder,
}


def get_chat_dataset_builder(
    name: str, common_config: ChatDatasetBuilderCommonConfig, test_size: int | None = None
) -> ChatDatasetBuilder:
    """The builder for a dataset name (see the module doc); unknown names are a ConfigurationError."""
    if name == EXAMPLE_DATA_NAME:
        path = example_conversations_path()
        size = EXAMPLE_TEST_SIZE if test_size is None else test_size
        return FromConversationFileBuilder(common_config=common_config, file_path=str(path), test_size=size)
    suffix = Path(name).suffix.lower()
    if suffix in LOCAL_TABLE_SUFFIXES:
        if not Path(name).expanduser().is_file():
            raise ConfigurationError(f"dataset={name!r}: no such file")
        if suffix == ".jsonl":
            return FromConversationFileBuilder(common_config=common_config, file_path=name, test_size=test_size or 0)
        return FromDatasetBuilder(common_config=common_config, source=name, test_size=test_size or 0)
    if name in _HUB_BUILDERS:
        builder_class = _HUB_BUILDERS[name]
        if builder_class is Tulu3Builder and test_size is not None:
            return Tulu3Builder(common_config=common_config, test_size=test_size)
        return builder_class(common_config=common_config)
    if HUB_ID.fullmatch(name):
        return FromDatasetBuilder(common_config=common_config, source=name, test_size=test_size or 0)
    known = [EXAMPLE_DATA_NAME, *_HUB_BUILDERS, "<org>/<name> (any hub dataset)", "<path>.jsonl|.json|.csv|.parquet"]
    raise ConfigurationError(f"dataset={name!r} is not a known dataset; use one of {known}")


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
