"""What the peer benchmarks (``bench/bench_peer_*.py``) share: running a side in its own process, the goals and
their verdicts, and the data each pair of sides must see identically.

The peers (TRL, llama-cpp-python) live in a bench-only environment, ``bench/.venv-peers`` (made by
``bench/peers/setup.sh``); nothing here imports them, so this module also loads in the project's own venv.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / "bench" / ".venv-peers"
FAST_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
    "MALLOC_TOP_PAD_": "1073741824",
}
RESULT_PREFIX = "RESULT "


def peak_rss_gb() -> float:
    """This process's peak resident memory, GB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def missing_peer(module: str) -> str | None:
    """None when ``module`` imports here, else what to run to get it."""
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        return None
    return (f"{module} is not installed in {sys.executable}: run `bash bench/peers/setup.sh` and start this "
            f"bench with {PEERS_VENV / 'bin' / 'python'}")


def peer_model(name: str) -> Any:
    """The HF causal LM ``name`` in fp32, loaded as the engine loads it (offline: SmolLM2 from the packaged GGUF's
    converted copy, never a hub), for a peer to train the very weights the engine trains."""
    import torch

    from tinker_cookbook.engine.models import load_model

    return load_model(name, torch.float32)


def print_result(result: dict[str, Any]) -> None:
    """A child's answer to its parent: one line that ``run_side`` finds among the child's output."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The last ``RESULT {...}`` line of a child's stdout, or None."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    return json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else None


def run_side(name: str, command: Sequence[str], env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one side of a comparison in its own process (so its peak memory is its own); its RESULT."""
    env = {**os.environ, **FAST_MALLOC, "TINKER_COOKBOOK_NO_REEXEC": "1", **(env_extra or {})}
    # The script's directory (bench/) is what a child sees first on its path: put the tree's root first so that
    # this tree is the code measured.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run(list(command), env=env, capture_output=True, text=True, cwd=ROOT)
    result = parse_result(out.stdout)
    if out.returncode != 0 or result is None:
        sys.exit(f"{name} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return result


@dataclass(frozen=True)
class Goal:
    """One acceptance goal: ``ours / peer`` of a figure must be at least (or at most) ``target``."""

    what: str
    target: float
    higher_is_better: bool = True

    def met(self, ratio: float) -> bool:
        return ratio >= self.target if self.higher_is_better else ratio <= self.target

    def line(self, ours: float, peer: float, unit: str) -> str:
        """``what: ours / peer = ratio (goal >= target): met`` with the two absolute figures."""
        ratio = ours / peer
        sign = ">=" if self.higher_is_better else "<="
        verdict = "met" if self.met(ratio) else "NOT met"
        return (f"{self.what}: {ours:.4g} / {peer:.4g} {unit} = {ratio:.2f}x (goal {sign} {self.target:g}x): "
                f"{verdict}")


def not_worse(ours: float, peer: float, tolerance: float) -> bool:
    """``ours <= peer + tolerance``: for a loss, "equal or better" within the run-to-run noise ``tolerance``."""
    return ours <= peer + tolerance


# ----------------------------------------------------------------------------------------------------------------
# Supervised: the same token rows for the engine's Datums and TRL's pre-tokenized dataset
# ----------------------------------------------------------------------------------------------------------------


def datum_to_row(input_tokens: Sequence[int], target_tokens: Sequence[int],
                 weights: Sequence[float]) -> dict[str, list[int]]:
    """A Datum (inputs, next-token targets, weights) as a pre-tokenized causal-LM row: ``input_ids`` is the whole
    sequence and ``labels`` holds a token where it is a weighted target, -100 elsewhere. Transformers shifts labels
    by one inside the loss, so the row trains exactly the Datum's weighted targets."""
    if not len(input_tokens) == len(target_tokens) == len(weights):
        raise ValueError(f"a Datum's lengths differ: {len(input_tokens)} inputs, {len(target_tokens)} targets, "
                         f"{len(weights)} weights; they must be equal")
    if list(input_tokens[1:]) != list(target_tokens[:-1]):
        raise ValueError("target_tokens is not input tokens shifted by one: a row cannot express this Datum")
    input_ids = [*input_tokens, target_tokens[-1]]
    labels = [-100] + [t if w > 0 else -100 for t, w in zip(target_tokens, weights, strict=True)]
    return {"input_ids": list(input_ids), "labels": labels}


def token_mean_nll(logprobs: Sequence[float], weights: Sequence[float]) -> tuple[float, int]:
    """(sum of -logprob over the targets with a positive weight, how many): summed over sequences, their ratio is
    the held-out NLL per target token that both sides report."""
    picked = [-lp for lp, w in zip(logprobs, weights, strict=True) if w > 0]
    return float(sum(picked)), len(picked)


# ----------------------------------------------------------------------------------------------------------------
# RL: the problems of rl_basic's arithmetic environment
# ----------------------------------------------------------------------------------------------------------------


def arithmetic_problems(batch_index: int, batch_size: int, max_operand: int, seed: int = 0) -> list[tuple[int, int]]:
    """The (x, y) of batch ``batch_index`` of ``rl_basic``'s environment: the same draws as
    ``tinker_cookbook.rl.arithmetic_env.ArithmeticDataset.get_batch`` (tests check that they agree)."""
    rng = random.Random(f"{seed}-{batch_index}")
    problems = []
    for _ in range(batch_size):
        x = rng.randint(0, max_operand)
        y = rng.randint(0, max_operand)
        problems.append((x, y))
    return problems


def arithmetic_reward(text: str, x: int, y: int, stopped: bool, format_coef: float = 0.1) -> tuple[float, bool]:
    """(reward, correct) as ``rl_basic`` scores a reply: correct − ``format_coef`` · (cut off before its stop
    token); the answer is the last integer written (commas ignored)."""
    from tinker_cookbook.rl.arithmetic_env import last_integer

    correct = last_integer(text) == x + y
    return float(correct) - format_coef * (not stopped), correct
