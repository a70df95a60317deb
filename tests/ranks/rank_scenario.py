"""One rank of the 2-rank test (``test_ranked_training``): rank 0 drives a ``RankedBackend`` through a training
request, an Adam step, a checkpoint and sampling; rank 1 runs the leader's commands. Each writes what it ends with
to ``$RANK_SCENARIO_OUT/rank{r}.pt`` for the test to compare with one process.

Run as ``python rank_scenario.py`` with torchrun's variables set (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) and ``TINKER_COOKBOOK_HOME`` pointing at the store the test reads.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from tinker_cookbook.engine.backend import LocalBackend
from tinker_cookbook.engine.ranks import RankedBackend, Ranks
from tinker_cookbook.engine.ranks import commands as rank_commands
from tinker_cookbook.engine.ranks.commands import RankEngine
from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore
from tinker_cookbook.tinker import errors, types

sys.path.insert(0, str(Path(__file__).parent))
from scenario_data import ADAM, DATA, GREEDY, LORA, MODEL, PROMPTS  # noqa: E402


def lead(ranks: Ranks, out: Path) -> None:
    backend = RankedBackend(ranks, CheckpointStore())
    run_id = backend.create_session(MODEL, LORA, None)
    session = backend.engine.session(run_id)
    first = backend.forward(run_id, DATA, "cross_entropy", None, True).result(timeout=120)
    grads = {k: p.grad.clone() for k, p in session.params.items() if p.grad is not None}
    step = backend.optim_step(run_id, ADAM).result(timeout=120)
    path = backend.save(run_id, "weights", "step1", None).result(timeout=120)
    try:
        bad: Any = [*DATA, "not a datum"]
        backend.forward(run_id, bad, "cross_entropy", None, True).result(timeout=120)
        refused = ""
    except errors.BadRequestError as exc:
        refused = str(exc)
    handle = backend.snapshot(run_id, None).result(timeout=120)
    futures = [backend.sample(handle, types.ModelInput.from_ints(p), 1, GREEDY, False, 0) for p in PROMPTS]
    samples = [f.result(timeout=120).sequences[0].tokens for f in futures]
    torch.save({"grads": grads, "params": {k: p.detach().clone() for k, p in session.params.items()},
                "loss": first.metrics["loss:sum"], "logprobs": [o["logprobs"].data for o in first.loss_fn_outputs],
                "grad_norm": (step.metrics or {})["grad_norm"], "path": path, "refused": refused, "samples": samples,
                "pending": session.pending_backward}, out / "rank0.pt")
    backend.close(timeout=60)


def follow(ranks: Ranks, out: Path) -> None:
    """``follow_leader``'s loop, keeping the engine to write its session's state at the end."""
    engine = RankEngine(ranks, LocalBackend(CheckpointStore(), ranks.device))
    sampled = 0
    while True:
        command = ranks.broadcast(None)
        if isinstance(command, rank_commands.Stop):
            break
        if isinstance(command, rank_commands.SampleRound):
            sampled += sum(r.rank == ranks.rank for r in command.requests)
        try:
            engine.run(command)
        except errors.TinkerError:
            pass
    (session,) = engine.local._sessions.values()
    torch.save({"params": {k: p.detach().clone() for k, p in session.params.items()}, "sampled": sampled},
               out / f"rank{ranks.rank}.pt")
    engine.local.close()


def main() -> None:
    torch.set_num_threads(1)
    ranks = Ranks.from_torchrun()
    out = Path(os.environ["RANK_SCENARIO_OUT"])
    (lead if ranks.is_leader else follow)(ranks, out)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
