"""Figures of the weights tools on a finished ``recipes.sl_basic`` run: merge, PEFT adapter, GGUF f16 and q8_0, and
a greedy completion of a held-out description from the merged model in transformers against the engine's.

    python -m recipes.sl_basic                                   # the run (minutes on a CPU)
    python bench/bench_weights.py --log-path /tmp/tinker-examples/sl_basic --out /tmp/weights-figures

Each export runs as ``tinker-cookbook weights ...`` in its own process, so its time and peak memory (the child's
maximum resident set, from ``wait4``) are its own, imports and model loading included. The greedy check samples the
run's last sampler checkpoint with the engine (temperature 0) and the merged folder with ``FolderSamplingClient``
(transformers, fp32, temperature 0) from the same rendered prompt and prints both completions and whether their
tokens are equal. Prints a Markdown table. Not a test: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "tinker_cookbook.cli"]


def size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def held_out_prompt(data: Path, test_size: int = 48) -> list[dict[str, str]]:
    """The first held-out conversation of sl_basic's split (rows shuffled with seed 0, the first ``test_size``
    held out), without its assistant answer."""
    import numpy as np

    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    first = rows[int(np.random.default_rng(0).permutation(len(rows))[:test_size][0])]
    return [m for m in first["messages"] if m["role"] != "assistant"][:2]


def greedy(checkpoint: str, merged: str, max_tokens: int) -> dict[str, object]:
    """Both greedy completions of the held-out prompt, and whether their tokens are equal."""
    from tinker_cookbook import renderers, tinker, weights
    from tinker_cookbook.tinker import types

    messages = held_out_prompt(REPO / "example-data" / "conversations.jsonl")
    engine = tinker.ServiceClient().create_sampling_client(model_path=checkpoint)
    folder = weights.FolderSamplingClient(merged)
    renderer = renderers.get_renderer(folder.info["renderer_name"], folder.get_tokenizer())
    prompt = renderer.build_generation_prompt(messages)
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=renderer.get_stop_sequences())
    results = {}
    for name, client in (("engine", engine), ("transformers", folder)):
        started = time.perf_counter()
        tokens = client.sample(prompt, 1, params).result().sequences[0].tokens
        results[name] = (tokens, time.perf_counter() - started)
    text = {k: renderers.get_text_content(renderer.parse_response(v[0])[0]) for k, v in results.items()}
    return {"prompt": messages[-1]["content"], "engine": text["engine"], "transformers": text["transformers"],
            "tokens_equal": results["engine"][0] == results["transformers"][0],
            "tokens": len(results["engine"][0]),
            "seconds": {k: round(v[1], 2) for k, v in results.items()}}


def last_sampler_path(log_path: Path) -> str:
    rows = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines() if line.strip()]
    return str(next(r["sampler_path"] for r in reversed(rows) if r.get("sampler_path")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-path", default="/tmp/tinker-examples/sl_basic", help="the sl_basic run's log folder")
    parser.add_argument("--out", default="/tmp/weights-figures", help="where the exports go (replaced)")
    parser.add_argument("--checkpoint", help="a tinker:// sampler path (default: the run's last one)")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--step", help=argparse.SUPPRESS)  # internal: run one step in this process
    args = parser.parse_args()
    log_path, out = Path(args.log_path), Path(args.out)
    checkpoint = args.checkpoint or last_sampler_path(log_path)
    merged, adapter = out / "merged", out / "adapter"
    if args.step == "greedy":
        print(json.dumps(greedy(checkpoint, str(merged), args.max_tokens)))
        return
    out.mkdir(parents=True, exist_ok=True)
    steps = [
        ("merge", [*CLI, "weights", "merge", checkpoint, "-o", str(merged), "--log-path", str(log_path), "--force"],
         merged),
        ("adapter", [*CLI, "weights", "adapter", checkpoint, "-o", str(adapter), "--force"], adapter),
        ("gguf f16", [*CLI, "weights", "export-gguf", str(merged), "-o", str(out / "model-f16.gguf"), "--type", "f16",
                      "--ollama", "--force"], out / "model-f16.gguf"),
        ("gguf q8_0", [*CLI, "weights", "export-gguf", str(merged), "-o", str(out / "model-q8_0.gguf"), "--type",
                       "q8_0", "--force"], out / "model-q8_0.gguf"),
    ]
    print(f"checkpoint {checkpoint}\n\n| step | seconds | peak RSS (MB) | output (MB) |\n|---|---|---|---|")
    for name, argv, output in steps:
        # a fresh interpreter per step, so that RUSAGE_CHILDREN's running maximum is this step's own
        wrapper = [sys.executable, "-c", "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
                   "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, file=sys.stderr)", *argv]
        started = time.perf_counter()
        done = subprocess.run(wrapper, cwd=REPO, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{name} failed:\n{done.stderr}")
        peak = float(done.stderr.strip().splitlines()[-1])
        print(f"| {name} | {time.perf_counter() - started:.1f} | {peak:.0f} | {size_mb(output):.1f} |", flush=True)
    result = subprocess.run([sys.executable, "-m", "bench.bench_weights", "--step", "greedy", "--checkpoint", checkpoint,
                             "--out", str(out), "--max-tokens", str(args.max_tokens)], cwd=REPO, capture_output=True,
                            text=True, check=True)
    print("\n" + json.dumps(json.loads(result.stdout.strip().splitlines()[-1]), indent=2))


if __name__ == "__main__":
    main()
