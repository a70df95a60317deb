"""The engine's general transformers path on the tiny mixture-of-experts models (Qwen3-MoE, gpt-oss with sinks and a
sliding window, DeepSeek-V3 with latent attention and a shared expert), and on a dense model against its fast path.

Tolerances: everything runs in fp32; the same function computed by different kernels (peft's forward against the
engine's chunked head, a KV-cached decode against a full forward, a merged adapter against an unmerged one) differs
by float32 rounding only, ~1e-6 on logprobs of ~-12 (observed <= 1e-6). 1e-4 leaves room for other BLAS builds and
thread counts while a wrong mask, position, routing or LoRA term moves logprobs by 1e-2 or more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.tiny_sessions import fp32_sampling_weights
from tinker_cookbook.engine import model_paths, models
from tinker_cookbook.engine.sampling.general import GeneralModel
from tinker_cookbook.engine.sampling.sampler import SamplerEngine
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.engine.store import files
from tinker_cookbook.engine.training.session import BaseModel, TrainingSession
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError

MOE_MODELS = ["tinker-cookbook/tiny-qwen3-moe", "tinker-cookbook/tiny-gpt-oss", "tinker-cookbook/tiny-deepseek-v3"]
TOLERANCE = 1e-4
PROMPT = [151644, 872, 198, 9707, 11, 1246, 525, 498, 30, 151645, 198, 151644]  # 12 tokens: past gpt-oss' window 8


def _session(name: str, run_id: str = "a", **lora: Any) -> TrainingSession:
    base = BaseModel(models.get_model_spec(name), models.load_model(name, torch.float32), torch.float32)
    return TrainingSession(run_id, base, types.LoraConfig(rank=4, seed=3, **lora))


def _datum(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


def _logprobs(session: TrainingSession, tokens: list[int]) -> torch.Tensor:
    out = session.forward([_datum(tokens)], "cross_entropy", None, backward=False)
    return torch.tensor(out.loss_fn_outputs[0]["logprobs"].tolist())


def _train(session: TrainingSession, steps: int = 2, lr: float = 1e-2, prompt: list[int] = PROMPT) -> list[float]:
    losses = []
    for _ in range(steps):
        out = session.forward([_datum(prompt + [3, 4, 5, 6])], "cross_entropy", None, backward=True)
        losses.append(out.metrics["loss:sum"])
        session.optim_step(types.AdamParams(learning_rate=lr))
    return losses


@pytest.fixture(scope="module", params=MOE_MODELS)
def trained(request: pytest.FixtureRequest) -> TrainingSession:
    """A session of each tiny MoE model after two steps (its LoRA B no longer zero)."""
    session = _session(request.param)
    _train(session)
    return session


def test_moe_models_take_the_general_path_and_adapt_experts_not_routers(trained: TrainingSession) -> None:
    assert trained.base.general
    keys = list(trained.base.adapter_state(trained.run_id))
    assert any(".experts." in k for k in keys) and any("self_attn" in k for k in keys)
    assert not any(k.split(".")[-3] in ("gate", "router") for k in keys)


def test_training_logprobs_equal_the_plain_peft_forward(trained: TrainingSession) -> None:
    import peft

    name = trained.base.spec.name
    config = peft.LoraConfig.from_peft_type(**trained.base.adapter_config_dict(trained.run_id))
    from tinker_cookbook.engine.training.general import v5_targets

    with v5_targets():
        reference = peft.get_peft_model(models.load_model(name, torch.float32), config)
    peft.set_peft_model_state_dict(reference, trained.base.adapter_state(trained.run_id))
    tokens = PROMPT + [3, 4, 5]
    with torch.no_grad():
        logits = reference(input_ids=torch.tensor([tokens[:-1]])).logits[0].float()
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
    assert (_logprobs(trained, tokens) - expected).abs().max() < TOLERANCE


def test_a_lora_step_changes_only_adapter_weights() -> None:
    session = _session("tinker-cookbook/tiny-deepseek-v3", "step")
    base_before = {k: v.clone() for k, v in session.base.base_state.items()}
    adapter_before = session.base.adapter_state(session.run_id)
    _train(session, steps=1)
    assert all(torch.equal(base_before[k], v) for k, v in session.base.base_state.items())  # routers included
    adapter_after = session.base.adapter_state(session.run_id)
    changed = [k for k in adapter_before if not torch.equal(adapter_before[k], adapter_after[k])]
    assert any(".experts." in k for k in changed) and any("shared_experts" in k for k in changed)


def test_sampled_and_prompt_logprobs_equal_training_logprobs(trained: TrainingSession) -> None:
    weights = fp32_sampling_weights(trained)
    assert isinstance(weights.decoder, GeneralModel)
    with SamplerEngine() as engine:
        response = engine.submit(weights, _Tokenizer(), types.ModelInput.from_ints(PROMPT), 2,
                                 types.SamplingParams(max_tokens=10, seed=5), include_prompt_logprobs=True).result()
    expected_prompt = _logprobs(trained, PROMPT)
    assert response.prompt_logprobs is not None and response.prompt_logprobs[0] is None
    assert (torch.tensor(response.prompt_logprobs[1:]) - expected_prompt).abs().max() < TOLERANCE
    for sequence in response.sequences:
        full = _logprobs(trained, PROMPT + sequence.tokens)
        assert (torch.tensor(sequence.logprobs) - full[len(PROMPT) - 1:]).abs().max() < TOLERANCE


def test_greedy_and_seeded_samples_do_not_depend_on_batch_neighbours(trained: TrainingSession) -> None:
    weights = fp32_sampling_weights(trained)
    prompt = types.ModelInput.from_ints(PROMPT)
    seeded = types.SamplingParams(max_tokens=6, seed=11, temperature=1.0)
    with SamplerEngine() as engine:
        alone = engine.submit(weights, _Tokenizer(), prompt, 1, seeded).result().sequences[0].tokens
        other = engine.submit(weights, _Tokenizer(), types.ModelInput.from_ints(PROMPT[:5]), 3, seeded)
        again = engine.submit(weights, _Tokenizer(), prompt, 1, seeded)
        assert again.result().sequences[0].tokens == alone
        assert len(other.result().sequences) == 3
        greedy = engine.submit(weights, _Tokenizer(), prompt, 1, types.SamplingParams(max_tokens=4, temperature=0))
        tokens = greedy.result().sequences[0].tokens
    logprobs = _logprobs(trained, PROMPT + tokens)
    assert tokens and torch.isfinite(logprobs).all()


def test_stops_end_sequences_and_keep_the_stop_token(trained: TrainingSession) -> None:
    weights = fp32_sampling_weights(trained)
    with SamplerEngine() as engine:
        first = engine.submit(weights, _Tokenizer(), types.ModelInput.from_ints(PROMPT), 1,
                              types.SamplingParams(max_tokens=5, temperature=0)).result().sequences[0]
        stopped = engine.submit(weights, _Tokenizer(), types.ModelInput.from_ints(PROMPT), 1,
                                types.SamplingParams(max_tokens=5, temperature=0, stop=[first.tokens[1]])).result()
    assert first.stop_reason == "length"
    assert stopped.sequences[0].tokens == first.tokens[:2] and stopped.sequences[0].stop_reason == "stop"


def test_save_and_load_round_trip(trained: TrainingSession, tmp_path: Path) -> None:
    trained.write_state(tmp_path)
    config = files.read_json(tmp_path / files.ADAPTER_CONFIG_FILE, "config")
    assert config["peft_type"] == "LORA" and config["target_parameters"]
    fresh = TrainingSession("loaded", trained.base, trained.lora)
    fresh.load_state(tmp_path, with_optimizer=True, source="test")
    assert torch.equal(_logprobs(fresh, PROMPT), _logprobs(trained, PROMPT))
    state, adapter_config = files.read_sampler_adapter(tmp_path, "test", trained.base.base_state, "tiny")
    weights = SamplingWeights.build(trained.base.config, trained.base.base_state, state, adapter_config, torch.float32)
    with SamplerEngine() as engine:
        response = engine.submit(weights, _Tokenizer(), types.ModelInput.from_ints(PROMPT), 1,
                                 types.SamplingParams(max_tokens=1), include_prompt_logprobs=True).result()
    assert response.prompt_logprobs is not None
    assert (torch.tensor(response.prompt_logprobs[1:]) - _logprobs(trained, PROMPT)).abs().max() < TOLERANCE
    trained.base.remove_adapter("loaded")


def test_a_short_supervised_run_lowers_the_loss() -> None:
    losses = _train(_session("tinker-cookbook/tiny-gpt-oss", "sl"), steps=8, lr=2e-2)
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize(("name", "prompt"), [
    ("tinker-cookbook/tiny-qwen3", PROMPT),
    ("tinker-cookbook/tiny-smollm2", [1, 20, 300, 4000, 5, 77, 9, 12, 13, 400, 2000, 31]),  # tied embeddings
])
def test_forced_general_path_on_a_dense_model_agrees_with_the_fast_path(
        monkeypatch: pytest.MonkeyPatch, name: str, prompt: list[int]) -> None:
    fast = _session(name, "fast")
    _train(fast, prompt=prompt)
    monkeypatch.setenv("TINKER_COOKBOOK_MODEL_PATH", "general")
    general = _session(name, "general")
    assert general.base.general and not fast.base.general
    general.base.load_adapter_state("general", fast.base.adapter_state("fast"))
    tokens = prompt + [3, 4, 5]
    assert (_logprobs(general, tokens) - _logprobs(fast, tokens)).abs().max() < TOLERANCE
    general_weights = fp32_sampling_weights(general)
    monkeypatch.delenv("TINKER_COOKBOOK_MODEL_PATH")
    fast_weights = fp32_sampling_weights(fast)
    assert isinstance(general_weights.decoder, GeneralModel) and not isinstance(fast_weights.decoder, GeneralModel)
    params = types.SamplingParams(max_tokens=8, seed=2)
    with SamplerEngine() as engine:
        a, b = (engine.submit(w, _Tokenizer(), types.ModelInput.from_ints(prompt), 2, params,
                              include_prompt_logprobs=True, topk_prompt_logprobs=3).result()
                for w in (general_weights, fast_weights))
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    for x, y in zip(a.sequences, b.sequences, strict=True):
        assert (torch.tensor(x.logprobs) - torch.tensor(y.logprobs)).abs().max() < TOLERANCE
    assert a.prompt_logprobs is not None and b.prompt_logprobs is not None
    assert (torch.tensor(a.prompt_logprobs[1:]) - torch.tensor(b.prompt_logprobs[1:])).abs().max() < TOLERANCE
    assert a.topk_prompt_logprobs is not None and b.topk_prompt_logprobs is not None
    assert [[i for i, _ in r or []] for r in a.topk_prompt_logprobs] == [[i for i, _ in r or []] for r in b.topk_prompt_logprobs]


def test_registry_lists_the_tiny_moe_models(capsys: pytest.CaptureFixture[str]) -> None:
    available = {spec.name for spec in models.available_models()}
    assert {*MOE_MODELS, "tinker-cookbook/tiny-qwen3-vl-moe"} <= available
    known = {spec.name for spec in models.known_models()}
    assert {"Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-VL-30B-A3B-Instruct"} <= known  # the latter with images: test_vision_moe
    model_paths._announced.discard("tinker-cookbook/tiny-qwen3-moe")
    _session("tinker-cookbook/tiny-qwen3-moe", "announce", train_mlp=False)
    assert capsys.readouterr().err.count("runs on the general transformers path") == 1


def test_model_path_setting_refuses_unknown_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_COOKBOOK_MODEL_PATH", "fastest")
    with pytest.raises(BadRequestError, match="TINKER_COOKBOOK_MODEL_PATH='fastest'.*auto.*general"):
        model_paths.is_general(models.load_model_config("tinker-cookbook/tiny-qwen3"))


class _Tokenizer:
    """Stops here are token ids only: a decoder of token ids is all finish_reason needs."""

    def decode(self, tokens: list[int], **kwargs: Any) -> str:
        return " ".join(map(str, tokens))
