"""Sampler snapshots merged vs unmerged (``engine/sampling/lora.py``): memory per extra snapshot, mixed-batch decode.

    python bench/bench_sampler_lora.py                      # SmolLM2-135M-Instruct, 3 adapters of rank 32
    python bench/bench_sampler_lora.py --model tinker-cookbook/tiny-smollm2 --rounds 1 --max-tokens 8

(a) Memory: the bytes each extra snapshot holds beyond the base (tensors reachable from its ``SamplingWeights`` and
    not from the base model's), and the process RSS growth per snapshot, merged and unmerged.
(b) Decode: the base model and ``--adapters`` snapshots, ``--sequences`` sequences each (no EOS stop, always
    ``--max-tokens`` tokens), all submitted at once: merged, each snapshot decodes in a batch of its own; unmerged,
    all rows decode in one batch. Tokens/s = generated tokens over wall time (prefill included). Also one snapshot
    alone with all the rows (the cost of the per-row update against a merged weight). Merged and unmerged rounds
    alternate; the best round counts. The load average is printed with the results: the machine may be shared.

(c) CPU time (process time, one torch thread: the least sensitive to a shared machine's load) of one decode step
    (``sampler_model.decode`` + ``logits``) of ``4 * --sequences`` rows: merged one snapshot, unmerged one snapshot,
    unmerged base + 3 snapshots mixed; and of ``--sequences`` rows merged, what each of 4 merged snapshots decoding
    in turn costs. Median of 7 rounds of 5 steps.

Adapters are random (A and B ~ N(0, 0.02)) on every linear layer and the unembedding, as ``train_unembed`` makes.
Runs with the fast-malloc environment of ``bench_sampling.py`` (re-executes itself with it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

FAST_MALLOC = {
    "MALLOC_MMAP_THRESHOLD_": "33554432",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
    "MALLOC_TOP_PAD_": "1073741824",
}


def _rss() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def random_adapter(state: dict[str, Any], rank: int, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    adapter: dict[str, Any] = {}
    modules = [k.removesuffix(".weight") for k, v in state.items() if v.dim() == 2 and "_proj." in k]
    embed = next(v for k, v in state.items() if k.endswith("embed_tokens.weight"))
    shapes = {m: state[f"{m}.weight"].shape for m in modules} | {"lm_head": embed.shape}
    for module, (out, inp) in shapes.items():
        prefix = f"base_model.model.{module}"
        adapter[f"{prefix}.lora_A.weight"] = torch.randn(rank, inp, generator=generator) * 0.02
        adapter[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * 0.02
    return adapter, {"r": rank, "lora_alpha": 32}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    parser.add_argument("--adapters", type=int, default=3)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--sequences", type=int, default=8, help="per snapshot")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if any(os.environ.get(k) != v for k, v in FAST_MALLOC.items()):
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **FAST_MALLOC})

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree's package
    import torch

    import tinker_cookbook
    from tinker_cookbook.engine.models import load_model
    from tinker_cookbook.engine.sampling import lora as sampler_lora
    from tinker_cookbook.engine.sampling.sampler import SamplerEngine
    from tinker_cookbook.engine.sampling.weights import SamplingWeights
    from tinker_cookbook.tinker import types

    hf = load_model(args.model, torch.float32)
    state = {k: v.detach() for k, v in hf.state_dict().items() if not (k == "lm_head.weight" and hf.config.tie_word_embeddings)}
    adapters = [random_adapter(state, args.rank, seed) for seed in range(args.adapters)]
    dtype = torch.float32
    print(f"tree {os.path.dirname(tinker_cookbook.__file__)}")
    print(f"model {args.model}, {sum(v.numel() for v in state.values()) / 1e6:.1f}M params, {dtype}, "
          f"{torch.get_num_threads()} threads, {args.adapters} adapters of rank {args.rank}")

    # (a) memory per extra snapshot
    snapshots: dict[str, list[SamplingWeights]] = {}
    for mode in ("merged", "unmerged"):
        start = _rss()
        base = SamplingWeights.build(hf.config, state, None, None, dtype, lora_mode=mode)
        after_base = _rss()
        built = [SamplingWeights.build(hf.config, state, a, c, dtype, lora_mode=mode) for a, c in adapters]
        grown = _rss() - after_base
        base_storages = sampler_lora.held_storages(base)
        own = [sum(b for p, b in sampler_lora.held_storages(w).items() if p not in base_storages) for w in built]
        snapshots[mode] = [base, *built]
        print(f"(a) {mode:8s}: base {(after_base - start) / 2**20:7.1f} MiB RSS; per extra snapshot "
              f"{sum(own) / len(own) / 2**20:7.1f} MiB held, {grown / len(built) / 2**20:7.1f} MiB RSS growth")

    # (b) decode tokens/s
    prompt = types.ModelInput.from_ints(list(range(1000, 1040)))

    def run(weights: list[SamplingWeights], per_snapshot: int) -> tuple[float, int]:
        params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1)
        with SamplerEngine(max_batch_sequences=256) as engine:
            engine.submit(weights[0], None, prompt, 1, types.SamplingParams(max_tokens=2)).result()  # warm up
            start = time.perf_counter()
            futures = [engine.submit(w, None, prompt, per_snapshot, params) for w in weights]
            tokens = sum(len(s.tokens) for f in futures for s in f.result().sequences)
            elapsed = time.perf_counter() - start
            steps = engine.stats().max_batch_sequences_seen
        return tokens / elapsed, steps

    rows = args.sequences * (args.adapters + 1)
    best: dict[str, float] = {}
    widest: dict[str, int] = {}
    for _ in range(args.rounds):
        for mode in ("merged", "unmerged"):
            for case, weights, per in (
                ("mixed", snapshots[mode], args.sequences),
                ("one snapshot", snapshots[mode][1:2], rows),
            ):
                speed, wide = run(weights, per)
                key = f"{case}, {mode}"
                best[key] = max(best.get(key, 0.0), speed)
                widest[key] = wide
    for key, speed in best.items():
        print(f"(b) {key:22s}: {speed:7.1f} tok/s ({rows} rows, widest decode batch {widest[key]})")
    print(f"load average {os.getloadavg()}")
    cpu_steps(snapshots, args.sequences)
    print(f"load average {os.getloadavg()}")


def cpu_steps(snapshots: dict[str, list[Any]], per_snapshot: int) -> None:
    """(c): CPU milliseconds per decode step at one thread."""
    import torch

    from tinker_cookbook.engine.sampling import decode as sampler_decode
    from tinker_cookbook.engine.sampling import decoder_model as sampler_model
    from tinker_cookbook.engine.sampling import lora as sampler_lora

    torch.set_num_threads(1)
    merged, unmerged = snapshots["merged"], snapshots["unmerged"]
    base = unmerged[0].decoder
    spec = base.spec

    def step_ms(make: Any, rows: int) -> float:
        cache = torch.zeros(spec.num_layers, 2, rows, spec.num_kv_heads, 64, spec.head_dim)
        tokens, positions = torch.arange(1000, 1000 + rows), torch.full((rows,), 40)
        times = []
        with torch.inference_mode():
            for _ in range(7):
                start = time.process_time()
                for _ in range(5):
                    decoder = make()
                    sampler_model.logits(decoder, sampler_decode.decode(decoder, cache, tokens, positions, 41))
                times.append((time.process_time() - start) / 5 * 1000)
        return sorted(times)[len(times) // 2]

    rows = 4 * per_snapshot
    mixed = [w.adapter for w in unmerged for _ in range(per_snapshot)]
    cases = {
        f"merged, one snapshot, {rows} rows": (lambda: merged[1].decoder, rows),
        f"unmerged, one snapshot, {rows} rows": (lambda: unmerged[1].model, rows),
        f"unmerged, base + 3 snapshots, {rows} rows": (lambda: sampler_lora.for_rows(base, mixed), rows),
        f"merged, one snapshot, {per_snapshot} rows": (lambda: merged[1].decoder, per_snapshot),
    }
    for name, (make, count) in cases.items():
        print(f"(c) {name:40s}: {step_ms(make, count):6.1f} ms CPU per decode step (1 thread)")


if __name__ == "__main__":
    main()
