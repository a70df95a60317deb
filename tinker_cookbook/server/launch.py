"""``tinker-cookbook serve --nproc-per-node N``: start N ranks of the same command with torchrun's launcher.

The launcher (``torch.distributed.run``, what the ``torchrun`` command runs) starts one process per rank on a free
local rendezvous port, watches them, and stops them all as soon as one exits: rank 0 serves HTTP on the ranked
engine, the others run its commands (``tinker_cookbook.backends.serving_backend``). When a rank fails, this prints
which one and how it ended, and the command exits with status 1.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tinker_cookbook.backends import LOST_RANK_STATUS


def _how(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def _cause(failures: Mapping[int, Any]) -> tuple[int, Any]:
    """The rank whose end stopped the others: not one the launcher stopped (SIGTERM) nor one that left because
    another rank was gone (``LOST_RANK_STATUS``); the lowest such rank, else the lowest rank."""
    consequences = (-signal.SIGTERM, LOST_RANK_STATUS)
    causes = sorted(rank for rank, failure in failures.items() if failure.exitcode not in consequences)
    rank = causes[0] if causes else min(failures)
    return rank, failures[rank]


def launch_ranks(nproc: int, argv: Sequence[str]) -> int:
    """Run ``python -m tinker_cookbook.cli *argv`` as ``nproc`` ranks on this machine; the exit status (0 when
    every rank ended normally)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    # --standalone: a rendezvous on this machine on a free port; no restarts: a server with a rank missing stops.
    args = torchrun.parse_args(["--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0", "--module",
                                "tinker_cookbook.cli", *argv])
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        rank, first = _cause(exc.failures)
        print(f"tinker-cookbook serve: rank {rank} (pid {first.pid}) {_how(first.exitcode)}, so every other rank "
              "was stopped and the server is down (that rank's own output above says why it ended)",
              file=sys.stderr, flush=True)
        return 1
    return 0
