"""The official cookbook's module path of the verifiers adapter: importing it gives
``tinker_cookbook.rl.verifiers_env``.

The adapter is library code; this module is that same module object under the recipe's name, so
``from tinker_cookbook.recipes.verifiers_rl.verifiers_env import VerifiersRLDatasetBuilder`` works unchanged.
"""

import sys

from tinker_cookbook.rl import verifiers_env as _adapter
from tinker_cookbook.rl.verifiers_env import *  # noqa: F403  (the names, for static tools)

sys.modules[__name__] = _adapter
