"""One rank of ``test_lost_rank``: rank 0 makes a ``RankedBackend`` and, once rank 1's process is gone (the test
kills it), makes a request and prints the error it gets; rank 1 follows rank 0 until it is killed.

Run with torchrun's variables set (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
"""

from __future__ import annotations

import time

from tinker_cookbook.engine.ranks import RankedBackend, Ranks, follow_leader
from tinker_cookbook.engine.ranks.group import _alive
from tinker_cookbook.tinker import errors

WAIT_S = 60


def main() -> None:
    ranks = Ranks.from_torchrun()
    if not ranks.is_leader:
        follow_leader(ranks)
        return
    lost: list[str] = []
    backend = RankedBackend(ranks, on_failure=lost.append)
    print(f"ready rank1={ranks.members[1].pid}", flush=True)
    deadline = time.monotonic() + WAIT_S
    while _alive(ranks.members[1].pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        backend.handle_for_base("tinker-cookbook/tiny-qwen3")
        print("no error", flush=True)
    except errors.RequestFailedError as exc:
        print(f"request failed: {exc}", flush=True)
    print(f"on_failure calls: {len(lost)}", flush=True)
    backend.close(timeout=10)


if __name__ == "__main__":
    main()
