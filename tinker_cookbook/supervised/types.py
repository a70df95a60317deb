"""The dataset interfaces of the supervised loop.

A ``SupervisedDatasetBuilder`` is a (serializable, chz) config whose call returns ``(train, test | None)``
datasets; a ``SupervisedDataset`` hands out batches of ``Datum`` by index. Datasets are deterministic: batch
``i`` after ``set_epoch(e)`` is always the same, which is what lets a resumed run continue exactly.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import chz

from tinker_cookbook.tinker import types

if TYPE_CHECKING:
    from tinker_cookbook.renderers import Renderer
    from tinker_cookbook.tokenizer_utils import Tokenizer


class SupervisedDataset(ABC):
    """Batches of training data, addressed by index."""

    @abstractmethod
    def get_batch(self, index: int) -> list[types.Datum]:
        """Batch ``index`` (0 <= index < len(self)) of the current epoch's order."""

    @abstractmethod
    def __len__(self) -> int:
        """The number of batches per epoch."""

    def set_epoch(self, seed: int = 0) -> None:
        """Fix the order of the coming epoch (the loops pass the epoch number). Default: order never changes."""


@chz.chz
class SupervisedDatasetBuilder:
    """Config that builds the train dataset and an optional test dataset."""

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")


@chz.chz
class ChatDatasetBuilderCommonConfig:
    """What every chat dataset needs to turn conversations into datums."""

    model_name_for_tokenizer: str
    """Whose tokenizer renders the conversations."""
    renderer_name: str | None = None
    """None: the renderer recommended for ``model_name_for_tokenizer``."""
    max_length: int | None = None
    """Sequences longer than this many tokens are cut (None: no limit)."""
    batch_size: int
    """Conversations per training step."""
    train_on_what: str | None = None
    """A ``renderers.TrainOnWhat`` value; None means the dataset's own default."""

    @chz.validate
    def _check(self) -> None:
        if self.batch_size <= 0:
            raise ValueError(f"batch_size={self.batch_size} must be positive")
        if self.max_length is not None and self.max_length <= 1:
            raise ValueError(f"max_length={self.max_length} must be at least 2 (or None for no limit)")


def resolve_renderer_name(model_name: str, renderer_name: str | None) -> str:
    """``renderer_name``, or the renderer recommended for ``model_name`` when it is None."""
    if renderer_name is not None:
        return renderer_name
    from tinker_cookbook.model_info import get_recommended_renderer_name

    return get_recommended_renderer_name(model_name)


@functools.cache
def _renderer(model_name: str, renderer_name: str) -> Renderer:
    from tinker_cookbook import renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    return renderers.get_renderer(renderer_name, get_tokenizer(model_name), model_name=model_name)


@chz.chz
class ChatDatasetBuilder(SupervisedDatasetBuilder):
    """A dataset builder over chat conversations, rendered with the configured renderer."""

    common_config: ChatDatasetBuilderCommonConfig
    """Tokenizer, renderer, length limit and batch size (what every chat dataset needs)."""

    @property
    def renderer_name(self) -> str:
        cfg = self.common_config
        return resolve_renderer_name(cfg.model_name_for_tokenizer, cfg.renderer_name)

    @property
    def tokenizer(self) -> Tokenizer:
        from tinker_cookbook.tokenizer_utils import get_tokenizer

        return get_tokenizer(self.common_config.model_name_for_tokenizer)

    @property
    def renderer(self) -> Renderer:
        return _renderer(self.common_config.model_name_for_tokenizer, self.renderer_name)
