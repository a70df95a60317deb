"""(image, label) examples for the VLM classifier, as conversations: the user shows an image and asks for its class,
the assistant answers with the class name.

- ``dataset=colours`` (the default, offline): solid squares of a few colours drawn with PIL at run time, each
  shade jittered and speckled with noise so that no two images are alike; the held-out split is drawn from its own
  random stream, so the classifier is tested on images it never saw. Colours are what even a tiny random
  vision-language model can learn to tell apart (its random vision features still differ by colour).
- Hub datasets (``caltech101``, ``flowers102``, ``oxford_pets``, ``stanford_cars``, or any hub id with an image
  column and a class-label column), where the hub or its local cache has them; offline they stop at once with one
  ``Error:`` line naming ``dataset=colours``.
"""

from __future__ import annotations

import functools
import logging
import random
from dataclasses import dataclass
from typing import Any

import chz
from PIL import Image

from tinker_cookbook import renderers
from tinker_cookbook.exceptions import ConfigurationError, DataFormatError
from tinker_cookbook.supervised.chat_datasets import load_hub_dataset
from tinker_cookbook.supervised.data import SupervisedDatasetFromHFDataset, conversation_to_datum
from tinker_cookbook.supervised.types import ChatDatasetBuilder, SupervisedDataset
from tinker_cookbook.tokenizer_utils import get_tokenizer

logger = logging.getLogger(__name__)

QUESTION = "What is in this image? Answer with the class name only."
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (215, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 70, 215),
    "yellow": (230, 205, 40),
}
OFFLINE_DATASET = "colours"
OFFLINE_ALTERNATIVE = f"Use dataset={OFFLINE_DATASET} (images generated offline)"


@dataclass(frozen=True)
class HubDataset:
    """Where a named hub dataset keeps its images and labels."""

    path: str
    train_split: str = "train"
    test_split: str = "test"
    image_column: str = "image"
    label_column: str = "label"


HUB_DATASETS: dict[str, HubDataset] = {
    "caltech101": HubDataset("dpdl-benchmark/caltech101"),
    "flowers102": HubDataset("dpdl-benchmark/oxford_flowers102"),
    "oxford_pets": HubDataset("dpdl-benchmark/oxford_iiit_pet"),
    "stanford_cars": HubDataset("tanganke/stanford_cars"),
}
"""The docs' datasets by short name; any other name is taken as a hub id with ``image`` and ``label`` columns."""


@dataclass(frozen=True)
class Example:
    image: Image.Image
    label: str


def colour_image(rng: random.Random, colour: str, size: int) -> Image.Image:
    """A ``size`` x ``size`` square of ``colour``: the shade moved by up to ±35 per channel, then per-pixel noise."""
    base = [min(255, max(0, c + rng.randint(-35, 35))) for c in COLOURS[colour]]
    pixels = bytes(min(255, max(0, c + rng.randint(-20, 20))) for _ in range(size * size) for c in base)
    return Image.frombytes("RGB", (size, size), pixels)


def colour_examples(split: str, per_class: int, seed: int, size: int) -> list[Example]:
    """``per_class`` images of every colour, shuffled; ``train`` and ``test`` come from separate random streams."""
    rng = random.Random(f"vlm_classifier:{split}:{seed}")
    examples = [Example(colour_image(rng, colour, size), colour) for _ in range(per_class) for colour in COLOURS]
    rng.shuffle(examples)
    return examples


def hub_examples(name: str, split: str, limit: int) -> list[Example]:
    """The first ``limit`` rows (0: all) of a hub dataset split, labels as class names."""
    spec = HUB_DATASETS.get(name, HubDataset(name))
    rows = load_hub_dataset(spec.path, getattr(spec, f"{split}_split"), instead=OFFLINE_ALTERNATIVE)
    missing = [c for c in (spec.image_column, spec.label_column) if c not in rows.column_names]
    if missing:
        raise DataFormatError(f"dataset={name!r} ({spec.path}) has no column(s) {missing} (it has "
                              f"{rows.column_names}); use a dataset with an image and a class-label column")
    names = getattr(rows.features[spec.label_column], "names", None)
    if limit:
        rows = rows.shuffle(seed=0).select(range(min(limit, len(rows))))
    return [Example(row[spec.image_column].convert("RGB"),
                    (names[row[spec.label_column]] if names else str(row[spec.label_column])).replace("_", " "))
            for row in rows]


def load_examples(dataset: str, split: str, per_class: int, seed: int, image_size: int, hub_limit: int
                  ) -> list[Example]:
    if dataset == OFFLINE_DATASET:
        return colour_examples(split, per_class, seed, image_size)
    if dataset in ("", "none"):
        raise ConfigurationError(f"dataset={dataset!r} names no dataset; use {OFFLINE_DATASET} or one of "
                                 f"{sorted(HUB_DATASETS)}")
    return hub_examples(dataset, split, hub_limit)


def conversation(example: Example, with_answer: bool = True) -> list[renderers.Message]:
    """The user shows the image and asks; the assistant (when ``with_answer``) names the class."""
    content: list[Any] = [{"type": "image", "image": example.image}, {"type": "text", "text": QUESTION}]
    messages = [renderers.Message(role="user", content=content)]
    if with_answer:
        messages.append(renderers.Message(role="assistant", content=example.label))
    return messages


@functools.cache
def vision_renderer(renderer_name: str, model_name: str) -> renderers.Renderer:
    """The renderer with the model's image processor (which sizes each image's tokens)."""
    return renderers.get_renderer(renderer_name, get_tokenizer(model_name), model_name=model_name)


@chz.chz
class VLMClassifierDatasetBuilder(ChatDatasetBuilder):
    """Image-classification conversations: the train split in batches, the held-out split as the test set."""

    dataset: str = OFFLINE_DATASET
    """``colours`` (generated offline), a name of HUB_DATASETS, or a hub id with ``image`` and ``label`` columns."""
    train_per_class: int = 24
    """Generated training images per class (``colours`` only)."""
    test_per_class: int = 8
    """Generated held-out images per class (``colours`` only)."""
    image_size: int = 32
    """Side of the generated images in pixels (``colours`` only; the processor upscales small images)."""
    hub_train_limit: int = 2048
    """Training rows taken from a hub dataset (0: all)."""
    hub_test_limit: int = 256
    """Held-out rows taken from a hub dataset (0: all)."""
    seed: int = 0
    """Seed of the generated images."""

    @chz.validate
    def _check(self) -> None:
        if min(self.train_per_class, self.test_per_class, self.image_size) < 1:
            raise ValueError("train_per_class, test_per_class and image_size must be at least 1")

    @property
    def renderer(self) -> renderers.Renderer:
        return vision_renderer(self.renderer_name, self.common_config.model_name_for_tokenizer)

    def examples(self, split: str) -> list[Example]:
        per_class = self.train_per_class if split == "train" else self.test_per_class
        limit = self.hub_train_limit if split == "train" else self.hub_test_limit
        return load_examples(self.dataset, split, per_class, self.seed, self.image_size, limit)

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        cfg = self.common_config
        train_on_what = cfg.train_on_what or renderers.TrainOnWhat.LAST_ASSISTANT_MESSAGE

        def datum(example: Example) -> Any:
            return conversation_to_datum(conversation(example), self.renderer, cfg.max_length, train_on_what)

        train, test = self.examples("train"), self.examples("test")
        if len(train) < cfg.batch_size:
            raise ConfigurationError(f"dataset={self.dataset!r} has {len(train)} training images, fewer than "
                                     f"batch_size={cfg.batch_size}; lower batch_size or add images")
        logger.info("dataset=%s: %d train images (%d batches of %d), %d held out", self.dataset, len(train),
                    len(train) // cfg.batch_size, cfg.batch_size, len(test))
        return (SupervisedDatasetFromHFDataset(train, cfg.batch_size, map_fn=datum),
                SupervisedDatasetFromHFDataset(test, len(test), map_fn=datum) if test else None)
