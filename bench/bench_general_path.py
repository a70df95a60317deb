"""The engine's general transformers path against its fast path on one dense model, in one run.

    python bench/bench_general_path.py                   # SmolLM2-135M-Instruct, 2 rounds, one torch thread
    python bench/bench_general_path.py --model tinker-cookbook/tiny-qwen3 --rounds 1

Each side runs in its own subprocess: ``TINKER_COOKBOOK_MODEL_PATH=auto`` (the fast fused paths) or ``general``
(the transformers model's own modules with peft LoRA, and a KV-cached forward of it for sampling). Training: LoRA
rank 32 on every linear layer and the unembedding, a batch of 8 sequences of 64-256 tokens, forward_backward +
optim_step. Sampling: 8 samples of 64 tokens from one 64-token prompt, seeded; and RL's shape, 8 different
64-token prompts x 4 samples submitted at once (``rl_sample``). Sides alternate every round and
each keeps its best round. Reported: tokens per CPU-second of the timed work (``time.process_time``, which follows
the work done on a shared machine) and per wall-second, and the ratios general / fast (above 1: the general path
is faster). Not a test: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAST_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "68719476736",
               "MALLOC_TOP_PAD_": "1073741824"}


def _timed(fn: object) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()  # type: ignore[operator]
    return time.process_time() - cpu, time.perf_counter() - wall


def run_side(model: str, steps: int) -> dict[str, float]:
    """One side's figures (the path comes from the environment)."""
    import numpy as np

    from tinker_cookbook import tinker
    from tinker_cookbook.tinker import types

    rng = np.random.default_rng(0)
    batch = [rng.integers(10, 2000, size=int(rng.integers(64, 257))).tolist() for _ in range(8)]
    data = [types.Datum(model_input=types.ModelInput.from_ints(t[:-1]),
                        loss_fn_inputs={"target_tokens": t[1:], "weights": [1.0] * (len(t) - 1)}) for t in batch]
    service = tinker.ServiceClient()
    client = service.create_lora_training_client(base_model=model, rank=32, seed=0)

    def train() -> None:
        for _ in range(steps):
            client.forward_backward(data, "cross_entropy").result()
            client.optim_step(types.AdamParams(learning_rate=1e-4)).result()

    train()  # warm-up: allocations, kernels, the first optimizer state
    train_cpu, train_wall = _timed(train)
    train_tokens = steps * sum(len(t) - 1 for t in batch)
    sampler = client.save_weights_and_get_sampling_client("bench")
    prompt = types.ModelInput.from_ints(batch[0][:64])
    params = types.SamplingParams(max_tokens=64, seed=1, stop=[])

    def sample() -> None:
        sampler.sample(prompt, 8, params).result()

    prompts = [types.ModelInput.from_ints(t[:64]) for t in batch]

    def sample_rl() -> None:  # RL's shape: every prompt's samples submitted at once
        futures = [sampler.sample(p, 4, params) for p in prompts]
        for future in futures:
            future.result()

    sample()
    sample_cpu, sample_wall = _timed(sample)
    sample_rl()
    rl_cpu, rl_wall = _timed(sample_rl)
    return {"train_tok_per_cpu_s": train_tokens / train_cpu, "train_tok_per_s": train_tokens / train_wall,
            "sample_tok_per_cpu_s": 8 * 64 / sample_cpu, "sample_tok_per_s": 8 * 64 / sample_wall,
            "rl_sample_tok_per_cpu_s": 8 * 4 * 64 / rl_cpu, "rl_sample_tok_per_s": 8 * 4 * 64 / rl_wall}


def _spawn(path: str, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, **FAST_MALLOC, "TINKER_COOKBOOK_MODEL_PATH": path, "OMP_NUM_THREADS": str(args.threads),
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "--side", "--model", args.model, "--steps", str(args.steps)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(run_side(args.model, args.steps)))
        return
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for path in ("auto", "general"):
            figures = _spawn(path, args)
            best[path] = {k: max(v, best.get(path, {}).get(k, 0.0)) for k, v in figures.items()}
    print(f"{args.model}, {args.threads} torch thread(s), best of {args.rounds} round(s)")
    print(f"{'':24}{'fast':>12}{'general':>12}{'general/fast':>14}")
    for key in best["auto"]:
        fast, general = best["auto"][key], best["general"][key]
        print(f"{key:24}{fast:12.1f}{general:12.1f}{general / fast:14.2f}")


if __name__ == "__main__":
    main()
