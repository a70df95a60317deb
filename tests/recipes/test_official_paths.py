"""Code written against the official cookbook imports its names here with the same import lines."""

from __future__ import annotations

import importlib

import pytest

import tinker_cookbook.rl.multiturn.guess_number as guess_number_game
import tinker_cookbook.rl.multiturn.text_arena as text_arena_game
import tinker_cookbook.rl.multiturn.twenty_questions as twenty_questions_game
import tinker_cookbook.rl.rubric as rubric
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
    ("tinker_cookbook.recipes.multiplayer_rl.text_arena.env",
     ["TwoPlayerCoordinator", "TwoPlayerEnv", "TwoPlayerEnvGroupBuilder", "TwoPlayerTextArenaDataset",
      "TwoPlayerTextArenaDatasetBuilder", "ILLEGAL_MOVE_REWARD", "STOP_CONDITION"]),
    ("tinker_cookbook.recipes.multiplayer_rl.text_arena.train", ["main"]),
    ("tinker_cookbook.recipes.multiplayer_rl.text_arena.tictactoe",
     ["OpponentType", "RandomOpponent", "OptimalOpponent", "make_opponent"]),
    ("tinker_cookbook.recipes.multiplayer_rl.text_arena.play", ["PlayConfig", "play_game", "main"]),
    ("tinker_cookbook.recipes.rubric.data", ["Rubric", "RubricBasedDatapoint"]),
    ("tinker_cookbook.recipes.rubric.env",
     ["RubricGradedEnv", "RubricGradedEnvGroupBuilder", "RubricGradedDataset", "RubricGradedDatasetBuilder"]),
    ("tinker_cookbook.recipes.rubric.train", ["main"]),
    ("tinker_cookbook.recipes.rubric.generate_data", ["main"]),
    ("tinker_cookbook.recipes.preference.shorter.env", ["PreferenceModelShorter", "ShorterPreferenceModelBuilder"]),
    ("tinker_cookbook.recipes.preference.shorter.train", ["main"]),
    ("tinker_cookbook.utils.logtree",
     ["init_trace", "scope_header", "scope_header_decorator", "scope_div", "scope_details", "scope_disable",
      "optional_enable_logging", "log_text", "log_html", "log_formatter", "details", "header", "table",
      "table_from_dict", "table_from_dict_of_lists", "write_html_with_default_style", "write_trace_json",
      "jinja_context", "render_with_jinja", "flush_trace", "Trace", "Node", "Theme", "Formatter"]),
    ("tinker_cookbook.utils.logtree_formatters", ["ConversationFormatter"]),
    ("tinker_cookbook.recipes.verifiers_rl.verifiers_env",
     ["VerifiersEnvGroupBuilder", "VerifiersRLDataset", "VerifiersRLDatasetBuilder"]),
    ("tinker_cookbook.recipes.verifiers_rl.train", ["main"]),
    ("tinker_cookbook.recipes.verifiers_rl.tinker_openai", ["TinkerAsyncOpenAIClient"]),
    ("tinker_cookbook.recipes.verifiers_rl.evaluate", ["CLIConfig", "evaluate", "log_results", "cli_main"]),
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
    ("tinker_cookbook.recipes.multiplayer_rl.text_arena.env", text_arena_game),
    ("tinker_cookbook.recipes.rubric.data", rubric),
    ("tinker_cookbook.recipes.rubric.env", rubric),
])
def test_official_paths_are_the_library_modules_not_copies(official, library):
    # One module object: a class imported through either path is the same class (isinstance and chz agree).
    assert importlib.import_module(official) is library
