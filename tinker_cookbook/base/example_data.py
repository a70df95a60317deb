"""Where the project's example data is: the checkout's ``example-data/``, or the copy an installed wheel carries.

A checkout (and an editable install, ``scripts/install.sh``) reads ``example-data/`` next to the package. A wheel
installs the same files under ``<prefix>/share/tinker-cookbook-local/example-data`` (``[tool.setuptools.data-files]``
in ``pyproject.toml``), so the defaults of the recipes and datasets work from ``pip install <wheel>`` too.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

DISTRIBUTION = "tinker-cookbook-local"
EXAMPLE_DATA = "example-data"


def candidate_dirs() -> list[Path]:
    """Where ``example-data`` is looked for, in order: the checkout, then the installed copies' prefixes."""
    checkout = Path(__file__).resolve().parents[2] / EXAMPLE_DATA
    prefixes = [Path(sysconfig.get_path("data")), Path(sys.prefix), Path(sys.base_prefix)]
    installed = [prefix / "share" / DISTRIBUTION / EXAMPLE_DATA for prefix in dict.fromkeys(prefixes)]
    return [checkout, *installed]


def example_data_dir() -> Path:
    """The directory that holds the example data: the first of ``candidate_dirs`` that exists, else the checkout's
    (so that a missing file is reported, by the code that reads it, under the path a checkout would have)."""
    candidates = candidate_dirs()
    return next((path for path in candidates if path.is_dir()), candidates[0])


def example_data_path(*parts: str) -> Path:
    """A file or folder inside the example data, e.g. ``example_data_path("conversations.jsonl")``."""
    return example_data_dir().joinpath(*parts)
