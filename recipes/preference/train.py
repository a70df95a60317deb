"""The Tinker documentation's module path for DPO: ``python -m tinker_cookbook.recipes.preference.train key=value``.

It runs ``recipes/preference/dpo/train.py`` (the one implementation) with the same arguments.
"""

import runpy

if __name__ == "__main__":
    runpy.run_module("recipes.preference.dpo.train", run_name="__main__", alter_sys=True)
