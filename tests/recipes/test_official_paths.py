"""Code written against the official cookbook imports its names here with the same import lines."""

from __future__ import annotations

import importlib

import pytest

import tinker_cookbook.rl.multiturn.guess_number as guess_number_game
import tinker_cookbook.rl.multiturn.twenty_questions as twenty_questions_game
import tinker_cookbook.supervised.chat_datasets as chat_datasets

# (official module path, names code written for the official cookbook imports from it)
OFFICIAL_NAMES = [
    ("tinker_cookbook.recipes.multiplayer_rl.twenty_questions.env",
     ["TwentyQuestionsEnv", "TwentyQuestionsEnvGroupBuilder", "TwentyQuestionsDataset", "TwentyQuestionsDatasetBuilder"]),
    ("tinker_cookbook.recipes.multiplayer_rl.twenty_questions.train", ["main"]),
    ("tinker_cookbook.recipes.multiplayer_rl.guess_number.env",
     ["GuessNumberEnv", "GuessNumberEnvGroupBuilder", "GuessNumberDataset", "GuessNumberDatasetBuilder"]),
    ("tinker_cookbook.recipes.multiplayer_rl.guess_number.train", ["main"]),
    ("tinker_cookbook.recipes.chat_sl.chat_datasets", ["NoRobotsBuilder", "Tulu3Builder"]),
]


@pytest.mark.parametrize(("module", "names"), OFFICIAL_NAMES)
def test_official_import_lines_work(module, names):
    imported = importlib.import_module(module)
    missing = [n for n in names if not hasattr(imported, n)]
    assert not missing, f"{module} lacks {missing}"


@pytest.mark.parametrize(("official", "library"), [
    ("tinker_cookbook.recipes.multiplayer_rl.twenty_questions.env", twenty_questions_game),
    ("recipes.multiplayer_rl.twenty_questions.env", twenty_questions_game),
    ("tinker_cookbook.recipes.multiplayer_rl.guess_number.env", guess_number_game),
    ("tinker_cookbook.recipes.chat_sl.chat_datasets", chat_datasets),
    ("recipes.chat_sl.chat_datasets", chat_datasets),
])
def test_official_paths_are_the_library_modules_not_copies(official, library):
    # One module object: a class imported through either path is the same class (isinstance and chz agree).
    assert importlib.import_module(official) is library
