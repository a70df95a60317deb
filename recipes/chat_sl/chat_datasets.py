"""The official cookbook's module path of the named chat datasets: importing it gives
``tinker_cookbook.supervised.chat_datasets``.

The datasets are library code (the supervised loop's defaults, the math and preference datasets use them); this
module is that same module object under the recipe's name, so
``from tinker_cookbook.recipes.chat_sl.chat_datasets import NoRobotsBuilder`` works unchanged.
"""

import sys

from tinker_cookbook.supervised import chat_datasets as _datasets
from tinker_cookbook.supervised.chat_datasets import *  # noqa: F403  (the names, for static tools)

sys.modules[__name__] = _datasets
