"""Tokenizers by model name (the cookbook's import path for them).

The implementation lives in the bottom layer, ``tinker_cookbook.base.tokenizers``, because the engine needs the
same tokenizers and must not import cookbook modules; see that module for the resolution order (registered,
Hugging Face cache/Hub, packaged offline tokenizers).
"""

from tinker_cookbook.base.hub import hub_is_reachable
from tinker_cookbook.base.tokenizers import (
    TINY_MODEL_PREFIX,
    Tokenizer,
    TokenizerFactory,
    get_registered_tokenizer_names,
    get_tokenizer,
    is_tokenizer_registered,
    packaged_tokenizer_family,
    register_tokenizer,
    strip_model_suffix,
    unregister_tokenizer,
)

__all__ = [
    "TINY_MODEL_PREFIX",
    "Tokenizer",
    "TokenizerFactory",
    "get_registered_tokenizer_names",
    "get_tokenizer",
    "hub_is_reachable",
    "is_tokenizer_registered",
    "packaged_tokenizer_family",
    "register_tokenizer",
    "strip_model_suffix",
    "unregister_tokenizer",
]
