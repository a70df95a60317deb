"""Bad input is the user's mistake: BadRequestError naming the field, the value and the fix. An engine failure is
not: InternalServerError with the cause chained. Each case goes through the public API on the tiny model."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tinker_cookbook import tinker
from tinker_cookbook.engine.training import forward
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, InternalServerError

MODEL = "tinker-cookbook/tiny-smollm2"
VOCAB = 49152
HUGE = 2**70  # does not fit in int64


@pytest.fixture(scope="module")
def service() -> tinker.ServiceClient:
    return tinker.ServiceClient()


@pytest.fixture(scope="module")
def tc(service: tinker.ServiceClient) -> tinker.TrainingClient:
    return service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)


def _datum(tokens: list[int], targets: Any = None, weights: Any = None) -> types.Datum:
    n = len(tokens)
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": targets if targets is not None else [7] * n,
                                       "weights": weights if weights is not None else [1.0] * n})


GOOD = _datum([5, 6, 7])


def _with_model_input(value: Any) -> types.Datum:
    datum = GOOD.model_copy()
    datum.model_input = value  # assignment is not validated by pydantic: the engine must check
    return datum


def _loss(data: list[types.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    return -torch.cat(logprobs).sum(), {}


# (request, the field the message must name, more of the message: the value and the fix)
TRAINING_CASES: dict[str, tuple[Callable[[tinker.TrainingClient], Any], str, str]] = {
    "single Datum": (lambda c: c.forward_backward(GOOD, "cross_entropy"), "data is a Datum",
                     r"not a list of types\.Datum; wrap a single datum in a list: \[datum\]"),
    "data is a string": (lambda c: c.forward_backward("abc", "cross_entropy"), "data is a str", "'abc'"),
    "data is None": (lambda c: c.forward(None, "cross_entropy"), "data is a NoneType", "list of types.Datum"),
    "dict in data": (lambda c: c.forward_backward([GOOD.model_dump()], "cross_entropy"), r"data\[0\] is a dict",
                     r"types\.Datum\(\*\*that_dict\)"),
    "string in data": (lambda c: c.forward_backward([GOOD, "abc"], "cross_entropy"), r"data\[1\] is a str",
                       "'abc'.*not a types.Datum"),
    "custom: dict in data": (lambda c: c.forward_backward_custom([{"a": 1}], _loss), r"data\[0\] is a dict", ""),
    "model_input not a ModelInput": (lambda c: c.forward_backward([_with_model_input([5, 6])], "cross_entropy"),
                                     r"data\[0\]\.model_input is a list", "ModelInput.from_ints"),
    "loss_fn_config string": (lambda c: c.forward_backward([GOOD], "cross_entropy", "abc"),
                              "loss_fn_config='abc'", "is a str, not a dict; pass None"),
    "loss_fn None": (lambda c: c.forward_backward([GOOD], None), "loss_fn=None", "choose one of"),
    "custom loss not callable": (lambda c: c.forward_backward_custom([GOOD], "mse"), "loss_fn='mse'",
                                 "is not callable; pass a function"),
    "custom loss returns a float": (lambda c: c.forward_backward_custom([GOOD], lambda d, lp: 1.0),
                                    "custom loss_fn must return", "got 1.0"),
    "token id 2**70": (lambda c: c.forward_backward([_datum([5, HUGE, 7])], "cross_entropy"),
                       r"data\[0\]\.model_input holds token id 1180591620717411303424",
                       rf"outside the vocabulary \[0, {VOCAB}\); encode the text with this model's tokenizer"),
    "negative token id": (lambda c: c.forward([_datum([5, -1, 7])], "cross_entropy"),
                          r"data\[0\]\.model_input holds token id -1", "outside the vocabulary"),
    "token id = vocab size": (lambda c: c.forward([_datum([VOCAB, 1, 2])], "cross_entropy"),
                              rf"model_input holds token id {VOCAB}", "outside"),
    "target id 2**70": (lambda c: c.forward_backward([_datum([5, 6, 7], targets=[1, HUGE, 2])], "cross_entropy"),
                        r"data\[0\]\.loss_fn_inputs\['target_tokens'\] holds id 1180591620717411303424",
                        "outside the vocabulary"),
    "weight beyond float32": (lambda c: c.forward_backward([_datum([5, 6, 7], weights=[1.0, 1e300, 1.0])],
                                                           "cross_entropy"),
                              r"data\[0\]\.loss_fn_inputs\['weights'\] holds NaN or inf", "must be finite"),
    "optim_step(None)": (lambda c: c.optim_step(None), "adam_params=None", r"types\.AdamParams\(learning_rate="),
    "optim_step(dict)": (lambda c: c.optim_step({"learning_rate": 1e-4}), r"adam_params=\{'learning_rate'",
                         r"is a dict, not a types\.AdamParams.*types\.AdamParams\(\*\*d\)"),
    "optim_step string field": (lambda c: c.optim_step(types.AdamParams.model_construct(learning_rate="fast")),
                                "AdamParams.learning_rate='fast'", "must be a finite number >= 0"),
    "load_state(None)": (lambda c: c.load_state(None), "checkpoint path", "got None"),
}


@pytest.mark.parametrize("case", list(TRAINING_CASES))
def test_bad_training_input_is_a_bad_request(tc: tinker.TrainingClient, case: str) -> None:
    request, field, rest = TRAINING_CASES[case]
    with pytest.raises(BadRequestError, match=field) as info:
        request(tc).result()
    assert re.search(rest, str(info.value)), str(info.value)
    assert not isinstance(info.value, InternalServerError)


SERVICE_CASES: dict[str, tuple[Callable[[tinker.ServiceClient], Any], str, str]] = {
    "base_model None": (lambda s: s.create_lora_training_client(base_model=None), "base_model=None",
                        "is not a model name; pass one of get_server_capabilities"),
    "base_model number": (lambda s: s.create_lora_training_client(base_model=3), "base_model=3", "model name"),
    "rank not an int": (lambda s: s.create_lora_training_client(base_model=MODEL, rank="abc"), "rank='abc'",
                        "rank and seed are integers"),
    "sampling base_model number": (lambda s: s.create_sampling_client(base_model=3), "base_model=3", "model name"),
}


@pytest.mark.parametrize("case", list(SERVICE_CASES))
def test_bad_service_input_is_a_bad_request(service: tinker.ServiceClient, case: str) -> None:
    request, field, rest = SERVICE_CASES[case]
    with pytest.raises(BadRequestError, match=field) as info:
        request(service)
    assert re.search(rest, str(info.value)), str(info.value)


def test_bad_sample_input_is_a_bad_request(service: tinker.ServiceClient) -> None:
    sc = service.create_sampling_client(base_model=MODEL)
    params = types.SamplingParams(max_tokens=2)
    with pytest.raises(BadRequestError, match="prompt holds token id 1180591620717411303424, outside"):
        sc.sample(types.ModelInput.from_ints([1, HUGE]), 1, params).result()
    with pytest.raises(BadRequestError, match="prompt must be a types.ModelInput, got str"):
        sc.sample("hello", 1, params).result()
    with pytest.raises(BadRequestError, match="num_samples=100000 is more than the limit"):
        sc.sample(types.ModelInput.from_ints([1, 2]), 100000, params).result()


def _damage_json(path: Any) -> None:
    path.write_text("{not json")


def _damage_tensors(path: Any) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _wrong_shape(path: Any) -> None:
    import safetensors.torch

    state = safetensors.torch.load_file(str(path))
    key = min(k for k in state if "lora_A" in k)
    state[key] = torch.zeros(state[key].shape[0], state[key].shape[1] + 1)
    safetensors.torch.save_file(state, str(path))


def _rank_string(path: Any) -> None:
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "r": "four"}))


@pytest.mark.parametrize("file, damage, message", [
    ("adapter_model.safetensors", _damage_tensors, "adapter_model.safetensors is not a readable safetensors file"),
    ("adapter_model.safetensors", _wrong_shape, "adapter_model.safetensors: tensor .* has shape .* does not fit rank 4"),
    ("adapter_config.json", _damage_json, "adapter_config.json is not valid JSON"),
    ("adapter_config.json", _rank_string, "adapter_config.json has r='four'"),
])
def test_corrupt_sampler_checkpoint_names_its_file(tc: tinker.TrainingClient, service: tinker.ServiceClient,
                                                    file: str, damage: Callable[[Any], None], message: str) -> None:
    path = tc.save_weights_for_sampler(f"corrupt-{damage.__name__.strip('_')}").result().path
    directory = tc._backend.store.checkpoint_dir(path)
    damage(directory / file)
    with pytest.raises(BadRequestError, match=f"^{path}/{message}") as info:
        service.create_sampling_client(model_path=path)
    assert str(directory) not in str(info.value)  # the tinker:// path, not where this machine keeps it


@pytest.mark.parametrize("error", [KeyError("adapter"), ValueError("bad shape"), TypeError("unsupported operand")])
def test_engine_bug_is_an_internal_error_with_its_cause(tc: tinker.TrainingClient, monkeypatch: pytest.MonkeyPatch,
                                                        error: Exception) -> None:
    """A stray ValueError/KeyError/TypeError inside the engine is not relabelled as the user's mistake."""
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(forward, "run_batch", broken)
    with pytest.raises(InternalServerError, match=f"the engine failed: {type(error).__name__}") as info:
        tc.forward_backward([GOOD], "cross_entropy").result()
    assert not isinstance(info.value, BadRequestError)
    assert info.value.__cause__ is error
