"""RL iteration time of ``recipes.rl_basic`` for this tree against a baseline git ref, in one run.

    python bench/bench_rl.py                           # 3 iterations, this tree vs b287c30, 2 alternating rounds
    python bench/bench_rl.py --baseline main --steps 4 --reps 1
    python bench/bench_rl.py --baseline "" -- model_name=tinker-cookbook/tiny-smollm2   # this tree only, tiny model

Each run is ``python -m recipes.rl_basic max_steps=N log_path=<fresh dir> behavior_if_log_dir_exists=delete`` (plus
the keys after ``--``) in its own process, with the tree's root as cwd: the baseline is ``git archive REF`` in a
temporary directory, run with the same interpreter. Runs of the two trees alternate (``--reps`` rounds). Each
run's ``metrics.jsonl`` gives per iteration ``time/total``, ``time/rollout``, ``time/train``, ``time/other`` (the
rest of ``time/total``; derived for trees that do not log it) and ``env/all/correct``. Printed: every iteration,
the ratio of mean iteration times (baseline / this tree, per round and over all rounds) and the correct-rate
curves side by side, with the load average before and after each run.

Not a test: the machine may be shared; compare figures within one run. Recipes restart themselves once with the
fast-malloc environment (``tinker_cookbook/perf_env.py``); the benchmark sets it up front so there is one process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FAST_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
    "MALLOC_TOP_PAD_": "1073741824",
}
KEYS = ("time/total", "time/rollout", "time/train", "time/other", "time/save")


@dataclass
class Run:
    """One recipe run of one tree: its rows of metrics.jsonl and the load around it."""

    tree: str
    rows: list[dict[str, Any]]
    wall_s: float
    load_before: float
    load_after: float
    iteration_s: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.iteration_s = [float(r["time/total"]) for r in self.rows]

    def value(self, row: dict[str, Any], key: str) -> float | None:
        if key in row:
            return float(row[key])
        if key == "time/other" and "time/total" in row and "time/rollout_and_train" in row:
            return float(row["time/total"]) - float(row["time/rollout_and_train"])
        return None


def export_tree(ref: str, into: Path) -> Path:
    """``git archive ref`` of this repository, extracted into ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_recipe(name: str, tree: Path, steps: int, extra: list[str], scratch: Path, index: int) -> Run:
    """``python -m recipes.rl_basic`` of ``tree`` in a subprocess; its metrics rows."""
    log_path = scratch / f"run{index}"
    env = {**os.environ, **FAST_MALLOC, "TINKER_COOKBOOK_HOME": str(scratch / f"home{index}")}
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "recipes.rl_basic", f"max_steps={steps}", f"log_path={log_path}",
               "behavior_if_log_dir_exists=delete", *extra]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    out = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{name}: rl_basic failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "time/total" in r]
    return Run(name, rows, wall, load_before, os.getloadavg()[0])


def fmt(value: float | None, width: int = 6, digits: int = 2) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else " " * (width - 1) + "-"


def report(runs: list[Run], names: list[str]) -> None:
    print("\nper iteration (seconds): total = rollout + train + other")
    for run in runs:
        print(f"  {run.tree} (load {run.load_before:.1f} -> {run.load_after:.1f}, process {run.wall_s:.0f} s)")
        for i, row in enumerate(run.rows):
            parts = "  ".join(f"{k.removeprefix('time/')} {fmt(run.value(row, k))}" for k in KEYS)
            print(f"    iteration {i}: {parts}  correct {fmt(run.value(row, 'env/all/correct'), 5)}")
    means = {n: [statistics.mean(r.iteration_s) for r in runs if r.tree == n] for n in names}
    print("\nmean iteration time per run (s): " + "; ".join(
        f"{n}: " + ", ".join(f"{m:.2f}" for m in ms) for n, ms in means.items()))
    if len(names) == 2:
        new, old = names
        pooled = {n: statistics.mean(t for r in runs if r.tree == n for t in r.iteration_s) for n in names}
        rounds = [o / n for n, o in zip(means[new], means[old], strict=False)]
        print(f"speed-up {old} / {new} (mean iteration time): {pooled[old] / pooled[new]:.2f}x over all rounds; "
              f"per round " + ", ".join(f"{r:.2f}x" for r in rounds))
    print("\nenv/all/correct per iteration")
    for n in names:
        for run in (r for r in runs if r.tree == n):
            curve = ", ".join(fmt(run.value(row, "env/all/correct"), 4) for row in run.rows)
            print(f"  {n:>22}: {curve}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="b287c30", help="git ref to compare with ('' for this tree only)")
    parser.add_argument("--steps", type=int, default=3, help="rl_basic iterations per run (max_steps)")
    parser.add_argument("--reps", type=int, default=2, help="alternating rounds (baseline first in each)")
    parser.add_argument("extra", nargs="*", help="more key=value settings for rl_basic (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        trees = {"this tree": ROOT}
        if args.baseline:
            (scratch / "baseline").mkdir()
            trees = {f"baseline {args.baseline}": export_tree(args.baseline, scratch / "baseline"), **trees}
        print(f"rl_basic max_steps={args.steps} {' '.join(args.extra)}; {args.reps} alternating rounds; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
        runs: list[Run] = []
        for _ in range(args.reps):
            for name, tree in trees.items():
                run = run_recipe(name, tree, args.steps, args.extra, scratch, len(runs))
                print(f"  {name}: {', '.join(f'{t:.1f}' for t in run.iteration_s)} s per iteration "
                      f"(load {run.load_before:.1f} -> {run.load_after:.1f})", flush=True)
                runs.append(run)
        report(runs, list(reversed(trees)) if args.baseline else list(trees))
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
