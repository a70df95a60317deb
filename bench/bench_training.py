"""Training throughput and peak memory: the engine (fp32 and bf16 base) vs a plain transformers+peft loop, in one run.

    python bench/bench_training.py                      # SmolLM2-135M-Instruct, LoRA r32, 8 seqs of 64-512 tokens
    python bench/bench_training.py --steps 5 --model tinker-cookbook/tiny-smollm2
    python bench/bench_training.py --reps 2             # alternate the three sides twice, keep each one's best
    python bench/bench_training.py --threads 1          # one torch thread per side (steadier on a loaded machine)
    python bench/bench_training.py --no-baseline        # only the engine's fp32 and bf16 sides (and the peaks)
    python bench/bench_training.py --no-baseline --no-bf16 --engine-ref main   # fp32: this tree vs git ref main

Each side runs in its own subprocess (so peak RSS is its own) on the same data: a batch of 8 sequences with
lengths drawn uniformly from 64-512, LoRA rank 32 on all linear layers incl. the unembedding, AdamW. The baseline
is what a user would write by hand: pad the batch, ``model(input_ids, attention_mask, labels=...)``, backward,
``torch.optim.AdamW``. Reported: tokens/s over real (non-pad) tokens, peak RSS, the ratios engine/baseline, achieved
GFLOP/s at 4·N FLOPs per token (forward 2N + backward through activations 2N; LoRA skips base weight gradients)
next to this machine's measured matmul peaks (fp32 through torch.mm, i.e. the BLAS, and through oneDNN's packed
kernels; bf16 through oneDNN). The engine runs twice: fp32 (the default) and with the frozen base in bf16
(``TINKER_COOKBOOK_TRAIN_DTYPE=bf16``: the base's Linear matmuls in bf16 on weights packed once, everything else
fp32); reported: fp32 GFLOP/s as a share of the oneDNN fp32 peak, the bf16/fp32 speed ratio, and the bf16 side's
mismatch, the mean/max |d| of its forward logprobs against the fp32 side's on a held-out batch (before any training
step), which is the sampler/learner mismatch it adds (the default fp32 sampler agrees with the fp32 learner to ~1e-5).
Not a test: machines are noisy, so compare within one run. On a shared machine wall-clock speed follows the load;
tokens per CPU-second of the timed steps (``time.process_time``) follow the work done, and with ``--threads 1``
they compare with the single-thread peaks measured alongside. ``--engine-ref REF`` adds a side that runs the fp32
engine of ``git archive REF`` (same bench code, same batches), alternating with this tree's in every round: the A/B
of an engine change within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
FAST_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "68719476736",
               "MALLOC_TOP_PAD_": "1073741824"}


def make_batch(seed: int, n: int = 8, lo: int = 64, hi: int = 512, vocab: int = 49152) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(10, vocab, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux reports KiB


def run_engine(model: str, steps: int) -> dict[str, float]:
    from tinker_cookbook import tinker
    from tinker_cookbook.tinker import types

    tc = tinker.ServiceClient().create_lora_training_client(base_model=model, rank=32, seed=0)
    loaded_rss = peak_rss_gb()

    def data_for(seqs: list[list[int]]) -> list[types.Datum]:
        return [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                            loss_fn_inputs=dict(target_tokens=s[1:], weights=[1.0 / (len(s) - 1)] * (len(s) - 1)))
                for s in seqs]

    def step(seed: int) -> int:
        seqs = make_batch(seed)
        fb = tc.forward_backward(data_for(seqs), "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=1e-4))
        fb.result(), opt.result()
        return sum(len(s) - 1 for s in seqs)

    held_out = make_batch(999, n=4)
    forward = tc.forward(data_for(held_out), "cross_entropy").result()
    eval_logprobs = [x for out in forward.loss_fn_outputs for x in out["logprobs"].tolist()]
    step(0)  # warm-up
    start, cpu_start, tokens = time.perf_counter(), time.process_time(), 0
    for i in range(steps):
        tokens += step(i + 1)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"tokens_per_s": tokens / elapsed, "tokens_per_cpu_s": tokens / cpu, "peak_rss_gb": peak_rss_gb(),
            "loaded_rss_gb": loaded_rss, "eval_logprobs": eval_logprobs}


def run_baseline(model_name: str, steps: int) -> dict[str, float]:
    import peft
    import torch

    from tinker_cookbook.engine.models import load_model

    model = load_model(model_name, torch.float32)
    model.train()
    config = peft.LoraConfig(r=32, lora_alpha=32, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"])
    model = peft.get_peft_model(model, config)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95))
    loaded_rss = peak_rss_gb()

    def step(seed: int) -> int:
        seqs = make_batch(seed)
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for row, s in enumerate(seqs):
            ids[row, : len(s)] = torch.tensor(s)
            mask[row, : len(s)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return sum(len(s) - 1 for s in seqs)

    step(0)
    start, cpu_start, tokens = time.perf_counter(), time.process_time(), 0
    for i in range(steps):
        tokens += step(i + 1)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"tokens_per_s": tokens / elapsed, "tokens_per_cpu_s": tokens / cpu, "peak_rss_gb": peak_rss_gb(),
            "loaded_rss_gb": loaded_rss}


def matmul_peaks_gflops() -> dict[str, float]:
    """Best-of-10 GFLOP/s of a 2048^3 matmul: fp32 via torch.mm (the BLAS), fp32 and bf16 via oneDNN packed."""
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)

    def best(fn: object, *args: object) -> float:
        for _ in range(3):
            fn(*args)  # type: ignore[operator]
        times = []
        for _ in range(10):
            start = time.perf_counter()
            fn(*args)  # type: ignore[operator]
            times.append(time.perf_counter() - start)
        return 2 * 2048**3 / min(times) / 1e9

    peaks = {"fp32 torch.mm": best(torch.mm, a, b)}
    for name, dtype in (("fp32 oneDNN", torch.float32), ("bf16 oneDNN", torch.bfloat16)):
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(b.T.contiguous().to(dtype), 2048)
            x = a.to(dtype)
            peaks[name] = best(torch.ops.mkldnn._linear_pointwise, x, packed, None, "none", [None], "")
        except Exception:  # noqa: BLE001 - no oneDNN here: report what there is
            pass
    return peaks


def _meta_model(model: str) -> tuple[object, object]:
    import torch
    from transformers import AutoModelForCausalLM

    from tinker_cookbook.engine.models import load_model_config

    config = load_model_config(model)
    with torch.device("meta"):
        return config, AutoModelForCausalLM.from_config(config)


def param_count(model: str) -> int:
    _, m = _meta_model(model)
    return sum(p.numel() for p in m.parameters())  # type: ignore[attr-defined]


def extra_flops_per_token(model: str, steps: int, rank: int = 32) -> tuple[float, float]:
    """The matmul FLOPs per token of the timed steps that 4·N leaves out: (LoRA, attention), forward + backward.

    LoRA: every adapted Linear (all of them, the unembedding included) does ``2·r·(in + out)`` in the forward and
    twice that in the backward (input gradient and the A/B weight gradients). Attention: per layer, ``q·kᵀ`` and
    ``p·v`` cost ``4·d_attn`` per (query, visible key) pair in the forward and twice that in the backward; a causal
    sequence of L tokens has L(L+1)/2 pairs. Recomputation inside a backward is not counted (it is not the model's
    work), so these are the FLOPs any implementation must do."""
    import torch

    config, m = _meta_model(model)
    lora = 3 * 2 * rank * sum(mod.in_features + mod.out_features for mod in m.modules()  # type: ignore[attr-defined]
                              if isinstance(mod, torch.nn.Linear))
    lengths = [len(s) - 1 for i in range(steps) for s in make_batch(i + 1)]  # the timed steps' batches
    heads = config.num_attention_heads  # type: ignore[attr-defined]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads  # type: ignore[attr-defined]
    pairs = sum(n * (n + 1) / 2 for n in lengths)
    attention = 3 * 4 * heads * head_dim * config.num_hidden_layers * pairs / sum(lengths)  # type: ignore[attr-defined]
    return float(lora), attention


def export_tree(ref: str, into: Path) -> Path:
    """``git archive ref`` of this repository, extracted into ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def child(side: str, model: str, steps: int) -> None:
    if side == "engine-unpacked":
        from tinker_cookbook.engine import settings

        settings.PACK_FP32_BASE = False  # the fp32 base through F.linear (packed by default: see its docstring)
    result = run_engine(model, steps) if side.startswith("engine") else run_baseline(model, steps)
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", choices=["engine", "engine-bf16", "engine-unpacked", "engine-ref", "baseline"])
    parser.add_argument("--reps", type=int, default=1, help="alternating rounds of the sides (best kept)")
    parser.add_argument("--no-fast-malloc", action="store_true", help="run both sides with glibc's default malloc")
    parser.add_argument("--unpacked-fp32", action="store_true",
                        help="add a side with the fp32 base through F.linear, not packed weights (engine-unpacked)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per side and for the peaks (0: torch's)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the transformers+peft side (the slowest): engine fp32 vs bf16 and the peaks only")
    parser.add_argument("--no-bf16", action="store_true", help="skip the engine's bf16-base side")
    parser.add_argument("--engine-ref", default="", help="add a side: the fp32 engine of this git ref (an A/B)")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model, args.steps)
        return
    env = {**os.environ, "TINKER_COOKBOOK_NO_REEXEC": "1"}
    env.update({} if args.no_fast_malloc else FAST_MALLOC)
    env.pop("TINKER_COOKBOOK_TRAIN_DTYPE", None)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    # The script's own directory is bench/: put this tree's root first so that it is the code measured.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    scratch = tempfile.TemporaryDirectory()
    ref_env = dict(env)
    if args.engine_ref:
        ref_env["PYTHONPATH"] = os.pathsep.join([str(export_tree(args.engine_ref, Path(scratch.name))),
                                                 env.get("PYTHONPATH", "")])
    malloc = "glibc defaults" if args.no_fast_malloc else "fast malloc env (" + ", ".join(f"{k}={v}" for k, v in FAST_MALLOC.items()) + ")"
    print(f"model {args.model}, LoRA r32 all linear + unembed, 8 seqs x 64-512 tokens, {args.steps} timed steps")
    threads = args.threads or "torch's default"
    print(f"malloc: {malloc}; {os.cpu_count()} cores, threads {threads}; load average {os.getloadavg()[0]:.1f}; "
          f"{args.reps} round(s)")
    results: dict[str, dict] = {}
    sides = (*(() if args.no_baseline else ("baseline",)), *(("engine-ref",) if args.engine_ref else ()), "engine",
             *(() if args.no_bf16 else ("engine-bf16",)), *(("engine-unpacked",) if args.unpacked_fp32 else ()))
    for _ in range(args.reps):
        for side in sides:
            side_env = {**env, "TINKER_COOKBOOK_TRAIN_DTYPE": "bf16"} if side == "engine-bf16" else env
            side_env = ref_env if side == "engine-ref" else side_env
            out = subprocess.run([sys.executable, __file__, "--child", "engine" if side == "engine-ref" else side, "--model", args.model, "--steps",
                                  str(args.steps)], env=side_env, capture_output=True, text=True)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode != 0 or not line:
                sys.exit(f"{side} failed:\n{out.stderr[-3000:]}")
            result = json.loads(line[0][len("RESULT "):])
            print(f"  {side}: {result['tokens_per_cpu_s']:.1f} tok per CPU-second, load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
            # Best of the rounds: per CPU-second with one thread (that follows the work done), else wall-clock.
            key = "tokens_per_cpu_s" if args.threads == 1 else "tokens_per_s"
            if side not in results or result[key] > results[side][key]:
                results[side] = result
    n = param_count(args.model)
    for side in sides:
        r = results[side]
        print(f"{side:>11}: {r['tokens_per_s']:8.1f} tok/s   peak RSS {r['peak_rss_gb']:.2f} GB "
              f"(after load {r['loaded_rss_gb']:.2f} GB)   {4 * n * r['tokens_per_s'] / 1e9:.1f} GFLOP/s   "
              f"{r['tokens_per_cpu_s']:.1f} tok per CPU-second")
    scratch.cleanup()
    e, h = results["engine"], results.get("engine-bf16")
    if "baseline" in results:
        b = results["baseline"]
        print(f"ratio engine/baseline: throughput {e['tokens_per_s'] / b['tokens_per_s']:.2f}x (target >= 1.0), "
              f"peak memory {e['peak_rss_gb'] / b['peak_rss_gb']:.2f}x (target <= 0.6)")
    import torch

    if h is not None:
        d = torch.tensor(h["eval_logprobs"], dtype=torch.float64) - torch.tensor(e["eval_logprobs"], dtype=torch.float64)
        print(f"bf16 base / fp32: throughput {h['tokens_per_s'] / e['tokens_per_s']:.2f}x (target >= 1.6), per "
              f"CPU-second {h['tokens_per_cpu_s'] / e['tokens_per_cpu_s']:.2f}x; logprobs vs fp32 learner: mean|d| "
              f"{d.abs().mean():.4f} max {d.abs().max():.3f} over {d.numel()} held-out tokens")
    if "engine-ref" in results:
        r = results["engine-ref"]
        d = torch.tensor(r["eval_logprobs"], dtype=torch.float64) - torch.tensor(e["eval_logprobs"], dtype=torch.float64)
        print(f"engine fp32 / engine of {args.engine_ref}: throughput {e['tokens_per_s'] / r['tokens_per_s']:.2f}x, per "
              f"CPU-second {e['tokens_per_cpu_s'] / r['tokens_per_cpu_s']:.2f}x, peak RSS "
              f"{e['peak_rss_gb'] - r['peak_rss_gb']:+.2f} GB; held-out logprobs max |d| {d.abs().max():.2e}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if "engine-unpacked" in results:
        u = results["engine-unpacked"]
        print(f"fp32 (packed base) / unpacked base: throughput {e['tokens_per_s'] / u['tokens_per_s']:.2f}x, per "
              f"CPU-second {e['tokens_per_cpu_s'] / u['tokens_per_cpu_s']:.2f}x, peak RSS "
              f"{e['peak_rss_gb'] - u['peak_rss_gb']:+.2f} GB")
    peaks = matmul_peaks_gflops()
    print("matmul peaks (GFLOP/s): " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items()))
    fp32_peak, bf16_peak = peaks.get("fp32 oneDNN", peaks["fp32 torch.mm"]), peaks.get("bf16 oneDNN", float("nan"))
    if args.threads == 1:  # one thread: a CPU-second is a second of one core, the peaks' unit
        shares = [f"{side} {4 * n * results[side]['tokens_per_cpu_s'] / 1e9 / fp32_peak:.0%}"
                  for side in ("engine", "engine-ref") if side in results]
        bf16 = "" if h is None else f", engine bf16 {4 * n * h['tokens_per_cpu_s'] / 1e9 / bf16_peak:.0%} of bf16's"
        print(f"per CPU-second: {', '.join(shares)} of the oneDNN fp32 peak{bf16}")
    lora, attention = extra_flops_per_token(args.model, args.steps)
    total = 4 * n + lora + attention
    per_s = e["tokens_per_cpu_s"] if args.threads == 1 else e["tokens_per_s"]
    print(f"all matmul FLOPs per token: 4N {4 * n / 1e6:.0f}M + LoRA {lora / 1e6:.0f}M + attention "
          f"{attention / 1e6:.0f}M = {total / 1e6:.0f}M ({total / (4 * n):.2f}x 4N); counted so, engine fp32 does "
          f"{total * per_s / 1e9:.1f} GFLOP/s{' per CPU-second' if args.threads == 1 else ''} = "
          f"{total * per_s / 1e9 / fp32_peak:.0%} of the oneDNN fp32 peak")
    bf16 = "" if h is None else f"engine bf16: {4 * n * h['tokens_per_s'] / 1e9 / bf16_peak:.0%} of bf16's; "
    print(f"engine fp32: {4 * n * e['tokens_per_s'] / 1e9 / fp32_peak:.0%} of the oneDNN fp32 peak (target >= 60%); "
          f"{bf16}load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
