"""One prepared check for a lent GPU: the engine on CUDA against plain transformers+peft and HF ``generate``.

    python bench/gpu_check.py                 # Llama-3-8B shapes, random weights (no hub), on the GPU
    python bench/gpu_check.py --smoke         # tiny shapes, any device (CPU included): checks that the script runs

Everything runs in this one process, in this order, on the same random model (seeded; HF default init):

1. Training: LoRA r32 on all linear layers and the unembedding, ``forward_backward(cross_entropy)`` +
   ``optim_step`` on ``--batch`` sequences of ``--seq-len`` tokens, through the engine's ``TrainingSession`` (bf16
   autocast of the frozen base on CUDA, LoRA/Adam/logits fp32); then the plain loop a user would write: peft on the
   same model, ``torch.autocast(bf16)`` on CUDA, ``labels=``, ``torch.optim.AdamW`` (run first; the model is
   unwrapped again before the engine adapts it). Tokens/s, achieved TFLOP/s at 4·N
   FLOPs per token (forward 2N + backward through activations 2N) and MFU against ``--peak-tflops`` (bf16 dense
   peak; looked up for known GPUs), peak GPU memory, and the ratios.
2. Sampling at RL shapes: ``--prompts`` prompts x ``--samples`` samples x ``--new-tokens`` tokens, all submitted at
   once to the engine's sampler (default dtype of the device), against HF ``generate`` (bf16 autocast,
   ``num_return_sequences``) on the same prompts. Tokens/s and the ratio.
3. Agreement: the sampler's logprobs of its sampled tokens and of the prompt tokens against the training forward of
   the same tokens: mean/max |d| and kl_sample_train v1/v2.

Prints one block of figures; nothing is written. Device time is scarce: the defaults fit in a few minutes on an
H100/H200 (model build and warm-up included).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Any

import torch

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "4090": 165.0}


def make_config(smoke: bool) -> Any:
    from transformers import LlamaConfig

    if smoke:
        return LlamaConfig(
            vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        )  # fmt: skip
    return LlamaConfig(  # Llama-3-8B
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=8192, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False,
    )  # fmt: skip


def build_model(config: Any, device: torch.device) -> Any:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.eval().requires_grad_(False)
    return model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def batch_tokens(seed: int, batch: int, length: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (batch, length), generator=generator).tolist()


def engine_training(model: Any, args: argparse.Namespace, device: torch.device) -> tuple[dict[str, float], Any]:
    from tinker_cookbook.engine.device import base_dtype
    from tinker_cookbook.engine.models import ModelSpec
    from tinker_cookbook.engine.training.session import BaseModel, TrainingSession
    from tinker_cookbook.tinker import types

    spec = ModelSpec(
        name="gpu-check/llama3-8b-shaped", arch="llama", tokenizer_name="", max_context_length=8192,
        source="tiny", description="random weights",
    )  # fmt: skip
    base = BaseModel(spec, model, base_dtype(device))
    session = TrainingSession("gpu-check", base, types.LoraConfig(rank=32, seed=0))

    def data(seqs: list[list[int]]) -> list[types.Datum]:
        return [
            types.Datum(
                model_input=types.ModelInput.from_ints(s[:-1]),
                loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0 / (len(s) - 1)] * (len(s) - 1)},
            )
            for s in seqs
        ]

    vocab = model.config.vocab_size
    reset_peak(device)
    session.forward(data(batch_tokens(0, args.batch, args.seq_len, vocab)), "cross_entropy", None, backward=True)
    session.optim_step(types.AdamParams(learning_rate=1e-4))
    sync(device)
    start, tokens = time.perf_counter(), 0
    for step in range(args.steps):
        seqs = batch_tokens(step + 1, args.batch, args.seq_len, vocab)
        session.forward(data(seqs), "cross_entropy", None, backward=True)
        session.optim_step(types.AdamParams(learning_rate=1e-4))
        tokens += sum(len(s) - 1 for s in seqs)
    sync(device)
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": tokens / elapsed, "peak_gb": peak_memory_gb(device)}, (base, session)


def plain_training(model: Any, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    import peft

    config = peft.LoraConfig(r=32, lora_alpha=32, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"])  # fmt: skip
    wrapped = peft.get_peft_model(model, config)
    wrapped.train()
    optimizer = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-4, betas=(0.9, 0.95))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    vocab = model.config.vocab_size

    def step(seed: int) -> int:
        ids = torch.tensor(batch_tokens(seed, args.batch, args.seq_len, vocab), device=device)
        with autocast:
            loss = wrapped(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return ids.numel() - ids.shape[0]

    reset_peak(device)
    step(0)
    sync(device)
    start, tokens = time.perf_counter(), 0
    for i in range(args.steps):
        tokens += step(i + 1)
    sync(device)
    elapsed = time.perf_counter() - start
    wrapped.unload()  # the plain model back, LoRA layers removed
    return {"tokens_per_s": tokens / elapsed, "peak_gb": peak_memory_gb(device)}


def engine_sampling(base: Any, session: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from tinker_cookbook.engine.sampling.sampler import SamplerEngine
    from tinker_cookbook.engine.sampling.weights import SamplingWeights, default_sampling_dtype
    from tinker_cookbook.tinker import types

    dtype = default_sampling_dtype(device)
    weights = SamplingWeights.build(
        base.config, base.base_state, base.adapter_state(session.run_id),
        base.adapter_config_dict(session.run_id), dtype,
    )  # fmt: skip
    prompts = batch_tokens(100, args.prompts, args.prompt_len, base.vocab_size)
    params = [types.SamplingParams(max_tokens=args.new_tokens, temperature=1.0, seed=i) for i in range(len(prompts))]
    with SamplerEngine(max_batch_sequences=max(256, args.prompts * args.samples)) as engine:
        engine.submit(weights, None, types.ModelInput.from_ints(prompts[0]), 2, params[0]).result()
        sync(device)
        start = time.perf_counter()
        futures = [
            engine.submit(weights, None, types.ModelInput.from_ints(p), args.samples, q)
            for p, q in zip(prompts, params, strict=True)
        ]
        responses = [f.result() for f in futures]
        elapsed = time.perf_counter() - start
        scored = engine.submit(
            weights, None, types.ModelInput.from_ints(prompts[0]), 1, types.SamplingParams(max_tokens=1),
            include_prompt_logprobs=True,
        ).result()  # fmt: skip
        kv_peak = engine.stats().peak_kv_bytes
    tokens = sum(len(s.tokens) for r in responses for s in r.sequences)
    return {
        "tokens_per_s": tokens / elapsed, "dtype": str(dtype).removeprefix("torch."), "prompts": prompts,
        "responses": responses, "prompt_logprobs": scored.prompt_logprobs, "kv_peak_gb": kv_peak / 1e9,
    }  # fmt: skip


def hf_generate(model: Any, prompts: list[list[int]], args: argparse.Namespace, device: torch.device) -> float:
    ids = torch.tensor(prompts, device=device)  # equal lengths: no padding needed
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    torch.manual_seed(0)
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode(), autocast:
        out = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, num_return_sequences=args.samples,
            pad_token_id=0, eos_token_id=None,
        )  # fmt: skip
    sync(device)
    return (out.shape[0] * (out.shape[1] - ids.shape[1])) / (time.perf_counter() - start)


def agreement(session: Any, sampled: dict[str, Any]) -> dict[str, float]:
    """Sampler logprobs (q) against the training forward (p): sampled tokens and the first prompt's tokens."""
    from tinker_cookbook.tinker import types

    rows = [(p, s) for p, r in zip(sampled["prompts"], sampled["responses"], strict=True) for s in r.sequences]
    rows = rows[:64]  # enough tokens for the statistics, bounded forward cost
    sequences = [p + s.tokens for p, s in rows] + [sampled["prompts"][0]]
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(s[:-1]),
            loss_fn_inputs={"target_tokens": s[1:], "weights": [1.0] * (len(s) - 1)},
        )
        for s in sequences
    ]
    out = session.forward(data, "cross_entropy", None, backward=False)
    learner = [o["logprobs"].tolist() for o in out.loss_fn_outputs]
    deltas = []
    for (prompt, sequence), p in zip(rows, learner, strict=False):
        deltas += [q - pv for q, pv in zip(sequence.logprobs, p[len(prompt) - 1 :], strict=True)]
    d = torch.tensor(deltas, dtype=torch.float64)
    prompt_d = torch.tensor(sampled["prompt_logprobs"][1:], dtype=torch.float64) - torch.tensor(learner[-1])
    return {
        "sampled_mean": d.abs().mean().item(), "sampled_max": d.abs().max().item(), "v1": d.mean().item(),
        "v2": (0.5 * d**2).mean().item(), "prompt_mean": prompt_d.abs().mean().item(),
        "prompt_max": prompt_d.abs().max().item(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, any device: check that the script runs")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: $TINKER_COOKBOOK_DEVICE/auto)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--prompt-len", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    parser.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak for MFU")
    args = parser.parse_args()
    defaults = (
        {"steps": 2, "batch": 2, "seq_len": 64, "prompts": 4, "samples": 4, "prompt_len": 16, "new_tokens": 8}
        if args.smoke
        else {"steps": 3, "batch": 4, "seq_len": 1024, "prompts": 32, "samples": 8, "prompt_len": 256,
              "new_tokens": 256}
    )  # fmt: skip
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    from tinker_cookbook.engine.device import resolve_device

    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    config = make_config(args.smoke)
    print(f"device {device} ({name}); torch {torch.__version__}; {'smoke shapes' if args.smoke else 'Llama-3-8B shapes'}",
          flush=True)  # fmt: skip

    model = build_model(config, device)
    n_params = sum(p.numel() for p in model.parameters())
    plain = plain_training(model, args, device)
    engine, (base, session) = engine_training(model, args, device)

    def flops(rate: float) -> str:
        achieved = 4 * n_params * rate / 1e12
        mfu = f", MFU {achieved / peak:.1%} of {peak:.0f}" if peak else ""
        return f"{achieved:.1f} TFLOP/s{mfu}"

    print(f"\n1. LoRA r32 training, {args.batch} x {args.seq_len} tokens, N = {n_params / 1e9:.2f}B")
    print(f"   plain peft loop: {plain['tokens_per_s']:9.0f} tok/s  {flops(plain['tokens_per_s'])}  "
          f"peak mem {plain['peak_gb']:.1f} GB")  # fmt: skip
    print(f"   engine:          {engine['tokens_per_s']:9.0f} tok/s  {flops(engine['tokens_per_s'])}  "
          f"peak mem {engine['peak_gb']:.1f} GB")  # fmt: skip
    print(f"   ratio engine / plain: throughput {engine['tokens_per_s'] / plain['tokens_per_s']:.2f}x, "
          f"memory {engine['peak_gb'] / plain['peak_gb']:.2f}x", flush=True)  # fmt: skip

    sampled = engine_sampling(base, session, args, device)
    hf_rate = hf_generate(base.activate(session.run_id), sampled["prompts"], args, device)
    print(f"\n2. sampling, {args.prompts} prompts x {args.samples} samples x {args.new_tokens} tokens "
          f"(prompt {args.prompt_len})")  # fmt: skip
    print(f"   engine ({sampled['dtype']}): {sampled['tokens_per_s']:9.0f} tok/s (K/V peak {sampled['kv_peak_gb']:.2f} GB)")
    print(f"   HF generate ({'bf16 autocast' if device.type == 'cuda' else 'fp32'}): {hf_rate:9.0f} tok/s")
    print(f"   ratio engine / HF: {sampled['tokens_per_s'] / hf_rate:.2f}x", flush=True)

    agree = agreement(session, sampled)
    print("\n3. sampler vs training forward")
    print(f"   sampled tokens: mean|d| {agree['sampled_mean']:.4f} max {agree['sampled_max']:.3f}; "
          f"kl_sample_train v1 {agree['v1']:+.5f} v2 {agree['v2']:.6f}")  # fmt: skip
    print(f"   prompt tokens:  mean|d| {agree['prompt_mean']:.4f} max {agree['prompt_max']:.3f}")


if __name__ == "__main__":
    main()
