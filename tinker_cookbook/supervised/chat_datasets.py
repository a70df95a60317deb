"""Named chat datasets: the project's example file and hub datasets, chosen by a name on the command line.

``get_chat_dataset_builder(name, common_config)`` accepts

- ``example``: ``example-data/conversations.jsonl`` shipped with the project (works offline);
- a path to a ``.jsonl`` file of ``{"messages": [...]}`` rows;
- ``HuggingFaceH4/no_robots`` (alias ``no_robots``) and ``allenai/tulu-3-sft-mixture`` (alias ``tulu3``), which
  need the Hugging Face hub or a local copy in its cache.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import chz

from tinker_cookbook.base.hub import hub_offline
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.supervised.data import (
    DEFAULT_TRAIN_ON_WHAT,
    FromConversationFileBuilder,
    SupervisedDatasetFromHFDataset,
    check_conversation,
    conversation_to_datum,
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
    """``example-data/conversations.jsonl`` at the repository root."""
    return Path(__file__).resolve().parents[2] / "example-data" / "conversations.jsonl"


OFFLINE_CHAT_ALTERNATIVE = (f"Use dataset={EXAMPLE_DATA_NAME} (the project's example data) or a local .jsonl file "
                            "of {\"messages\": [...]} rows")


def load_hub_dataset(path: str, split: str, name: str | None = None, instead: str = OFFLINE_CHAT_ALTERNATIVE) -> Any:
    """``datasets.load_dataset(path, name, split=split)``, or a ConfigurationError that says what to do instead
    (``instead``: the offline alternative, in the caller's terms).

    When the hub does not answer a quick connection check, only the local cache is tried, so an offline machine
    gets its answer in seconds rather than after a minute of retries.
    """
    import datasets

    from tinker_cookbook.tokenizer_utils import hub_is_reachable

    offline = hub_offline(datasets=True) or not hub_is_reachable()
    saved = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = saved or offline
    try:
        return datasets.load_dataset(path, name, split=split)
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
    cfg = builder.common_config

    def to_datum(row: dict[str, Any]) -> types.Datum:
        return conversation_to_datum(check_conversation(row), builder.renderer, cfg.max_length, train_on_what)

    # Real-world hub data has the odd conversation that cannot train (e.g. cut by max_length): skip those.
    return SupervisedDatasetFromHFDataset(rows, batch_size, map_fn=to_datum, on_invalid_row="skip",
                                          row_name=lambda i: f"{what} row {i}")


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
    if name.endswith(".jsonl"):
        if not Path(name).expanduser().is_file():
            raise ConfigurationError(f"dataset={name!r}: no such file")
        return FromConversationFileBuilder(common_config=common_config, file_path=name, test_size=test_size or 0)
    if name in _HUB_BUILDERS:
        builder_class = _HUB_BUILDERS[name]
        if builder_class is Tulu3Builder and test_size is not None:
            return Tulu3Builder(common_config=common_config, test_size=test_size)
        return builder_class(common_config=common_config)
    known = [EXAMPLE_DATA_NAME, *_HUB_BUILDERS, "<path>.jsonl"]
    raise ConfigurationError(f"dataset={name!r} is not a known dataset; use one of {known}")
