"""``tinker_cookbook.tinker.ServiceClient(base_url=URL)``: this project's clients, through the official SDK, on a
Tinker-protocol server; and the recipes with ``base_url=...``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinker_cookbook import tinker
from tinker_cookbook.tinker import _remote, types

MODEL = "tinker-cookbook/tiny-smollm2"
REPO = Path(__file__).resolve().parents[2]
# Logprobs cross the wire as float32, which the engine also computes in: only rounding of the comparison remains.
FLOAT32_RTOL = 1e-6


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


DATA = [datum([1, 5, 9, 14, 3, 8]), datum([2, 7, 7, 30, 11])]


def test_a_url_selects_the_remote_backend_and_none_the_local_engine(server_url: str) -> None:
    assert isinstance(tinker.ServiceClient(base_url=server_url)._backend, _remote.RemoteBackend)
    assert not isinstance(tinker.ServiceClient()._backend, _remote.RemoteBackend)


def test_training_through_the_server_equals_training_in_process(server_url: str) -> None:
    """Same seed, same data, same steps: the remote client ends with the same logprobs as the local one."""
    results = []
    for base_url in (server_url, None):
        client = tinker.ServiceClient(base_url=base_url).create_lora_training_client(MODEL, rank=4, seed=11)
        for _ in range(2):
            client.forward_backward(DATA, "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=1e-2))
        results.append(client.forward(DATA[:1], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data)
        client.close()
    assert results[0] == pytest.approx(results[1], rel=FLOAT32_RTOL)


def test_custom_loss_sees_this_projects_datum_type(server_url: str) -> None:
    client = tinker.ServiceClient(base_url=server_url).create_lora_training_client(MODEL, rank=4, seed=4)
    seen = []

    def loss(data, logprobs):
        seen.extend(type(d) for d in data)
        total = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs))
        return total, {}

    out = client.forward_backward_custom(DATA, loss).result()
    assert seen == [types.Datum, types.Datum]
    assert len(out.loss_fn_outputs) == 2


def test_snapshots_checkpoints_and_rest_through_the_server(server_url: str) -> None:
    service = tinker.ServiceClient(base_url=server_url)
    client = service.create_lora_training_client(MODEL, rank=4, seed=6)
    client.forward_backward(DATA, "cross_entropy")
    client.optim_step(types.AdamParams(learning_rate=1e-2))
    named = client.save_weights_and_get_sampling_client("snap")
    assert named.model_path == f"tinker://{client.model_id}/sampler_weights/snap"
    prompt = types.ModelInput.from_ints([1, 5, 9])
    greedy = types.SamplingParams(max_tokens=4, temperature=0.0)
    first = named.sample(prompt, 1, greedy).result().sequences[0].tokens
    again = service.create_sampling_client(model_path=named.model_path).sample(prompt, 1, greedy).result()
    assert again.sequences[0].tokens == first  # the saved checkpoint holds the snapshot's weights

    rest = service.create_rest_client()
    paths = [c.tinker_path for c in rest.list_checkpoints(client.model_id).result().checkpoints]
    assert paths == [named.model_path]
    assert rest.get_weights_info_by_tinker_path(named.model_path).result().lora_rank == 4


def test_server_errors_keep_their_class(server_url: str) -> None:
    service = tinker.ServiceClient(base_url=server_url)
    client = service.create_lora_training_client(MODEL, rank=4)
    with pytest.raises(tinker.NotFoundError, match="run-missing"):
        client.load_state("tinker://run-missing/weights/x").result()
    with pytest.raises(tinker.BadRequestError, match="no_such_loss"):
        client.forward_backward(DATA, "no_such_loss").result()  # type: ignore[arg-type]
    with pytest.raises(tinker.NotFoundError):
        service.create_rest_client().get_training_run("run-missing").result()


def test_without_the_sdk_the_error_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tinker", None)  # what `import tinker` sees when the SDK is not installed
    with pytest.raises(tinker.BadRequestError, match=r"pip install 'tinker==0\.38\.0'"):
        tinker.ServiceClient(base_url="http://127.0.0.1:9")


def test_sl_basic_recipe_runs_through_the_sdk(server_url: str, tmp_path: Path) -> None:
    """The acceptance command, on the tiny model: ``python -m recipes.sl_basic base_url=... max_steps=2``."""
    env = {**os.environ, "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1",
           "TINKER_COOKBOOK_HOME": str(tmp_path / "client-home")}
    command = [sys.executable, "-m", "recipes.sl_basic", f"base_url={server_url}", f"model_name={MODEL}",
               "max_steps=2", "eval_every=0", f"log_path={tmp_path / 'log'}"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "training stopped at max_steps=2" in output
    assert "called from async context" not in output  # the SDK's warning when its futures block an event loop
    # The checkpoints were written by the server (in the test process's store), not by an engine in the recipe.
    assert not (tmp_path / "client-home" / "runs").exists()
    assert (tmp_path / "log" / "checkpoints.jsonl").exists()


def test_provenance_through_the_server(server_url: str) -> None:
    """Sequence ids come from the server; spans naming them cross the wire (as the SDK's span types) and train."""
    client = tinker.ServiceClient(base_url=server_url).create_lora_training_client(MODEL, rank=4, seed=6)
    sampler = client.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints([1, 5, 9, 14])
    sequence = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=3, seed=2)).result().sequences[0]
    assert sequence.sequence_id and sequence.sequence_id.startswith("seq-")
    tokens, sid = sequence.tokens, sequence.sequence_id
    traced = types.Datum(
        model_input=prompt.append(types.EncodedTextChunk(tokens=tokens[:-1])),
        loss_fn_inputs={"target_tokens": [0] * 3 + tokens, "logprobs": [0.0] * 3 + (sequence.logprobs or []),
                        "advantages": [0.0] * 3 + [0.5] * len(tokens)},
    ).with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=sid, length=4),
                     types.SampledProvenanceSpan(sequence_id=sid, length=len(tokens) - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sid, offset=1, length=3),
                        types.SampledProvenanceSpan(sequence_id=sid, length=len(tokens))])
    out = client.forward_backward([traced], "importance_sampling").result()
    assert len(out.loss_fn_outputs[0]["logprobs"].data) == traced.model_input.length
    client.close()


def test_a_remote_url_without_a_key_raises_a_typed_error_naming_url_and_key(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no key stored by `tinker auth login` either
    with pytest.raises(tinker.AuthenticationError, match=r"'https://tinker\.example\.invalid'.*no API key.*"
                                                         r"TINKER_API_KEY"):
        tinker.ServiceClient(base_url="https://tinker.example.invalid")


def test_an_untyped_sdk_error_becomes_one_of_ours() -> None:
    sdk = _remote.import_sdk()
    translated = _remote.translate_error(sdk.TinkerError("some option is wrong"))
    assert isinstance(translated, tinker.APIError) and "some option is wrong" in str(translated)
