"""What the sampler builds once per base model and shares among all snapshots of that base while any holds it:
the fused base weights of unmerged LoRA snapshots (``sampling.lora``) and the vision tower (``vision``)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_lock = threading.Lock()
_entries: dict[tuple[Hashable, ...], tuple[weakref.ref[Any], list[weakref.ref[torch.Tensor]]]] = {}


def shared(kind: Hashable, base_state: Mapping[str, torch.Tensor], build: Callable[[], T]) -> T:
    """``build()``'s result for ``base_state``, made once per ``kind`` and reused while anything holds it.

    A base is identified by its tensors (the objects, as the trainer's ``BaseModel.base_state`` keeps them): the
    entry holds weak references to them and to the result, so it neither keeps a dropped base (or result) alive nor
    matches a new base whose tensors happen to reuse a dropped one's ids. The result must be weak-referenceable.
    """
    tensors = list(base_state.values())
    key = (kind, tuple(base_state), tuple(id(t) for t in tensors))
    with _lock:
        for stale in [k for k, (ref, _) in _entries.items() if ref() is None]:
            del _entries[stale]
        entry = _entries.get(key)
        if entry is not None:
            value, refs = entry[0](), entry[1]
            if value is not None and all(r() is t for r, t in zip(refs, tensors, strict=True)):
                return value  # type: ignore[no-any-return]
        value = build()
        _entries[key] = (weakref.ref(value), [weakref.ref(t) for t in tensors])
        return value
