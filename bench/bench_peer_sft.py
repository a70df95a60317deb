"""Supervised LoRA training: the engine against TRL's ``SFTTrainer`` with a PEFT LoRA, same data, same settings.

    bench/.venv-peers/bin/python bench/bench_peer_sft.py            # 3 steps of sl_basic's data, TRL padded
    bench/.venv-peers/bin/python bench/bench_peer_sft.py --steps 17 --trl-modes padding,padding_free   # an epoch
    bench/.venv-peers/bin/python bench/bench_peer_sft.py --model tinker-cookbook/tiny-smollm2 --steps 3   # smoke

Needs the bench-only environment (``bash bench/peers/setup.sh``). The data is ``recipes.sl_basic``'s: its example
conversations rendered by the project's renderer into token rows with the assistant's tokens as targets, batches
of 16 in the recipe's order, and its 48 held-out conversations. Both sides train the same ``--steps`` batches
in the same order on SmolLM2-135M-Instruct (the project's offline copy, fp32): LoRA rank 32, alpha 32, on every
linear layer of the decoder (not the unembedding: TRL refuses a LoRA there, since it computes log-probabilities from
``lm_head.weight`` directly; the engine's ``train_unembed=False``); AdamW at the recipe's learning rate held constant, betas (0.9, 0.95),
eps 1e-12, no weight decay, no gradient clipping. The engine gets ``forward_backward`` (cross_entropy with the
recipe's weights) + ``optim_step`` per batch through the public API; TRL gets the same rows pre-tokenized
(``input_ids``, and ``labels`` = the weighted targets), read in order, otherwise its defaults (gradient
checkpointing on, its per-step token metrics). TRL runs in each of ``--trl-modes``: ``padding`` (its default
collator; the default here) and ``padding_free`` (a batch's rows concatenated into one sequence without padding). TRL supports
padding-free only with FlashAttention: with a CPU's attention (sdpa, eager) the concatenated rows attend to the rows
before them (``tests/bench/test_peer_common.py`` shows it), so that mode's speed is of inexact training here. Its
packing mode is the same mechanism (best-fit blocks, padding-free) and also regroups rows, so the two sides would
no longer see the same batches; it is left out. The goals are checked against each TRL mode measured.

Each side runs in its own process, so its peak RSS is its own. Reported: tokens/s (input tokens of the steps after
the first, which is a warm-up; and per CPU-second), peak RSS, and the held-out NLL per target token after the
same tokens, with the ratios engine / TRL and the goals: >= 1.5x TRL's tokens/s at <= 0.6x its memory with equal
or better held-out NLL ("equal": within 0.01 nats per token). Not a test: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peer_common import (  # noqa: E402 - the tree's root must be on the path first
    Goal,
    datum_to_row,
    missing_peer,
    not_worse,
    peak_rss_gb,
    peer_model,
    print_result,
    run_side,
    token_mean_nll,
)

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
RANK = 32
NLL_TOLERANCE = 0.01
"""Nats per token within which two held-out NLLs count as equal (two LoRA inits differ by about this)."""
GOALS = {"throughput": Goal("tokens/s, engine / TRL", 1.5),
         "memory": Goal("peak RSS, engine / TRL", 0.6, higher_is_better=False)}


def sl_basic_data(model: str, steps: int) -> tuple[list[list[Any]], list[Any], float]:
    """(the first ``steps`` training batches of Datums, the held-out Datums, the recipe's learning rate)."""
    from recipes import sl_basic

    config = sl_basic.blueprint({"model_name": model}).apply({"log_path": "/tmp/unused"}).make()
    train, test = config.dataset_builder()
    if steps > len(train):
        sys.exit(f"--steps {steps} is more than the {len(train)} batches of sl_basic's data; use at most that")
    held_out = [d for i in range(len(test)) for d in test.get_batch(i)] if test is not None else []
    return [list(train.get_batch(i)) for i in range(steps)], held_out, config.learning_rate


def as_lists(datum: Any) -> tuple[list[int], list[int], list[float]]:
    inputs = datum.loss_fn_inputs
    return datum.model_input.to_ints(), inputs["target_tokens"].tolist(), inputs["weights"].tolist()


def run_engine(model: str, steps: int) -> dict[str, Any]:
    from tinker_cookbook import tinker
    from tinker_cookbook.tinker import types

    batches, held_out, lr = sl_basic_data(model, steps)
    client = tinker.ServiceClient().create_lora_training_client(base_model=model, rank=RANK, seed=0,
                                                                train_unembed=False)

    def held_out_nll() -> float:
        out = client.forward(held_out, "cross_entropy").result()
        sums = [token_mean_nll(o["logprobs"].tolist(), as_lists(d)[2]) for o, d in zip(out.loss_fn_outputs, held_out,
                                                                                       strict=True)]
        return sum(s for s, _ in sums) / sum(n for _, n in sums)

    before = held_out_nll()
    times: list[tuple[float, float]] = []
    for batch in batches:
        fb = client.forward_backward(batch, "cross_entropy")
        opt = client.optim_step(types.AdamParams(learning_rate=lr, beta1=0.9, beta2=0.95, eps=1e-12))
        fb.result(), opt.result()
        times.append((time.perf_counter(), time.process_time()))
    return {**throughput(batches, times), "peak_rss_gb": peak_rss_gb(), "nll_before": before,
            "nll_after": held_out_nll()}


def throughput(batches: list[list[Any]], ends: list[tuple[float, float]]) -> dict[str, float]:
    """Tokens/s (wall and CPU) of the steps after the first: ``ends[i]`` is when step i had finished."""
    tokens = sum(d.model_input.length for batch in batches[1:] for d in batch)
    wall, cpu = ends[-1][0] - ends[0][0], ends[-1][1] - ends[0][1]
    return {"tokens": tokens, "tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu}


def run_trl(model: str, steps: int, mode: str) -> dict[str, Any]:
    import tempfile

    import peft
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from tinker_cookbook.tokenizer_utils import get_tokenizer

    batches, held_out, lr = sl_basic_data(model, steps)
    rows = [datum_to_row(*as_lists(d)) for batch in batches for d in batch]
    if any(all(label == -100 for label in row["labels"]) for row in rows):
        sys.exit("a training row has no target: TRL would drop it and its batches would no longer be the engine's")
    times: list[tuple[float, float]] = []

    class StepTimes(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            times.append((time.perf_counter(), time.process_time()))

    lora = peft.LoraConfig(r=RANK, lora_alpha=32, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"])
    with tempfile.TemporaryDirectory() as out_dir:
        args = SFTConfig(
            output_dir=out_dir, max_steps=steps, per_device_train_batch_size=len(batches[0]),
            gradient_accumulation_steps=1, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
            adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-12, weight_decay=0.0, max_grad_norm=0.0,
            bf16=False, use_cpu=True, train_sampling_strategy="sequential", padding_free=mode == "padding_free",
            max_length=None, report_to="none", save_strategy="no", logging_steps=1, seed=0,
            dataloader_num_workers=0,
        )
        trainer = SFTTrainer(model=peer_model(model), args=args, peft_config=lora,
                             train_dataset=Dataset.from_list(rows), processing_class=get_tokenizer(model),
                             callbacks=[StepTimes()])
        if len(trainer.get_train_dataloader()) < steps:
            sys.exit("TRL's dataloader has fewer batches than --steps: rows were dropped")
        trainer.train()
    trained = trainer.model
    trained.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for datum in held_out:
            row = datum_to_row(*as_lists(datum))
            weights = as_lists(datum)[2]
            logits = trained(input_ids=torch.tensor([row["input_ids"]])).logits[0, :-1].float()
            logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(row["input_ids"][1:])[:, None])
            s, n = token_mean_nll(logprobs[:, 0].tolist(), weights)
            total, count = total + s, count + n
    # The batches' (non-pad) input tokens, as the engine counts them.
    return {**throughput(batches, times), "peak_rss_gb": peak_rss_gb(), "nll_after": total / count, "mode": mode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--steps", type=int, default=3, help="training batches of 16 (sl_basic's epoch is 17)")
    parser.add_argument("--trl-modes", default="padding",
                        help="comma-separated: padding, padding_free (inexact on a CPU, see above)")
    parser.add_argument("--threads", type=int, default=0, help="OMP/torch threads per side (0: torch's default)")
    parser.add_argument("--child", choices=["engine", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="padding", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 2:
        sys.exit(f"--steps {args.steps}: at least 2 (the first step is a warm-up, not timed)")
    if args.child == "engine":
        print_result(run_engine(args.model, args.steps))
        return
    if args.child == "trl":
        print_result(run_trl(args.model, args.steps, args.mode))
        return
    if (problem := missing_peer("trl")) is not None:
        sys.exit(problem)
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}
    modes = [m.strip() for m in args.trl_modes.split(",") if m.strip()]
    print(f"model {args.model}; sl_basic data, {args.steps} steps of 16 conversations; LoRA r{RANK} on every "
          f"decoder linear layer; fp32; threads {args.threads or 'default'}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    command = [sys.executable, __file__, "--model", args.model, "--steps", str(args.steps)]
    trl: dict[str, dict[str, Any]] = {}
    for mode in modes:
        trl[mode] = run_side(f"TRL {mode}", [*command, "--child", "trl", "--mode", mode], env)
        print(f"  TRL SFTTrainer, {mode}: {trl[mode]['tokens_per_s']:.1f} tok/s", flush=True)
    engine = run_side("engine", [*command, "--child", "engine"], env)
    print(f"  engine: {engine['tokens_per_s']:.1f} tok/s", flush=True)
    print(f"\nheld-out NLL per target token before training: {engine['nll_before']:.4f}")
    for name, r in [*((f"TRL {m}", r) for m, r in trl.items()), ("engine", engine)]:
        print(f"  {name:>16}: {r['tokens_per_s']:7.1f} tok/s ({r['tokens_per_cpu_s']:.1f} per CPU-second) over "
              f"{r['tokens']} tokens; peak RSS {r['peak_rss_gb']:.2f} GB; held-out NLL {r['nll_after']:.4f}")
    for mode, peer in trl.items():
        caveat = " (inexact here: rows attend across row boundaries)" if mode == "padding_free" else ""
        print(f"\nagainst TRL {mode}{caveat}:")
        print("  " + GOALS["throughput"].line(engine["tokens_per_s"], peer["tokens_per_s"], "tok/s"))
        print(f"  (per CPU-second: {engine['tokens_per_cpu_s'] / peer['tokens_per_cpu_s']:.2f}x)")
        print("  " + GOALS["memory"].line(engine["peak_rss_gb"], peer["peak_rss_gb"], "GB"))
        equal = not_worse(engine["nll_after"], peer["nll_after"], NLL_TOLERANCE)
        print(f"  held-out NLL: engine {engine['nll_after']:.4f}, TRL {peer['nll_after']:.4f} (difference "
              f"{engine['nll_after'] - peer['nll_after']:+.4f}; goal: equal within {NLL_TOLERANCE} or better): "
              f"{'met' if equal else 'NOT met'}")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
