"""The docs' spelling of the recipes: ``python -m tinker_cookbook.recipes.<name>`` runs ``recipes/<name>``.

There is one implementation per recipe, in the top-level ``recipes`` package (``python -m recipes.<name>``). This
package has no modules of its own: its search path is the ``recipes`` package's directory, so every module and
sub-package found there is also importable (and runnable with ``-m``) under this name.
"""

from __future__ import annotations

import importlib.util


def _recipes_dirs() -> list[str]:
    spec = importlib.util.find_spec("recipes")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the top-level 'recipes' package is not importable, so tinker_cookbook.recipes has nothing to run; "
            "run from a checkout installed with scripts/install.sh (pip install -e .)"
        )
    return list(spec.submodule_search_locations)


__path__ = _recipes_dirs()
