"""The official cookbook's module path of the rubric data types: importing it gives ``tinker_cookbook.rl.rubric``.

Rubric data and the rubric-graded env are library code in one module; this module is that same module object under
the recipe's name, so ``from tinker_cookbook.recipes.rubric.data import ...`` works unchanged.
"""

import sys

from tinker_cookbook.rl import rubric as _rubric
from tinker_cookbook.rl.rubric import *  # noqa: F403  (the names, for static tools)

sys.modules[__name__] = _rubric
