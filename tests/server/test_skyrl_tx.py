"""Optional: this project's remote backend against a live SkyRL-tx server (``docs/scaling.md`` says how to start
one). Skipped unless SkyRL is installed and ``TINKER_COOKBOOK_SKYRL_URL`` names a running server (its base model in
``TINKER_COOKBOOK_SKYRL_MODEL``, default Qwen/Qwen3-0.6B)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("skyrl", reason="SkyRL is not installed (pip install 'skyrl[tinker]==0.4.0', Python >= 3.12)")
URL = os.environ.get("TINKER_COOKBOOK_SKYRL_URL")
if not URL:
    pytest.skip("set TINKER_COOKBOOK_SKYRL_URL to a running SkyRL-tx server", allow_module_level=True)

from tinker_cookbook import tinker  # noqa: E402
from tinker_cookbook.tinker import errors, types  # noqa: E402

MODEL = os.environ.get("TINKER_COOKBOOK_SKYRL_MODEL", "Qwen/Qwen3-0.6B")
TIMEOUT_S = 600
DATA = [types.Datum(model_input=types.ModelInput.from_ints([1, 5, 9, 14, 3]),
                    loss_fn_inputs={"target_tokens": [5, 9, 14, 3, 8], "weights": [1.0] * 5})]


def test_train_sample_and_resume_on_skyrl_tx() -> None:
    assert URL is not None
    service = tinker.ServiceClient(base_url=URL)
    client = service.create_lora_training_client(MODEL, rank=8, seed=0)
    client.forward_backward(DATA, "cross_entropy").result(timeout=TIMEOUT_S)
    client.optim_step(types.AdamParams(learning_rate=1e-4)).result(timeout=TIMEOUT_S)
    sampler = client.save_weights_and_get_sampling_client()
    try:
        answer = sampler.sample(types.ModelInput.from_ints([1, 5]), 1,
                                types.SamplingParams(max_tokens=2, temperature=0.0)).result(timeout=TIMEOUT_S)
        assert len(answer.sequences[0].tokens) == 2  # a server that sends sample sequence ids
    except errors.APIResponseValidationError as exc:
        assert "sample_sequence_ids" in str(exc) and "tinker<=0.25.0" in str(exc)
    path = client.save_state("skyrl-resume").result(timeout=TIMEOUT_S).path
    resumed = service.create_training_client_from_state_with_optimizer(path)
    assert resumed.forward(DATA, "cross_entropy").result(timeout=TIMEOUT_S).loss_fn_outputs
