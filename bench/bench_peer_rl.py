"""RL iterations: ``recipes.rl_basic`` against TRL's ``GRPOTrainer`` on the same task, model, group size and batch.

    bench/.venv-peers/bin/python bench/bench_peer_rl.py                   # 4 iterations each
    bench/.venv-peers/bin/python bench/bench_peer_rl.py --steps 12        # rl_basic's whole run (12 batches)
    bench/.venv-peers/bin/python bench/bench_peer_rl.py --model tinker-cookbook/tiny-smollm2 --steps 2   # smoke

Needs the bench-only environment (``bash bench/peers/setup.sh``). Ours is ``python -m recipes.rl_basic
max_steps=N`` (its defaults: SmolLM2-135M-Instruct, 8 problems "What is x + y?" with operands 0-9 and one solved
example, 8 samples each at temperature 1, at most 8 new tokens, reward = correct - 0.1 * (cut off before the stop
token), group-centred advantages, LoRA rank 32, AdamW at 3e-4), timed from its ``metrics.jsonl``. TRL gets the
same problems in the same order (the recipe's draws), as chat prompts whose template gives the same tokens as the
recipe's renderer, the same reward function, and the same sizes: 64 completions per step in groups of 8
(``num_generations=8``, one optimizer step per generation batch), ``max_completion_length=8``, temperature 1, no
top-k/top-p, learning rate 3e-4 constant, betas (0.9, 0.95), no KL term (``beta=0``), advantages centred and not
scaled (``scale_rewards="none"``, as the recipe's), the model in fp32, generation by transformers (no vLLM on a
CPU), otherwise its defaults (its "dapo" loss, gradient checkpointing). LoRA rank 32 on the decoder's linear layers
for TRL; ours also adapts the unembedding (TRL refuses a LoRA there), which is more work for ours.

Each side runs in its own process. Reported: seconds per iteration (every iteration, and the mean of those after
the first, which carries warm-up), the reward and correct-rate curves side by side, and the goals: ours >= 2x
TRL's iterations per second at an equal reward curve ("equal": the mean reward over the iterations is within
0.1 of TRL's or above; 64 samples per iteration make one iteration's mean noisy by about that much).
Not a test: compare within one run.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peer_common import (  # noqa: E402 - the tree's root must be on the path first
    ROOT,
    Goal,
    arithmetic_problems,
    arithmetic_reward,
    missing_peer,
    not_worse,
    peer_model,
    print_result,
    run_side,
)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROBLEMS, GROUP, MAX_TOKENS, MAX_OPERAND, LR = 8, 8, 8, 9, 3e-4
"""rl_basic's defaults (``tinker_cookbook/rl/recipe_defaults.py``)."""
EXAMPLE = [{"role": "user", "content": "What is 4 + 5?"}, {"role": "assistant", "content": "9"}]
"""rl_basic's one solved example (``arithmetic_env.FEWSHOT_PREFIX``)."""
REWARD_TOLERANCE = 0.1
GOAL = Goal("iterations/s, rl_basic / TRL GRPO", 2.0)


def run_ours(model: str, steps: int) -> dict[str, Any]:
    from bench.bench_rl import run_recipe

    with tempfile.TemporaryDirectory() as scratch:
        run = run_recipe("rl_basic", ROOT, steps, [f"model_name={model}"], Path(scratch), 0)
    return {"iteration_s": run.iteration_s,
            "reward": [run.value(row, "env/all/reward/total") for row in run.rows],
            "correct": [run.value(row, "env/all/correct") for row in run.rows]}


def run_trl(model: str, steps: int) -> dict[str, Any]:
    import peft
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tinker_cookbook.tokenizer_utils import get_tokenizer

    tokenizer = get_tokenizer(model)
    rows = [{"prompt": [*EXAMPLE, {"role": "user", "content": f"What is {x} + {y}?"}], "x": x, "y": y}
            for step in range(steps) for x, y in arithmetic_problems(step, PROBLEMS, MAX_OPERAND)]
    rewards: list[list[float]] = []
    correct: list[list[bool]] = []
    ends: list[float] = []

    def reward(completions: list[Any], completion_ids: list[list[int]], x: list[int], y: list[int],
               **_: Any) -> list[float]:
        scored = [arithmetic_reward(c[0]["content"], a, b, bool(ids) and ids[-1] == tokenizer.eos_token_id)
                  for c, ids, a, b in zip(completions, completion_ids, x, y, strict=True)]
        rewards.append([r for r, _ in scored])
        correct.append([c for _, c in scored])
        return [r for r, _ in scored]

    class StepTimes(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

    lora = peft.LoraConfig(r=32, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"])
    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir, max_steps=steps, per_device_train_batch_size=PROBLEMS * GROUP,
            gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, num_generations=GROUP,
            max_completion_length=MAX_TOKENS, temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR,
            lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8,
            weight_decay=0.0, max_grad_norm=0.0, beta=0.0, scale_rewards="none", shuffle_dataset=False,
            bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, seed=0,
        )
        trainer = GRPOTrainer(model=peer_model(model), reward_funcs=reward, args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=lora,
                              callbacks=[StepTimes()])
        trainer.train()
    return {"iteration_s": [b - a for a, b in itertools.pairwise(ends)],
            "reward": [statistics.mean(r) for r in rewards], "correct": [statistics.mean(c) for c in correct]}


def mean_after_first(times: list[float]) -> float:
    """The mean seconds per iteration without the first (its warm-up), or the only one."""
    return statistics.mean(times[1:] if len(times) > 1 else times)


def curve(values: list[float | None]) -> str:
    return ", ".join("-" if v is None else f"{v:.2f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--steps", type=int, default=4, help="iterations per side (rl_basic has 12 batches)")
    parser.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 1 <= args.steps <= 12:
        sys.exit(f"--steps {args.steps}: rl_basic's data has 12 batches; use 1 to 12")
    if args.child:
        print_result(run_ours(args.model, args.steps) if args.child == "ours" else run_trl(args.model, args.steps))
        return
    if (problem := missing_peer("trl")) is not None:
        sys.exit(problem)
    print(f"model {args.model}; rl_basic's task: {PROBLEMS} problems x {GROUP} samples, <= {MAX_TOKENS} tokens; "
          f"{args.steps} iterations per side; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
          flush=True)
    command = [sys.executable, __file__, "--model", args.model, "--steps", str(args.steps), "--child"]
    results: dict[str, dict[str, Any]] = {}
    for side, name in (("trl", "TRL GRPOTrainer"), ("ours", "rl_basic")):
        results[name] = run_side(name, [*command, side])
        print(f"  {name}: {', '.join(f'{t:.1f}' for t in results[name]['iteration_s'])} s per iteration "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print()
    for name, r in results.items():
        print(f"{name:>16}: mean {mean_after_first(r['iteration_s']):.2f} s per iteration after the first\n"
              f"{'':>18}reward  {curve(r['reward'])}\n{'':>18}correct {curve(r['correct'])}")
    ours, trl = results["rl_basic"], results["TRL GRPOTrainer"]
    print("\n" + GOAL.line(1 / mean_after_first(ours["iteration_s"]), 1 / mean_after_first(trl["iteration_s"]),
                           "iterations/s"))
    ours_reward = statistics.mean(r for r in ours["reward"] if r is not None)
    trl_reward = statistics.mean(trl["reward"])
    equal = not_worse(-ours_reward, -trl_reward, REWARD_TOLERANCE)
    print(f"mean reward over the iterations: rl_basic {ours_reward:.3f}, TRL {trl_reward:.3f} (goal: within "
          f"{REWARD_TOLERANCE} or above): {'met' if equal else 'NOT met'}")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
