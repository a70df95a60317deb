"""Tests of the model registry: resolution, tiny-model determinism, the HF cache, the atomic GGUF cache."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tinker_cookbook.base import assets, hub
from tinker_cookbook.engine import gguf_convert, model_paths, models
from tinker_cookbook.engine.models import ModelSpec
from tinker_cookbook.tinker.errors import NotFoundError, UnprocessableEntityError

TINY = {
    "tinker-cookbook/tiny-qwen3": 151936,
    "tinker-cookbook/tiny-llama3": 128256,
    "tinker-cookbook/tiny-smollm2": 49152,
    "tinker-cookbook/tiny-qwen3-vl": 151936,
    "tinker-cookbook/tiny-qwen3-moe": 151936,
    "tinker-cookbook/tiny-gpt-oss": 151936,
    "tinker-cookbook/tiny-deepseek-v3": 151936,
    "tinker-cookbook/tiny-qwen3-vl-moe": 151936,
}


@pytest.fixture(autouse=True)
def offline_empty_hf_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No hub and an empty HF cache, so results do not depend on what this machine has downloaded."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def _checksum(model: torch.nn.Module) -> str:
    """A cheap exact fingerprint of all weights."""
    total = sum(p.double().abs().sum().item() for p in model.parameters())
    first = next(model.parameters()).flatten()[:4].tolist()
    return repr((round(total, 6), first))


# --- resolution and errors ---------------------------------------------------------------------------


def test_unknown_name_lists_loadable_models_and_how_to_add() -> None:
    with pytest.raises(NotFoundError) as info:
        models.get_model_spec("acme/does-not-exist")
    message = str(info.value)
    assert "'acme/does-not-exist'" in message
    for name in TINY:
        assert name in message
    assert "HF_HUB_OFFLINE=1" in message
    assert "requirements-assets.txt" in message and "register_model" in message
    with pytest.raises(NotFoundError):
        models.load_model("acme/does-not-exist")
    with pytest.raises(NotFoundError):
        models.load_model_config("acme/does-not-exist")


def test_known_hub_model_is_not_available_offline() -> None:
    known = {spec.name for spec in models.known_models()}
    available = {spec.name for spec in models.available_models()}
    assert "Qwen/Qwen3-8B" in known and "Qwen/Qwen3-8B" not in available
    assert available <= known
    with pytest.raises(NotFoundError, match="not in the local Hugging Face cache"):
        models.get_model_spec("Qwen/Qwen3-8B")


def test_offline_mode_never_probes_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(endpoint: str) -> bool:
        raise AssertionError(f"probed {endpoint} although HF_HUB_OFFLINE=1")

    monkeypatch.setattr(hub, "_answers", fail)
    assert not hub.hub_is_reachable()
    with pytest.raises(NotFoundError):
        models.get_model_spec("acme/does-not-exist")


def test_hub_probe_gives_up_quickly_on_an_unreachable_endpoint() -> None:
    started = time.perf_counter()
    # Port 9 (discard) on localhost refuses connections at once on ordinary machines.
    assert hub._answers("http://127.0.0.1:9") is False
    assert time.perf_counter() - started < hub._PROBE_TIMEOUT_S + 1.5


@pytest.mark.parametrize(
    ("env", "hub_off", "datasets_off"),
    [
        ({"HF_HUB_OFFLINE": "1"}, True, True),
        ({"HF_HUB_OFFLINE": "true"}, True, True),  # the libraries take 1/ON/YES/TRUE in any case
        ({"HF_HUB_OFFLINE": "0"}, False, False),
        ({"TRANSFORMERS_OFFLINE": "yes"}, True, True),
        ({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}, False, False),  # the first one set decides
        ({"HF_DATASETS_OFFLINE": "1"}, False, True),
        ({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "0"}, True, False),  # datasets' own switch decides there
    ],
)
def test_offline_switches_read_as_the_hub_libraries_do(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                         hub_off: bool, datasets_off: bool) -> None:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert hub.hub_offline() is hub_off
    assert hub.hub_offline(datasets=True) is datasets_off


def test_available_models_has_the_tiny_models() -> None:
    specs = {spec.name: spec for spec in models.available_models()}
    for name in TINY:
        assert specs[name].source == "tiny"
        assert specs[name].max_context_length == models.TINY_CONTEXT_LENGTH
    assert specs["tinker-cookbook/tiny-qwen3-vl"].arch == "qwen3_vl"
    assert specs["tinker-cookbook/tiny-llama3"].tokenizer_name == "tinker-cookbook/tiny-llama3"


def test_smollm2_listed_from_the_packaged_gguf() -> None:
    if assets.smollm2_gguf() is None:
        pytest.skip("offline assets not installed")
    spec = models.get_model_spec(models.SMOLLM2_NAME)
    assert (spec.source, spec.arch, spec.max_context_length) == ("gguf", "llama", 8192)
    assert spec in models.available_models()


# --- only architectures that load end to end ----------------------------------------------------------

MOE_LINEUP = [  # text mixture-of-experts models of the lineup: the general path runs them
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-30B-A3B-Base",
    "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "Qwen/Qwen3-235B-A22B-Instruct-2507",
]
VL_MOE_LINEUP = ["Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen/Qwen3-VL-235B-A22B-Instruct"]  # general path, with images
# A vision-language model of another family: its text part is no causal LM of transformers, and the engine runs
# images for Qwen3-VL only, so it is refused.
OTHER_VL: dict[str, object] = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"}


def _no_downloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the hub is reachable, and fail on any download of a config or of weights."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"tried to download or load {args}")

    monkeypatch.setattr(hub, "hub_is_reachable", lambda: True)
    monkeypatch.setattr(models, "_hub_spec", refuse)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(AutoModelForImageTextToText, "from_pretrained", refuse)


def test_registry_supports_exactly_what_loads_end_to_end() -> None:
    supported = models.supported_model_types()
    assert {"llama", "qwen2", "qwen3", "qwen3_vl", "qwen3_moe", "gpt_oss", "deepseek_v3", "qwen3_vl_moe"} <= set(
        supported)
    assert "llava" not in supported
    known = {spec.name for spec in models.known_models()}
    assert set(MOE_LINEUP) <= known and set(VL_MOE_LINEUP) <= known
    for spec in models.available_models():
        config = models.load_model_config(spec.name)
        assert config.model_type in supported, spec.name


@pytest.mark.parametrize("name", VL_MOE_LINEUP)
def test_vision_moe_lineup_models_are_vision_language_models_of_the_general_path(name: str) -> None:
    spec = next(spec for spec in models.known_models() if spec.name == name)
    assert spec.arch == "qwen3_vl" and spec.source == "hf"
    assert model_paths.is_general(models.load_model_config("tinker-cookbook/tiny-qwen3-vl-moe"))


def _put_config_in_hf_cache(cache: Path, repo_id: str, config: dict[str, object]) -> None:
    snapshot = cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "model.safetensors").write_bytes(b"")  # never read: the architecture is refused first
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0" * 40)


def test_cached_model_of_an_unsupported_architecture_is_not_offered(
    offline_empty_hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other: dict[str, object] = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"}  # not a causal LM
    _put_config_in_hf_cache(offline_empty_hf_cache, "acme/vl-other", OTHER_VL)
    _put_config_in_hf_cache(offline_empty_hf_cache, "acme/t5-ish", other)
    listed = {spec.name for spec in models.available_models()} | {spec.name for spec in models.known_models()}
    assert "acme/vl-other" not in listed and "acme/t5-ish" not in listed
    _no_downloads(monkeypatch)
    with pytest.raises(UnprocessableEntityError, match="model_type='llava'.*not a text causal LM.*Qwen3-VL"):
        models.load_model("acme/vl-other")
    with pytest.raises(UnprocessableEntityError, match="model_type='t5'"):
        models.get_model_spec("acme/t5-ish")


def test_hub_model_of_an_unsupported_architecture_fails_before_its_weights(
    offline_empty_hf_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub model outside the catalog: only its config.json is fetched, then it is refused."""
    import huggingface_hub
    from transformers import AutoModelForCausalLM

    config_file = offline_empty_hf_cache / "config.json"
    config_file.write_text(json.dumps(OTHER_VL))
    fetched: list[str] = []

    def fetch_config(repo_id: str, filename: str, **kwargs: object) -> str:
        fetched.append(filename)
        return str(config_file)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("tried to download weights")

    monkeypatch.setattr(hub, "hub_is_reachable", lambda: True)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fetch_config)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    with pytest.raises(UnprocessableEntityError, match="acme/new-vl.*not a text causal LM"):
        models.load_model("acme/new-vl")
    assert set(fetched) == {"config.json"}


@pytest.mark.parametrize("name", list(TINY))
def test_every_listed_tiny_model_trains_and_samples(name: str) -> None:
    """What the registry offers loads end to end: a training step, then sampling from the trained adapter."""
    from tinker_cookbook import tinker
    from tinker_cookbook.tinker import types

    service = tinker.ServiceClient()
    assert name in {m.model_name for m in service.get_server_capabilities().supported_models}
    with service.create_lora_training_client(base_model=name, rank=2, seed=0) as tc:
        tokens = list(range(100, 110))
        datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 9})
        tc.forward_backward([datum], "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-2))
        sampler = tc.save_weights_and_get_sampling_client()
    response = sampler.sample(types.ModelInput.from_ints(tokens), 1, types.SamplingParams(max_tokens=3)).result()
    assert len(response.sequences[0].tokens) >= 1


# --- tiny models ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_model_forward_frozen_and_not_uniform(name: str) -> None:
    model = models.load_model(name)
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    input_ids = torch.tensor([[1, 20, 300, 4000, 5]])
    logits = model(input_ids=input_ids).logits
    assert logits.shape == (1, 5, TINY[name])
    assert torch.isfinite(logits).all()
    # Random init must still give position- and token-dependent outputs, not a constant distribution.
    assert logits.std().item() > 0.05
    assert not torch.allclose(logits[0, 0], logits[0, -1])
    config = models.load_model_config(name)
    assert config.to_dict() == model.config.to_dict()


def test_tiny_model_deterministic_and_rng_untouched() -> None:
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    first = models.load_model("tinker-cookbook/tiny-qwen3").state_dict()
    second = models.load_model("tinker-cookbook/tiny-qwen3").state_dict()
    assert torch.equal(torch.get_rng_state(), state)
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


def test_tiny_model_loads_are_fresh_instances() -> None:
    first = models.load_model("tinker-cookbook/tiny-smollm2")
    second = models.load_model("tinker-cookbook/tiny-smollm2")
    with torch.no_grad():
        first.model.embed_tokens.weight.add_(1.0)
    assert not torch.equal(first.model.embed_tokens.weight, second.model.embed_tokens.weight)


def test_tiny_model_same_weights_in_another_process() -> None:
    name = "tinker-cookbook/tiny-smollm2"
    code = (
        "import torch\n"
        "from tinker_cookbook.engine import models\n"
        "torch.manual_seed(99)\n"  # a different global seed must not matter
        f"m = models.load_model({name!r})\n"
        "total = sum(p.double().abs().sum().item() for p in m.parameters())\n"
        "print(repr((round(total, 6), next(m.parameters()).flatten()[:4].tolist())))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == _checksum(models.load_model(name))


def test_tiny_model_in_bf16_is_the_fp32_model_rounded() -> None:
    fp32 = models.load_model("tinker-cookbook/tiny-llama3")
    bf16 = models.load_model("tinker-cookbook/tiny-llama3", dtype=torch.bfloat16)
    for (key, a), b in zip(fp32.state_dict().items(), bf16.state_dict().values(), strict=True):
        assert b.dtype == torch.bfloat16, key
        assert torch.equal(a.to(torch.bfloat16), b), key


@pytest.mark.parametrize("name", list(TINY))
def test_tiny_model_pairs_with_its_real_tokenizer(name: str) -> None:
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    tokenizer = get_tokenizer(models.get_model_spec(name).tokenizer_name)
    text_config = models.load_model_config(name).get_text_config()
    assert tokenizer.eos_token_id == text_config.eos_token_id
    ids = tokenizer.encode("Hello, world! Ünïcödé 123")
    assert ids and max(ids) < text_config.vocab_size


def test_tiny_smollm2_matches_smollm2_token_layout() -> None:
    config = models.load_model_config("tinker-cookbook/tiny-smollm2")
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 2)
    model = models.load_model("tinker-cookbook/tiny-smollm2")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


# --- custom models ------------------------------------------------------------------------------------


def test_register_model_resolves_first_and_unregisters() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    dtypes: list[torch.dtype] = []

    def build(dtype: torch.dtype) -> LlamaForCausalLM:
        dtypes.append(dtype)
        config = LlamaConfig(
            vocab_size=100,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
        )
        return LlamaForCausalLM(config).to(dtype)

    spec = ModelSpec(
        name="acme/custom",
        arch="llama",
        tokenizer_name="meta-llama/Llama-3.2-1B",
        max_context_length=512,
        source="tiny",
        description="test model",
    )
    models.register_model(spec, build)
    try:
        assert models.get_model_spec("acme/custom") == spec
        assert spec in models.available_models() and spec in models.known_models()
        model = models.load_model("acme/custom", dtype=torch.bfloat16)
        assert dtypes == [torch.bfloat16] and next(model.parameters()).dtype == torch.bfloat16
        assert not model.training and not any(p.requires_grad for p in model.parameters())
        assert models.load_model_config("acme/custom").vocab_size == 100
    finally:
        models.unregister_model("acme/custom")
    with pytest.raises(NotFoundError):
        models.get_model_spec("acme/custom")
    with pytest.raises(TypeError, match="build must be callable"):
        models.register_model(spec, "not a function")  # type: ignore[arg-type]


# --- local Hugging Face cache -----------------------------------------------------------------------------


def _put_in_hf_cache(cache: Path, repo_id: str, model: torch.nn.Module) -> None:
    """Lay out a saved model the way the hub cache does (refs/main → snapshots/<revision>/)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    model.save_pretrained(repo / "snapshots" / ("0" * 40))


def test_models_in_the_local_hf_cache_are_listed_and_load(offline_empty_hf_cache: Path) -> None:
    tiny = models.load_model("tinker-cookbook/tiny-llama3")
    _put_in_hf_cache(offline_empty_hf_cache, "acme/llama-small", tiny)
    # A cached model that is not a language model must not be offered.
    not_lm = offline_empty_hf_cache / "models--acme--encoder" / "snapshots" / ("0" * 40)
    not_lm.mkdir(parents=True)
    (not_lm / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert"}))
    (not_lm / "model.safetensors").write_bytes(b"")
    (offline_empty_hf_cache / "models--acme--encoder" / "refs").mkdir()
    (offline_empty_hf_cache / "models--acme--encoder" / "refs" / "main").write_text("0" * 40)

    specs = {spec.name: spec for spec in models.available_models()}
    assert "acme/encoder" not in specs
    spec = specs["acme/llama-small"]
    assert (spec.arch, spec.source, spec.tokenizer_name) == ("llama", "hf", "acme/llama-small")
    assert spec.max_context_length == models.TINY_CONTEXT_LENGTH
    loaded = models.load_model("acme/llama-small")
    assert _checksum(loaded) == _checksum(tiny)
    assert not any(p.requires_grad for p in loaded.parameters())
    assert models.load_model_config("acme/llama-small").vocab_size == 128256
    with pytest.raises(NotFoundError, match="not as a causal LM"):
        models.get_model_spec("acme/encoder")


# --- atomic conversion cache ------------------------------------------------------------------------------


def _leftovers(parent: Path, final: Path) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(f".{final.name}.tmp-")]


def test_failed_write_leaves_no_cache_and_next_build_succeeds(tmp_path: Path) -> None:
    final = tmp_path / "models" / "M"

    def crash(out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half a file")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        gguf_convert.build_atomically(final, crash)
    assert not final.exists() and not _leftovers(final.parent, final)

    calls = []
    gguf_convert.build_atomically(final, lambda out: calls.append((out / "weights").write_text("ok")))
    assert gguf_convert.is_complete(final) and (final / "weights").read_text() == "ok"
    gguf_convert.build_atomically(final, lambda out: calls.append("again"))
    assert len(calls) == 1, "a complete cache must not be rebuilt"


def test_leftovers_of_a_killed_process_are_cleaned(tmp_path: Path) -> None:
    final = tmp_path / "M"
    stale_temp = tmp_path / ".M.tmp-dead"
    stale_temp.mkdir()
    final.mkdir()  # no completion marker: e.g. copied by hand, never finished
    (final / "model.safetensors").write_bytes(b"partial")
    gguf_convert.build_atomically(final, lambda out: (out / "weights").write_text("ok"))
    assert not stale_temp.exists()
    assert sorted(p.name for p in final.iterdir()) == [gguf_convert.COMPLETE_MARKER, "weights"]


def test_concurrent_builds_write_once(tmp_path: Path) -> None:
    final = tmp_path / "M"
    calls = []

    def slow_write(out: Path) -> None:
        calls.append(out)
        time.sleep(0.2)
        (out / "weights").write_text("ok")

    threads = [
        threading.Thread(target=gguf_convert.build_atomically, args=(final, slow_write)) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert gguf_convert.is_complete(final) and not _leftovers(tmp_path, final)


def test_smollm2_gguf_path_converts_once_atomically(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The GGUF route end to end, with a fast stand-in for the 20 s dequantization."""
    monkeypatch.setenv("TINKER_COOKBOOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(assets, "smollm2_gguf", lambda: tmp_path / "fake.gguf")
    stand_in = models.load_model("tinker-cookbook/tiny-smollm2")
    conversions: list[Path] = []

    def failing_convert(gguf: Path, out: Path) -> None:
        stand_in.save_pretrained(out)
        raise KeyboardInterrupt  # the user pressed Ctrl-C during the conversion

    def convert(gguf: Path, out: Path) -> None:
        assert gguf == tmp_path / "fake.gguf"
        conversions.append(out)
        stand_in.save_pretrained(out)

    monkeypatch.setattr(gguf_convert, "convert_gguf_model", failing_convert)
    with pytest.raises(KeyboardInterrupt):
        models.load_model(models.SMOLLM2_NAME)
    target = models.converted_smollm2_dir()
    assert not target.exists() and not _leftovers(target.parent, target)

    monkeypatch.setattr(gguf_convert, "convert_gguf_model", convert)
    first = models.load_model(models.SMOLLM2_NAME)
    second = models.load_model(models.SMOLLM2_NAME)
    assert len(conversions) == 1 and gguf_convert.is_complete(target)
    assert _checksum(first) == _checksum(second) == _checksum(stand_in)
    assert not first.training and not any(p.requires_grad for p in first.parameters())
    assert models.load_model_config(models.SMOLLM2_NAME).vocab_size == 49152


def test_smollm2_without_any_copy_is_not_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TINKER_COOKBOOK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(assets, "smollm2_gguf", lambda: None)
    assert models.SMOLLM2_NAME not in {spec.name for spec in models.available_models()}
    with pytest.raises(NotFoundError, match="packaged GGUF is not installed"):
        models.get_model_spec(models.SMOLLM2_NAME)


@pytest.mark.slow
def test_real_smollm2_from_gguf_knows_the_capital_of_france() -> None:
    """Converts the packaged GGUF on first use (about 20 s), then loads the cache (about 2 s)."""
    if assets.smollm2_gguf() is None:
        pytest.skip("offline assets not installed")
    from tinker_cookbook.base.tokenizers import get_tokenizer

    model = models.load_model(models.SMOLLM2_NAME)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    tokenizer = get_tokenizer(models.SMOLLM2_NAME)
    input_ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    output = model.generate(input_ids, max_new_tokens=4, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, input_ids.shape[1] :])
