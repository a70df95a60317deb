"""The Hugging Face hub as the libraries see it: whether the user switched it off, whether it answers, and where
its local cache is.

``hub_offline`` reads the switches exactly as the libraries do, so the cookbook never tries the hub where they
would refuse it (or skips it where they would go): huggingface_hub (and transformers, which asks it) takes
``HF_HUB_OFFLINE``, else ``TRANSFORMERS_OFFLINE``, true for 1/ON/YES/TRUE in any case; datasets lets
``HF_DATASETS_OFFLINE``, when it is set at all, decide instead.

``hub_is_reachable`` adds one bounded request per process: the hub clients retry an unreachable host with back-off
for most of a minute, so an offline machine that did not set the switch would wait that long on every lookup.
"""

from __future__ import annotations

import functools
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
_PROBE_TIMEOUT_S = 3.0


def _is_true(value: str | None) -> bool:
    return value is not None and value.upper() in _TRUE_VALUES


def hub_offline(datasets: bool = False) -> bool:
    """Whether offline mode is on for the hub libraries; ``datasets``: as the ``datasets`` library reads it."""
    if datasets and os.environ.get("HF_DATASETS_OFFLINE") is not None:
        return _is_true(os.environ["HF_DATASETS_OFFLINE"])
    return _is_true(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at each call (tests point it elsewhere)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_is_reachable() -> bool:
    """Whether hub downloads may be tried now: offline mode is off and the hub answered a quick check."""
    if hub_offline():
        return False
    from huggingface_hub import constants

    return _answers(constants.ENDPOINT)


@functools.cache
def _answers(endpoint: str) -> bool:
    """One bounded request to the hub per process: any HTTP answer means it is reachable."""
    result: list[bool] = []

    def probe() -> None:
        try:
            request = urllib.request.Request(endpoint, method="HEAD")
            urllib.request.urlopen(request, timeout=_PROBE_TIMEOUT_S)
            result.append(True)
        except urllib.error.HTTPError:
            result.append(True)
        except (OSError, ValueError):
            result.append(False)

    # A thread bounds the wait even where name resolution ignores the socket timeout.
    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(_PROBE_TIMEOUT_S + 1.0)
    return bool(result and result[0])
