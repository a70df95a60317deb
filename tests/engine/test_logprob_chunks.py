"""How many target positions one unembedding chunk holds (``passes.logprob_chunk_tokens``): fewer on a CPU whose
last-level cache then holds a chunk's logits, and the same logprobs and gradients whatever the chunk."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_sessions import lora_session, random_datums

from tinker_cookbook.engine.training import passes

MIB = 1024**2
CPU = torch.device("cpu")


@pytest.mark.parametrize(("vocab", "cache", "expected"), [
    (49152, 32 * MIB, passes.CACHED_CHUNK_TOKENS),  # SmolLM2: 128 rows of logits are 24 MiB, within 80% of 32
    (151936, 32 * MIB, passes.LOGPROB_CHUNK_TOKENS),  # Qwen3: 74 MiB, no
    (128256, 256 * MIB, passes.CACHED_CHUNK_TOKENS),  # Llama 3 on a CPU with a 256 MiB cache: 63 MiB, yes
    (49152, 16 * MIB, passes.LOGPROB_CHUNK_TOKENS),  # a smaller cache: no
    (49152, None, passes.LOGPROB_CHUNK_TOKENS),  # cache size unknown: the default
])
def test_the_cached_chunk_is_chosen_when_its_logits_fit_the_cache(vocab: int, cache: int | None, expected: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(passes, "last_level_cache_bytes", lambda: cache)
    assert passes.logprob_chunk_tokens(vocab, CPU) == expected
    assert passes.logprob_chunk_tokens(vocab, CPU, cache_bytes=cache) == expected


def test_the_boundary_is_the_cache_fill_share() -> None:
    fits = int(passes.CACHED_CHUNK_TOKENS * 4 * 1000 / passes.CACHE_FILL)  # 1000-word rows fill exactly 80%
    assert passes.logprob_chunk_tokens(1000, CPU, cache_bytes=fits) == passes.CACHED_CHUNK_TOKENS
    assert passes.logprob_chunk_tokens(1001, CPU, cache_bytes=fits) == passes.LOGPROB_CHUNK_TOKENS


def test_other_devices_keep_the_default_chunk() -> None:
    assert passes.logprob_chunk_tokens(49152, torch.device("cuda"), cache_bytes=1 << 40) == passes.LOGPROB_CHUNK_TOKENS


def test_the_last_level_cache_is_the_largest_one_linux_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for index, size in enumerate(("48K", "32K", "1024K", "32768K")):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    def read(folder: Path) -> int | None:
        monkeypatch.setattr(passes, "CPU_CACHE_DIR", folder)
        passes.last_level_cache_bytes.cache_clear()  # read once per process: forget this machine's answer
        try:
            return passes.last_level_cache_bytes()
        finally:
            passes.last_level_cache_bytes.cache_clear()

    assert read(tmp_path) == 32 * MIB
    (tmp_path / "index4").mkdir()
    (tmp_path / "index4" / "size").write_text("2M")
    assert read(tmp_path) == 32 * MIB
    assert read(tmp_path / "missing") is None


def test_logprobs_and_gradients_do_not_depend_on_the_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of 300, 130 and 9 targets in chunks of 256 and of 7 (which cut every row in many places). Each
    position's logprob comes from its own logits row either way; only the matmul's row count differs, which may
    pick another kernel and so another summation order (fp32 rounding: ~1e-6 here). The LoRA gradients sum the
    chunks' contributions in another grouping, again rounding only (1e-5 of the norm). A chunk dropped, counted
    twice or shifted by one position moves both by orders of magnitude more."""
    data = random_datums((300, 130, 9), seed=11)
    results = []
    for chunk in (256, 7):
        monkeypatch.setattr(passes, "logprob_chunk_tokens", lambda vocab, device, _chunk=chunk: _chunk)
        session = lora_session("chunks")
        results.append((session.forward(data, "cross_entropy", None, backward=True), session))
    (out_a, a), (out_b, b) = results
    for x, y in zip(out_a.loss_fn_outputs, out_b.loss_fn_outputs, strict=True):
        assert float((x["logprobs"].to_torch() - y["logprobs"].to_torch()).abs().max()) < 1e-5
    assert sum(float(p.grad.norm()) for p in a.params.values() if p.grad is not None) > 0
    for key, p in a.params.items():
        q = b.params[key]
        assert p.grad is not None and q.grad is not None
        # A's gradients are 0 at initialisation (B starts at 0): equal; B's are not.
        assert float((p.grad - q.grad).norm()) <= 1e-5 * float(p.grad.norm()) + 1e-12, key
