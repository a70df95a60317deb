"""Small helpers shared by the training loops: timing, list pairing and splitting, metric averaging."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


@contextmanager
def timed(key: str, metrics: dict[str, Any]) -> Iterator[None]:
    """Time the body and store the seconds in ``metrics[f"time/{key}"]``.

    Example::

        metrics = {}
        with timed("forward_backward", metrics):
            ...
        metrics["time/forward_backward"]  # seconds

    The time is recorded even when the body raises, so a failing phase still shows up in the logs.
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics[f"time/{key}"] = time.perf_counter() - start


def dict_mean(dicts: Sequence[Mapping[str, float | int]]) -> dict[str, float]:
    """Key-wise mean; each key is averaged over the dicts that have it (a key missing from one dict is not a 0)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for d in dicts:
        for key, value in d.items():
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sums}


def all_same(items: Sequence[Any]) -> bool:
    """True when every item equals the first (and for an empty sequence)."""
    return all(item == items[0] for item in items[1:]) if items else True


def safezip(*sequences: Sequence[Any]) -> list[tuple[Any, ...]]:
    """``zip`` that raises when the sequences differ in length, instead of silently truncating."""
    lengths = [len(s) for s in sequences]
    if not all_same(lengths):
        raise ValueError(f"safezip: sequences have different lengths {lengths}; they must pair up one to one")
    return list(zip(*sequences, strict=True))


def split_list(items: Sequence[T], num_parts: int) -> list[list[T]]:
    """Split into ``num_parts`` contiguous parts whose sizes differ by at most one (earlier parts are larger)."""
    if num_parts <= 0:
        raise ValueError(f"split_list: num_parts={num_parts} must be positive")
    if num_parts > len(items):
        raise ValueError(f"split_list: cannot split {len(items)} items into num_parts={num_parts} non-empty parts")
    base, extra = divmod(len(items), num_parts)
    parts: list[list[T]] = []
    start = 0
    for i in range(num_parts):
        size = base + (1 if i < extra else 0)
        parts.append(list(items[start : start + size]))
        start += size
    return parts


def concat_lists(lists: Sequence[Sequence[T]]) -> list[T]:
    """Flatten one level: ``[[1, 2], [3]] -> [1, 2, 3]``."""
    return [item for sub in lists for item in sub]


def not_none(value: T | None) -> T:
    """``value``, raising when it is None (narrows the type for the checker)."""
    if value is None:
        raise ValueError("not_none: got None where a value is required")
    return value


def lookup_func(path: str, default_module: str | None = None) -> Callable[..., Any]:
    """Import ``"package.module:attr"`` (or ``"attr"`` from ``default_module``) and return the attribute."""
    if ":" in path:
        module_name, attr = path.split(":", 1)
    elif default_module is not None:
        module_name, attr = default_module, path
    else:
        raise ValueError(f"lookup_func: {path!r} must look like 'package.module:function' (no default module given)")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ValueError(f"lookup_func: module {module_name!r} has no attribute {attr!r}") from exc


def iteration_dir(log_path: str | Path, iteration: int) -> Path:
    """``<log_path>/iteration_NNNNNN``, created if needed: where per-iteration reports (HTML transcripts) go."""
    path = Path(log_path) / f"iteration_{iteration:06d}"
    path.mkdir(parents=True, exist_ok=True)
    return path
