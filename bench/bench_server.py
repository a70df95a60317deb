"""Load test of the OpenAI-compatible server against the in-process sampler doing the same requests.

    python bench/bench_server.py                            # SmolLM2-135M-Instruct, 16 clients x 1000 chat requests
    python bench/bench_server.py --clients 4 --requests 50 --model tinker-cookbook/tiny-smollm2

Both phases run the same requests: short chat prompts, ``max_tokens`` cycling through 1..``--max-tokens``,
temperature 1 with a seed per request. Each of ``--clients`` threads sends its ``--requests`` one after another.

1. In-process: the threads share one ``SamplingClient`` and do what the server does per request (render the
   messages with the model's renderer, ``sample``, parse the reply): the baseline without HTTP.
2. Server: ``tinker-cookbook serve`` in its own process (as users run it), and one official ``openai.OpenAI``
   client per thread calling ``/v1/chat/completions`` (``max_retries=0``, so every failure counts as an error).

Reported: errors, requests/s, generated tokens/s, p50/p99 latency of one request, and server/in-process ratios.
Not a test: the machine may be shared and noisy, so compare figures within one run. The malloc setting, torch threads
and the load average are printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tinker_cookbook import perf_env

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTIONS = ["What is {a} + {b}?", "Name a colour.", "Say hello to {a}.", "Is {a} even?", "Spell {b}."]


def messages_for(client: int, index: int) -> list[dict[str, str]]:
    question = QUESTIONS[(client + index) % len(QUESTIONS)].format(a=client * 7 + index % 50, b=index % 13)
    return [{"role": "user", "content": question}]


@dataclass
class Phase:
    name: str
    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, latency: float, tokens: int) -> None:
        with self.lock:
            self.latencies.append(latency)
            self.tokens += tokens

    def fail(self, error: BaseException) -> None:
        with self.lock:
            self.errors.append(f"{type(error).__name__}: {error}")

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")
        return {"phase": self.name, "requests": len(ordered), "errors": len(self.errors),
                "seconds": round(self.seconds, 2), "requests_per_s": round(len(ordered) / self.seconds, 2),
                "tokens_per_s": round(self.tokens / self.seconds, 2),
                "p50_ms": round(1000 * statistics.median(ordered), 1) if ordered else None,
                "p99_ms": round(1000 * p99, 1)}


def run_phase(name: str, clients: int, requests: int, one_request: Callable[[int, int], int]) -> Phase:
    """``clients`` threads, each doing ``requests`` sequential calls of ``one_request(client, index) -> tokens``."""
    phase = Phase(name)
    start_gate = threading.Barrier(clients + 1)

    def worker(client: int) -> None:
        start_gate.wait()
        for index in range(requests):
            began = time.perf_counter()
            try:
                tokens = one_request(client, index)
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                phase.fail(exc)
                continue
            phase.record(time.perf_counter() - began, tokens)

    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in range(clients)]
    for thread in threads:
        thread.start()
    start_gate.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    phase.seconds = time.perf_counter() - began
    return phase


def in_process_request(model: str, max_tokens: int) -> Callable[[int, int], int]:
    from tinker_cookbook import model_info, renderers, tinker
    from tinker_cookbook.tinker import types

    sampler = tinker.ServiceClient().create_sampling_client(base_model=model)
    renderer = renderers.get_renderer(model_info.get_recommended_renderer_name(model), sampler.get_tokenizer())
    stop = renderer.get_stop_sequences()

    def one(client: int, index: int) -> int:
        msgs = [renderers.Message(role=m["role"], content=m["content"]) for m in messages_for(client, index)]
        prompt = renderer.build_generation_prompt(msgs)
        params = types.SamplingParams(max_tokens=1 + index % max_tokens, seed=index, stop=stop)
        response = sampler.sample(prompt, 1, params).result()
        renderer.parse_response(response.sequences[0].tokens)
        return len(response.sequences[0].tokens)

    return one


def start_server(model: str) -> tuple[subprocess.Popen[str], str]:
    """``tinker-cookbook serve`` on a free loopback port with the model loaded; returns the process and URL."""
    command = [sys.executable, "-m", "tinker_cookbook.cli", "serve", "--port", "0", "--model", model,
               "--max-n", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if "listening on " in line:
            url = line.split("listening on ")[1].split()[0]
            # keep draining its output so that the server never blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in process.stdout or []], daemon=True).start()
            return process, url
    raise RuntimeError(f"the server exited with {process.wait()} before listening")


def server_request(url: str, model: str, max_tokens: int, clients: int) -> Callable[[int, int], int]:
    import openai

    per_thread = [openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=600)
                  for _ in range(clients)]

    def one(client: int, index: int) -> int:
        reply = per_thread[client].chat.completions.create(
            model=model, messages=messages_for(client, index), max_tokens=1 + index % max_tokens, seed=index)
        return reply.usage.completion_tokens if reply.usage else 0

    return one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (threads)")
    parser.add_argument("--requests", type=int, default=1000, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=4, help="max_tokens cycles through 1..this")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    perf_env.reexec_with_fast_malloc()
    import torch

    malloc = "fast malloc settings" if perf_env.fast_malloc_active() else "glibc defaults"
    print(f"model {args.model}; {args.clients} clients x {args.requests} requests, max_tokens 1..{args.max_tokens}; "
          f"malloc: {malloc}; torch threads {torch.get_num_threads()}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)

    one = in_process_request(args.model, args.max_tokens)
    run_phase("warm-up", 2, 4, one)
    local = run_phase("in-process SamplingClient", args.clients, args.requests, one)
    print(json.dumps(local.summary()), flush=True)

    process, url = start_server(args.model)
    try:
        one = server_request(url, args.model, args.max_tokens, args.clients)
        run_phase("warm-up", 2, 4, one)
        served = run_phase("server + openai clients", args.clients, args.requests, one)
    finally:
        process.terminate()
        process.wait(timeout=60)
    print(json.dumps(served.summary()), flush=True)

    a, b = local.summary(), served.summary()
    print("\n| | errors | requests/s | tokens/s | p50 | p99 |\n|---|---|---|---|---|---|")
    for row in (a, b):
        print(f"| {row['phase']} | {row['errors']} | {row['requests_per_s']} | {row['tokens_per_s']} | "
              f"{row['p50_ms']} ms | {row['p99_ms']} ms |")
    print(f"| **server / in-process** | | **{b['requests_per_s'] / a['requests_per_s']:.2f}x** | "
          f"{b['tokens_per_s'] / a['tokens_per_s']:.2f}x | {b['p50_ms'] / a['p50_ms']:.2f}x | "
          f"{b['p99_ms'] / a['p99_ms']:.2f}x |")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    for phase in (local, served):
        for error in phase.errors[:5]:
            print(f"{phase.name} error: {error}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"in_process": a, "server": b, "args": vars(args)}, f, indent=2)


if __name__ == "__main__":
    main()
