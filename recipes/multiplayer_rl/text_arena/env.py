"""The official cookbook's module path of the two-player env: importing it gives
``tinker_cookbook.rl.multiturn.text_arena``.

The game is library code; this module is that same module object under the recipe's name, so
``from tinker_cookbook.recipes.multiplayer_rl.text_arena.env import TwoPlayerEnvGroupBuilder`` works unchanged.
"""

import sys

from tinker_cookbook.rl.multiturn import text_arena as _game
from tinker_cookbook.rl.multiturn.text_arena import *  # noqa: F403  (the names, for static tools)

sys.modules[__name__] = _game
