"""Several LoRA clients on one base: peak memory and throughput of batched multi-client training, in one run.

    python bench/bench_multi_lora.py                    # SmolLM2-135M-Instruct, LoRA r32, 4 clients
    python bench/bench_multi_lora.py --reps 2 --steps 2
    python bench/bench_multi_lora.py --model tinker-cookbook/tiny-smollm2 --steps 1   # a smoke run

Three sides, each in its own subprocess (so peak RSS is its own), alternating when ``--reps`` > 1 (best
throughput of each side kept), all with LoRA rank 32 on all linear layers incl. the unembedding, AdamW:

- one:   1 client on one client's batch per step, once for each of the 4 clients' batches, each in its own process
         (the memory reference: the largest of the 4 peaks, one client alone on whichever batch needs most);
- union: 1 client training the union of the 4 clients' batches per step (the throughput reference);
- four:  4 clients, each with its own batch per step, each submitting ``forward_backward`` + ``optim_step`` from
         its own thread and waiting for them (the engine batches their queued requests into shared passes).

Each client's batch: ``--seqs`` sequences of ``--min-len``-``--max-len`` tokens (the union is the same 4 batches).
A shared pass forms its length groups over all clients' rows, each no larger than the largest group any of its
clients would run alone, so its activations are at most those of the client with the largest groups alone. The
memory reference is therefore that client alone: one client's peak on client 0's batch only would compare the shared
pass against whichever client's batch happens to have the smallest groups (with the defaults, client 0's largest
group is 640 padded tokens and client 3's 898: about 0.35 GB of activations apart on SmolLM2-135M). Reported:
tokens/s over real tokens (and tokens per CPU-second of the process, steadier than wall time when other programs
share the cores), peak RSS, the ratios four/one for memory (target <= 1.2) and four/union for throughput (target
>= 0.9), how many requests ran batched, and the load average before and after. Not a test: machines are noisy, so
compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from typing import Any

from bench_training import FAST_MALLOC, make_batch, peak_rss_gb

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CLIENTS = 4
SIDES = ("one", "union", "four")


def run_side(side: str, model: str, steps: int, seqs: int, min_len: int, max_len: int, owner: int
             ) -> dict[str, Any]:
    from tinker_cookbook import tinker
    from tinker_cookbook.engine.backend import LocalBackend
    from tinker_cookbook.tinker import types

    service = tinker.ServiceClient()
    count = CLIENTS if side == "four" else 1
    clients = [service.create_lora_training_client(base_model=model, rank=32, seed=c) for c in range(count)]
    loaded_rss = peak_rss_gb()

    def batch(client: int, step: int) -> list[list[int]]:
        """Client ``client``'s sequences at ``step``; the union side's one client trains all 4 clients' batches,
        the one side's client those of client ``owner``. Step 0 is the warm-up (first-call costs): one short
        sequence per client."""
        owners = range(CLIENTS) if side == "union" else [owner] if side == "one" else [client]
        if step == 0:
            return [s for c in owners for s in make_batch(c, n=1, lo=64, hi=64)]
        return [s for c in owners for s in make_batch(1000 * step + c, n=seqs, lo=min_len, hi=max_len)]

    def data_for(sequences: list[list[int]]) -> list[types.Datum]:
        return [types.Datum(model_input=types.ModelInput.from_ints(s[:-1]),
                            loss_fn_inputs=dict(target_tokens=s[1:], weights=[1.0 / (len(s) - 1)] * (len(s) - 1)))
                for s in sequences]

    def train(client: int, steps_to_run: range, tokens: list[int]) -> None:
        tc = clients[client]
        for step in steps_to_run:
            sequences = batch(client, step)
            fb = tc.forward_backward(data_for(sequences), "cross_entropy")
            opt = tc.optim_step(types.AdamParams(learning_rate=1e-4))
            fb.result()
            opt.result()
            tokens[client] += sum(len(s) - 1 for s in sequences)

    def run_all(steps_to_run: range) -> int:
        tokens = [0] * count
        threads = [threading.Thread(target=train, args=(c, steps_to_run, tokens)) for c in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(tokens)

    run_all(range(0, 1))  # warm-up
    start, cpu_start = time.perf_counter(), cpu_seconds()
    tokens = run_all(range(1, steps + 1))
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    engine = LocalBackend.default()
    return {"tokens_per_s": tokens / elapsed, "tokens_per_cpu_s": tokens / cpu, "tokens": tokens, "seconds": elapsed,
            "peak_rss_gb": peak_rss_gb(), "loaded_rss_gb": loaded_rss, "batched_requests": engine.batched_requests}


def cpu_seconds() -> float:
    """CPU time of this process (all threads): the work done, whatever share of the cores other programs take."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--steps", type=int, default=1, help="timed steps after a short warm-up step")
    parser.add_argument("--seqs", type=int, default=4, help="sequences per client per step")
    parser.add_argument("--min-len", type=int, default=64, help="shortest sequence")
    parser.add_argument("--max-len", type=int, default=512, help="longest sequence")
    parser.add_argument("--reps", type=int, default=1, help="alternating rounds of the three sides (best kept)")
    parser.add_argument("--sides", default=",".join(SIDES), help="which sides to run, e.g. one,four (memory only)")
    parser.add_argument("--child", choices=SIDES)
    parser.add_argument("--owner", type=int, default=0, help="(one side) whose batches the one client trains")
    args = parser.parse_args()
    if args.child:
        result = run_side(args.child, args.model, args.steps, args.seqs, args.min_len, args.max_len, args.owner)
        print("RESULT " + json.dumps(result), flush=True)
        return
    env = {**os.environ, "TINKER_COOKBOOK_NO_REEXEC": "1", **FAST_MALLOC}
    env.pop("TINKER_COOKBOOK_TRAIN_DTYPE", None)
    # The script's own directory is bench/: put this tree's root first so that it is the code measured.
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    print(f"model {args.model}, LoRA r32 all linear + unembed, {CLIENTS} clients x {args.seqs} seqs x "
          f"{args.min_len}-{args.max_len} tokens per step, {args.steps} timed steps, {args.reps} round(s); {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f} at start")
    results: dict[str, dict[str, Any]] = {}
    sides = [side for side in SIDES if side in args.sides.split(",")]
    runs = [(f"one{c}" if side == "one" else side, side, c) for side in sides
            for c in (range(CLIENTS) if side == "one" else [0])]
    for rep in range(args.reps):
        for name, side, owner in runs:
            out = subprocess.run([sys.executable, __file__, "--child", side, "--owner", str(owner), "--model",
                                  args.model, "--steps", str(args.steps), "--seqs", str(args.seqs), "--min-len",
                                  str(args.min_len), "--max-len", str(args.max_len)],
                                 env=env, capture_output=True, text=True)
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
            if out.returncode != 0 or not line:
                sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
            result = json.loads(line[0][len("RESULT "):])
            print(f"  round {rep + 1} {name:>5}: {result['tokens_per_s']:7.1f} tok/s ({result['tokens']} tokens in "
                  f"{result['seconds']:.1f} s; {result['tokens_per_cpu_s']:.1f} tok per CPU-s), peak RSS {result['peak_rss_gb']:.2f} GB, "
                  f"{result['batched_requests']} requests batched; load average {os.getloadavg()[0]:.1f}")
            if name not in results or result["tokens_per_s"] > results[name]["tokens_per_s"]:
                results[name] = result
    for name, _, _ in runs:
        r = results[name]
        print(f"{name:>5}: {r['tokens_per_s']:7.1f} tok/s   {r['tokens_per_cpu_s']:7.1f} tok per CPU-s   peak RSS {r['peak_rss_gb']:.2f} GB (after load "
              f"{r['loaded_rss_gb']:.2f} GB)")
    ones = [results[name]["peak_rss_gb"] for name, side, _ in runs if side == "one"]
    if ones and "four" in results:
        print(f"four/one peak memory {results['four']['peak_rss_gb'] / max(ones):.2f}x (target <= 1.2; one: the "
              f"largest of the {len(ones)} one-client peaks; against one0's alone "
              f"{results['four']['peak_rss_gb'] / ones[0]:.2f}x)")
    if "union" in results and "four" in results:
        four, union = results["four"], results["union"]
        print(f"four/union throughput {four['tokens_per_s'] / union['tokens_per_s']:.2f}x (target >= 0.9), per "
              f"CPU-second {four['tokens_per_cpu_s'] / union['tokens_per_cpu_s']:.2f}x")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
