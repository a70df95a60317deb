"""How renderers turn text into token ids: a tokenizer's special tokens, encoding that keeps special-token strings
as ordinary text (so message content cannot forge turn boundaries), and the end-of-sequence ids of a vocabulary."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tinker_cookbook.tokenizer_utils import Tokenizer


@dataclass(frozen=True)
class _SpecialTokens:
    pattern: re.Pattern[str] | None
    """Matches any special-token string (longest first); None when the tokenizer has none."""
    ids: dict[str, int]


# Per tokenizer object (tokenizers are cached and shared): its special tokens, and a copy of its Rust tokenizer
# that encodes special-token strings as text. A copy, because the flag lives on the tokenizer and transformers
# itself sets it on the shared one.
_SPECIALS: dict[int, tuple[Any, _SpecialTokens]] = {}
_PLAIN_BACKENDS: dict[int, tuple[Any, Any]] = {}
_CACHE_LOCK = threading.Lock()


def special_tokens(tokenizer: Tokenizer) -> _SpecialTokens:
    with _CACHE_LOCK:
        cached = _SPECIALS.get(id(tokenizer))
        if cached is not None and cached[0] is tokenizer:
            return cached[1]
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        ids = {tok.content: int(i) for i, tok in added.items() if getattr(tok, "special", False) and tok.content}
        pattern = (
            re.compile("|".join(re.escape(s) for s in sorted(ids, key=len, reverse=True))) if ids else None
        )
        specials = _SpecialTokens(pattern, ids)
        _SPECIALS[id(tokenizer)] = (tokenizer, specials)
        return specials


def encode_plain(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` with special-token strings encoded as ordinary text."""
    if not text:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow (Python) tokenizer: it has a per-call switch
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    with _CACHE_LOCK:
        cached = _PLAIN_BACKENDS.get(id(tokenizer))
        if cached is None or cached[0] is not tokenizer:
            from tokenizers import Tokenizer as RustTokenizer

            plain = RustTokenizer.from_str(backend.to_str())
            plain.encode_special_tokens = True
            cached = (tokenizer, plain)
            _PLAIN_BACKENDS[id(tokenizer)] = cached
    return list(cached[1].encode(text, add_special_tokens=False).ids)


ENCODE_CACHE_MAX_CHARS = 48
ENCODE_CACHE_MAX_ENTRIES = 4096

_END_OF_SEQUENCE_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<|eot_id|>", "<|im_end|>")


def end_of_sequence_token_ids(tokenizer: Tokenizer) -> set[int]:
    """The tokenizer's EOS plus the end-of-text tokens of the families we know (base models emit those)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for token in _END_OF_SEQUENCE_TOKENS:
        # A single-id encoding means the string is one (special) token of this vocabulary.
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) == 1 and tokenizer.convert_ids_to_tokens(encoded[0]) == token:
            ids.add(int(encoded[0]))
    return ids
