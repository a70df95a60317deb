"""Data-parallel training and sampling over the ranks of a ``torch.distributed`` process group (one per device).

``RankedBackend`` (rank 0) and ``follow_leader`` (every other rank): see ``leader``. ``launched_backend`` is what the
wiring module uses under ``torchrun``.
"""

from __future__ import annotations

import atexit
import sys
import threading
from collections.abc import Callable

from tinker_cookbook.engine.ranks.group import RankFailure, Ranks, launched_by_torchrun
from tinker_cookbook.engine.ranks.leader import RankedBackend, follow_leader
from tinker_cookbook.tinker.errors import RequestFailedError

__all__ = ["RankFailure", "RankedBackend", "Ranks", "follow_leader", "launched_backend", "launched_by_torchrun"]

_launched: RankedBackend | None = None
_launched_lock = threading.Lock()


def launched_backend(on_failure: Callable[[str], None] | None = None,
                     lost_status: int = 1) -> RankedBackend | None:
    """Under ``torchrun``: on rank 0 the process-wide ``RankedBackend`` (made on the first call); on any other rank,
    run rank 0's commands until it closes, then return None (the caller's process has nothing else to do).

    Rank 0's engine is closed at exit (which stops the others). A rank other than 0 that loses rank 0 (or another
    rank) prints why to stderr and exits with status ``lost_status``.
    """
    global _launched
    with _launched_lock:
        if _launched is not None:
            if _launched.local._closed:
                # The other ranks left when it closed: a new engine would wait for them forever.
                raise RequestFailedError("the ranked engine of this torchrun job was closed, and its other ranks "
                                         "have stopped; start the job again to train or sample")
            return _launched
        ranks = Ranks.from_torchrun()
        if ranks.is_leader:
            _launched = RankedBackend(ranks, on_failure=on_failure)
            # At exit the other ranks must hear Stop, or they would wait for the next command until the timeout.
            atexit.register(_launched.close, 60)
            return _launched
    try:
        follow_leader(ranks)
    except RankFailure as exc:
        print(f"tinker-cookbook: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(lost_status) from None
    return None
