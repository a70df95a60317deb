"""The official cookbook's module path of the guess the number env: importing it gives ``tinker_cookbook.rl.multiturn.guess_number``.

The game is library code (tests and other recipes use it); this module is that same module object under the
recipe's name, so ``from tinker_cookbook.recipes.multiplayer_rl.guess_number.env import ...`` works unchanged.
"""

import sys

from tinker_cookbook.rl.multiturn import guess_number as _game
from tinker_cookbook.rl.multiturn.guess_number import *  # noqa: F403  (the names, for static tools)

sys.modules[__name__] = _game
