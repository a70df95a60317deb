"""The official cookbook's module path of the twenty questions env: importing it gives ``tinker_cookbook.rl.multiturn.twenty_questions``.

The game is library code (tests and other recipes use it); this module is that same module object under the
recipe's name, so ``from tinker_cookbook.recipes.multiplayer_rl.twenty_questions.env import ...`` works unchanged.
"""

import sys

from tinker_cookbook.rl.multiturn import twenty_questions as _game
from tinker_cookbook.rl.multiturn.twenty_questions import *  # noqa: F403  (the names, for static tools)

sys.modules[__name__] = _game
