"""Batch-1 decoding: the sampler (fp32) against llama.cpp (``llama-cpp-python``) on the packaged SmolLM2 GGUF.

    bench/.venv-peers/bin/python bench/bench_peer_decode.py                # 96 tokens, 2 alternating rounds
    bench/.venv-peers/bin/python bench/bench_peer_decode.py --threads 1 --reps 3

Needs the bench-only environment (``bash bench/peers/setup.sh``). Three sides, each in its own process, on the
same chat prompt (``bench_sampling``'s first question) with the same threads (``--threads``, default all cores):

- the sampler in fp32 (``TINKER_COOKBOOK_SAMPLER_DTYPE=fp32``), measured by ``bench/bench_sampling.py``'s batch-1
  worker: the weights are the packaged GGUF dequantized to fp32;
- llama.cpp at f32: the packaged GGUF with every tensor dequantized to f32 (written once with the ``gguf``
  package into the project's cache), so both run the very same weights;
- llama.cpp at the GGUF's own quantisation (Q4_1), the file as packaged.

Every side samples at temperature 1 from the whole distribution and decodes N tokens without stopping at EOS;
tokens/s is (N - 1) tokens over the time beyond a 1-token request (the prompt's prefill and first token), best of
``--reps`` alternating rounds. The memory-bandwidth bound of each side is the bytes it reads per decoded token
(every weight once, the unembedding included, plus the K/V attended to) over the best bandwidth measured in the
run (``bench_sampling.measured_bandwidths``, before and after the rounds). The goal: the sampler's fp32 batch-1
decode >= 0.8x llama.cpp's at f32. Not a test: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peer_common import ROOT, Goal, missing_peer, print_result, run_side  # noqa: E402

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GOAL = Goal("batch-1 tokens/s, sampler fp32 / llama.cpp f32", 0.8)


def f32_gguf(source: Path, target: Path) -> Path:
    """``source`` with every tensor dequantized to f32 and its metadata kept (file type set to all-F32); written
    once, atomically, and reused."""
    if target.exists():
        return target
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    partial = target.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, arch)
    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF.* header fields itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.ascontiguousarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type),
                                                            dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(target)
    return target


def gguf_weight_bytes(path: Path) -> int:
    """Bytes of every tensor in the file: a decoded token reads each once (the tied embedding as the unembedding)."""
    import gguf

    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)


def prompt_tokens(model: str) -> list[int]:
    from bench.bench_sampling import make_prompts
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    return make_prompts(get_tokenizer(model), 1)[0]


def run_llama(path: Path, prompt: list[int], new_tokens: int, threads: int) -> dict[str, Any]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=len(prompt) + new_tokens + 16, n_threads=threads,
                n_threads_batch=threads, seed=1, verbose=False)

    def timed(n: int) -> float:
        llm.reset()  # no reuse of the previous request's prompt K/V: every request prefills
        start = time.perf_counter()
        for i, _ in enumerate(llm.generate(prompt, temp=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)):
            if i + 1 == n:
                break
        return time.perf_counter() - start

    timed(4)
    prefill = min(timed(1) for _ in range(3))
    best = min(timed(new_tokens) for _ in range(2))
    return {"tokens_per_s": (new_tokens - 1) / (best - prefill), "threads": threads,
            "weight_bytes": gguf_weight_bytes(path)}


def run_sampler(model: str, new_tokens: int, threads: int) -> dict[str, Any]:
    command = [sys.executable, str(ROOT / "bench" / "bench_sampling.py"), "--worker", "batch1", "--model", model,
               "--batch1-tokens", str(new_tokens), "--threads", str(threads), "--tree", ""]
    return run_side("sampler fp32", command, {"TINKER_COOKBOOK_SAMPLER_DTYPE": "fp32"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the sampler's model (the GGUF's)")
    parser.add_argument("--tokens", type=int, default=96, help="tokens decoded per request")
    parser.add_argument("--threads", type=int, default=0, help="threads per side (0: all cores)")
    parser.add_argument("--reps", type=int, default=2, help="alternating rounds (best kept)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    threads = args.threads or os.cpu_count() or 1
    if args.child:
        print_result(run_llama(Path(args.child), prompt_tokens(args.model), args.tokens, threads))
        return
    if (problem := missing_peer("llama_cpp")) is not None:
        sys.exit(problem)
    import torch

    from bench.bench_sampling import measured_bandwidths
    from tinker_cookbook.base import assets

    q4 = assets.require(assets.smollm2_gguf(), "The packaged SmolLM2 GGUF")
    f32 = f32_gguf(q4, assets.cache_dir() / "models" / "SmolLM2-135M-Instruct.f32.gguf")
    print(f"model {args.model}; one chat prompt, {args.tokens} tokens at batch 1; {threads} threads per side; "
          f"{args.reps} alternating rounds; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
          flush=True)
    torch.set_num_threads(threads)
    bandwidths = [measured_bandwidths()]
    sides = {"sampler fp32": None, "llama.cpp f32": f32, "llama.cpp Q4_1": q4}
    best: dict[str, dict[str, Any]] = {}
    for _ in range(args.reps):
        for name, path in sides.items():
            if path is None:
                result = run_sampler(args.model, args.tokens, threads)
            else:
                result = run_side(name, [sys.executable, __file__, "--model", args.model, "--tokens",
                                         str(args.tokens), "--threads", str(threads), "--child", str(path)])
            print(f"  {name}: {result['tokens_per_s']:.1f} tok/s (load {os.getloadavg()[0]:.1f})", flush=True)
            if name not in best or result["tokens_per_s"] > best[name]["tokens_per_s"]:
                best[name] = result
    bandwidths.append(measured_bandwidths())
    best_of = {kind: max(b[kind] for b in bandwidths) for kind in bandwidths[0]}
    bandwidth = max(best_of.values())
    print("\nmeasured bandwidth (best of before and after): "
          + ", ".join(f"{kind} {gbs:.1f} GB/s" for kind, gbs in best_of.items()) + f"; bounds with {bandwidth:.1f} GB/s")
    sampler = best["sampler fp32"]
    kv = sampler.get("kv_bytes", 0.0)  # fp32 K/V attended per token; llama.cpp keeps f16 K/V: half of it
    for name, r in best.items():
        read = r["weight_bytes"] + (kv if name == "sampler fp32" else kv / 2)
        bound = bandwidth * 1e9 / read
        print(f"  {name:>15}: {r['tokens_per_s']:6.1f} tok/s; reads {read / 1e6:.0f} MB per token -> bound "
              f"{bound:.1f} tok/s ({r['tokens_per_s'] / bound:.0%} of it)")
    print("\n" + GOAL.line(sampler["tokens_per_s"], best["llama.cpp f32"]["tokens_per_s"], "tok/s"))
    q4_ratio = sampler["tokens_per_s"] / best["llama.cpp Q4_1"]["tokens_per_s"]
    print(f"sampler fp32 / llama.cpp Q4_1 (its default quantisation): {q4_ratio:.2f}x")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
