"""Sampling throughput of the engine vs HF ``generate``, the sampler/learner mismatch, and batch-1 decode speed.

    python bench/bench_sampling.py                   # SmolLM2-135M-Instruct: 32 prompts x 4 samples x <= 64 tokens
    python bench/bench_sampling.py --prompts 8 --max-tokens 16 --model tinker-cookbook/tiny-smollm2

(a) An RL-shaped workload: every prompt's request (4 samples, temperature 1, a seed each) is submitted at once, the
    way an RL loop issues its groups; tokens/s counts generated tokens (up to and including EOS). The baseline is HF
    ``generate`` in fp32 on the same prompts, left-padded into one batch with ``num_return_sequences=4``. Both modes
    of the engine run (the default dtype and fp32). Mismatch: every sampled token's logprob against an fp32 HF
    forward of the same tokens: mean |dlogprob| and the kl_sample_train estimators v1 = mean(logq - logp),
    v2 = mean((logq - logp)^2 / 2), where q is the sampler and p the learner.
(b) Batch-1 decode tokens/s next to its memory-bandwidth bound: bytes of weights read per token over the measured
    copy bandwidth (bytes read + written per second of a large tensor copy).

Not a test: the machine is shared and noisy, so compare figures within one run. The malloc setting, torch threads and
the load average are printed with the results.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

from tinker_cookbook import perf_env

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTIONS = [
    "What is {a} + {b}?",
    "Name a fruit that starts with the letter {c}.",
    "Write one sentence about the number {a}.",
    "Is {a} larger than {b}? Answer briefly.",
    "Give a synonym for 'happy'.",
    "What colour is the sky at noon?",
    "Translate 'good morning' into French.",
    "List two animals that live in the sea.",
]


def make_prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """Chat-formatted questions of varied length (deterministic)."""
    prompts = []
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)].format(
            a=7 * i + 3, b=11 * i % 50, c="ABCDEFGHIJKLMNOP"[i % 16]
        )
        messages = [{"role": "user", "content": question}]
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompts.append(list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded))
    return prompts


def copy_bandwidth_gbs() -> float:
    """Bytes read plus bytes written per second by a 512 MiB tensor copy (best of 5)."""
    source = torch.ones(2**27, dtype=torch.float32)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * 4 / best / 1e9


def run_engine(weights: Any, tokenizer: Any, prompts: list[list[int]], samples: int, max_tokens: int) -> dict:
    from tinker_cookbook.engine.sampler import SamplerEngine
    from tinker_cookbook.tinker import types

    with SamplerEngine() as engine:
        warm = types.SamplingParams(max_tokens=4, seed=0)
        engine.submit(weights, tokenizer, types.ModelInput.from_ints(prompts[0]), 2, warm).result()
        start = time.perf_counter()
        futures = [
            engine.submit(
                weights,
                tokenizer,
                types.ModelInput.from_ints(p),
                samples,
                types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i),
            )
            for i, p in enumerate(prompts)
        ]
        responses = [f.result() for f in futures]
        elapsed = time.perf_counter() - start
        stats = engine.stats()
    tokens = sum(len(s.tokens) for r in responses for s in r.sequences)
    return {
        "responses": responses,
        "seconds": elapsed,
        "tokens": tokens,
        "max_batch": stats.max_batch_sequences_seen,
        "steps": stats.decode_steps,
    }


def mismatch(model: Any, prompts: list[list[int]], responses: list[Any]) -> dict[str, float]:
    """Sampler logprobs (q) vs an fp32 HF forward (p) of the same tokens."""
    deltas = []
    for prompt, response in zip(prompts, responses, strict=True):
        for sequence in response.sequences:
            with torch.inference_mode():
                logits = (
                    model(torch.tensor([prompt + sequence.tokens])).logits[0, len(prompt) - 1 : -1].float()
                )
            p = torch.log_softmax(logits, -1).gather(1, torch.tensor(sequence.tokens)[:, None])[:, 0]
            deltas.append(torch.tensor(sequence.logprobs) - p)
    d = torch.cat(deltas).double()
    return {
        "mean_abs": d.abs().mean().item(),
        "max_abs": d.abs().max().item(),
        "v1": d.mean().item(),
        "v2": (0.5 * d**2).mean().item(),
    }


def run_hf_generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], samples: int, max_tokens: int
) -> dict:
    """HF generate, fp32, one left-padded batch of all prompts with num_return_sequences=samples."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            num_return_sequences=samples,
            pad_token_id=pad,
            eos_token_id=eos,
        )
    elapsed = time.perf_counter() - start
    tokens = 0
    for row in out[:, width:].tolist():
        tokens += row.index(eos) + 1 if eos in row else len(row)
    return {"seconds": elapsed, "tokens": tokens}


def batch1_decode(weights: Any, tokenizer: Any, prompt: list[int], new_tokens: int) -> float:
    """Decode tokens/s of one sequence: (N - 1) tokens over the time beyond a 1-token request (the prefill)."""
    from tinker_cookbook.engine.sampler import SamplerEngine
    from tinker_cookbook.tinker import types

    def timed(n: int) -> tuple[float, int]:
        params = types.SamplingParams(max_tokens=n, temperature=1.0, seed=1)
        start = time.perf_counter()
        response = engine.submit(weights, None, types.ModelInput.from_ints(prompt), 1, params).result()
        return time.perf_counter() - start, len(response.sequences[0].tokens)

    with SamplerEngine() as engine:  # no tokenizer: no EOS stop, always N tokens
        timed(4)
        prefill, _ = min(timed(1) for _ in range(3))
        total, produced = timed(new_tokens)
    return (produced - 1) / (total - prefill)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch1-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--skip-hf", action="store_true", help="skip the HF generate baseline")
    args = parser.parse_args()
    perf_env.reexec_with_fast_malloc()
    if args.threads:
        torch.set_num_threads(args.threads)

    from tinker_cookbook.engine.models import load_model
    from tinker_cookbook.engine.sampler import SamplingWeights, default_sampling_dtype
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    malloc = (
        "fast glibc settings (MALLOC_MMAP/TRIM_THRESHOLD_, MALLOC_TOP_PAD_)"
        if perf_env.fast_malloc_active()
        else "glibc defaults"
    )
    print(
        f"model {args.model}; malloc: {malloc}; torch threads {torch.get_num_threads()}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    model = load_model(args.model, torch.float32)
    tokenizer = get_tokenizer(args.model)
    prompts = make_prompts(tokenizer, args.prompts)
    base_state = model.state_dict()
    default_dtype = default_sampling_dtype()
    modes = {"default": default_dtype, "fp32": torch.float32}
    mode_names = {name: str(dtype).removeprefix("torch.") for name, dtype in modes.items()}
    workload = f"{args.prompts} prompts x {args.samples} samples x <= {args.max_tokens} tokens"
    print(f"\n(a) {workload}, submitted concurrently, temperature 1", flush=True)
    results: dict[str, dict] = {}
    for name, dtype in modes.items():
        weights = SamplingWeights.build(model.config, base_state, None, None, dtype)
        run = run_engine(weights, tokenizer, prompts, args.samples, args.max_tokens)
        run["mismatch"] = mismatch(model, prompts, run["responses"])
        results[name] = run
        m = run["mismatch"]
        print(
            f"  engine {name:7s} ({mode_names[name]}): {run['tokens'] / run['seconds']:7.1f} tok/s "
            f"({run['tokens']} tokens in {run['seconds']:.1f} s, {run['steps']} decode steps, "
            f"max batch {run['max_batch']}); mismatch vs fp32 HF: mean|d| {m['mean_abs']:.5f} "
            f"max|d| {m['max_abs']:.4f} v1 {m['v1']:+.6f} v2 {m['v2']:.6f}",
            flush=True,
        )
    if not args.skip_hf:
        hf = run_hf_generate(model, tokenizer, prompts, args.samples, args.max_tokens)
        hf_rate = hf["tokens"] / hf["seconds"]
        print(
            f"  HF generate fp32 batch {args.prompts * args.samples}: {hf_rate:7.1f} tok/s "
            f"({hf['tokens']} tokens in {hf['seconds']:.1f} s)",
            flush=True,
        )
        for name in modes:
            rate = results[name]["tokens"] / results[name]["seconds"]
            print(f"  ratio engine {name} / HF: {rate / hf_rate:.2f}x")
    print(f"\n(b) batch-1 decode, {args.batch1_tokens} tokens", flush=True)
    bandwidth = copy_bandwidth_gbs()
    print(f"  measured copy bandwidth {bandwidth:.1f} GB/s (read + write)")
    for name, dtype in modes.items():
        weights = SamplingWeights.build(model.config, base_state, None, None, dtype)
        rate = batch1_decode(weights, tokenizer, prompts[0], args.batch1_tokens)
        weight_bytes = weights.decoder.num_bytes()
        bound = bandwidth * 1e9 / weight_bytes
        print(
            f"  engine {name:7s} ({mode_names[name]}): {rate:6.1f} tok/s; weights read per token "
            f"{weight_bytes / 1e6:.0f} MB -> bandwidth bound {bound:.1f} tok/s ({rate / bound:.0%} of it)"
        )
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
