"""The ranks of a data-parallel engine: one process per device in a ``torch.distributed`` process group.

Joining: under ``torchrun`` (its environment: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...) with
``Ranks.from_torchrun()``, which starts the default group (NCCL when the rank's device is a GPU, gloo on a CPU), or
with a group the caller already made (``Ranks(group)``). Everything that crosses ranks is a ``torch.distributed``
collective; this module only wraps them so that a failed collective (a rank that died, a broken connection) becomes
one ``RankFailure`` naming the ranks that stopped, rather than an unexplained error or a hang.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from tinker_cookbook.engine import settings

T = TypeVar("T")

COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)
"""How long a collective may wait for the slowest rank (a long training pass on another rank). A rank that dies is
noticed at once (its connections close); this bounds only a rank that hangs. The leader sends a no-op command
every ``ranks.leader.PING_S`` seconds while idle, so that an idle server never reaches it."""


class RankFailure(RuntimeError):
    """A collective failed: another rank stopped or cannot be reached. The message names the ranks that stopped."""


@dataclass(frozen=True)
class RankMember:
    """Where one rank runs (to name it when it stops)."""

    rank: int
    host: str
    pid: int


def launched_by_torchrun() -> bool:
    """Whether this process is one of several ranks started by ``torchrun`` (``WORLD_SIZE`` above 1)."""
    return settings.torchrun_ranks() is not None


def rank_device(local_rank: int) -> torch.device:
    """The device of a rank: ``$TINKER_COOKBOOK_DEVICE`` when it names one (``cuda`` alone: GPU ``local_rank``),
    else GPU ``local_rank`` when there are GPUs, else the CPU (several CPU ranks share the machine's cores)."""
    chosen = settings.device()
    if chosen not in ("", "auto"):
        device = torch.device(chosen)
        if device.type == "cuda" and device.index is None:  # "cuda": each rank its own GPU, not all on GPU 0
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _local_rank(default: int) -> int:
    """This process's rank on its machine under torchrun, else ``default``."""
    ranks = settings.torchrun_ranks()
    return ranks[2] if ranks is not None else default


def _alive(pid: int) -> bool:
    """Whether a process of this machine runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


class Ranks:
    """This process's place in the group: its rank, the group's size, its device and the collectives it uses."""

    def __init__(self, group: Any = None, device: torch.device | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.device = device if device is not None else rank_device(_local_rank(self.rank))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the object collectives of NCCL use the current device
        self.members: list[RankMember] = []
        self.members = self.all_gather(RankMember(self.rank, socket.gethostname(), os.getpid()))

    @classmethod
    def from_torchrun(cls) -> Ranks:
        """Join the group ``torchrun`` describes in the environment (starting it unless it is already started)."""
        device = rank_device(_local_rank(0))
        if not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
        return cls(None, device)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    # -- collectives (each a RankFailure when another rank is gone) ------------------------------------------

    def _collective(self, what: str, run: Callable[[], T]) -> T:
        try:
            return run()
        except RankFailure:
            raise
        except Exception as exc:  # torch raises RuntimeError/DistBackendError subclasses, with the transport's text
            raise RankFailure(self.describe_failure(what, exc)) from exc

    def broadcast(self, value: Any) -> Any:
        """``value`` of the leader, on every rank."""
        box = [value if self.is_leader else None]
        self._collective("broadcast", lambda: dist.broadcast_object_list(box, src=0, group=self.group))
        return box[0]

    def all_gather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order, on every rank."""
        out: list[Any] = [None] * self.world
        self._collective("all_gather", lambda: dist.all_gather_object(out, value, group=self.group))
        return out

    def scatter(self, values: list[T] | None) -> T:
        """Rank r's item of the leader's ``values`` (one per rank; ignored elsewhere), on rank r."""
        out: list[Any] = [None]
        self._collective("scatter", lambda: dist.scatter_object_list(out, values if self.is_leader else None,
                                                                     src=0, group=self.group))
        return out[0]  # type: ignore[no-any-return]

    def gather(self, value: T) -> list[T] | None:
        """Every rank's ``value`` in rank order, on the leader (None elsewhere)."""
        out: list[Any] | None = [None] * self.world if self.is_leader else None
        self._collective("gather", lambda: dist.gather_object(value, out, dst=0, group=self.group))
        return out

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the ranks, in place on every rank."""
        self._collective("all_reduce", lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group))

    def broadcast_tensor(self, tensor: torch.Tensor) -> None:
        """The leader's values of ``tensor``, in place on every rank."""
        self._collective("broadcast", lambda: dist.broadcast(tensor, src=0, group=self.group))

    # -- naming a rank that stopped ---------------------------------------------------------------------------

    def stopped_ranks(self) -> list[RankMember]:
        """The other ranks of this machine whose process is gone (ranks elsewhere cannot be checked from here)."""
        here = socket.gethostname()
        return [m for m in self.members if m.rank != self.rank and m.host == here and not _alive(m.pid)]

    def describe_failure(self, what: str, exc: BaseException) -> str:
        stopped = self.stopped_ranks()
        if stopped:
            names = ", ".join(f"rank {m.rank} (pid {m.pid} on {m.host})" for m in stopped)
            cause = f"{names} stopped"
        else:
            others = [m for m in self.members if m.rank != self.rank]
            names = ", ".join(f"rank {m.rank} (pid {m.pid} on {m.host})" for m in others) or "the other ranks"
            cause = f"one of {names} stopped or cannot be reached"
        return (f"rank {self.rank}: a {what} with the other ranks failed: {cause} "
                f"({type(exc).__name__}: {str(exc).strip()[:300]}). The engine cannot continue without every rank; "
                "see that rank's output for why it stopped, then restart all ranks")
