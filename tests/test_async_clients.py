"""The ``_async`` client methods keep the event loop running while the engine does blocking work.

Each test holds the engine-side work (merging sampling weights, adding an adapter, reading the registry) at a
gate that only a coroutine running on the event loop can open. A method that blocks the loop cannot let that
coroutine run, so the gate times out and the test fails; a method that waits in a thread or on the engine's
future lets it run at once. Nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from tinker_cookbook import tinker
from tinker_cookbook.engine import models
from tinker_cookbook.engine.sampling.weights import SamplingWeights
from tinker_cookbook.engine.training.session import BaseModel
from tinker_cookbook.tinker import types

MODEL = "tinker-cookbook/tiny-smollm2"
# How long the gated engine work waits for the event loop: only reached when the loop is blocked.
_BLOCKED_LOOP_LIMIT_S = 10.0

T = TypeVar("T")


class _LoopGate:
    """Holds a blocking engine function until a coroutine on the event loop opens the gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.opened_by_loop: list[bool] = []

    def wrap(self, fn: Callable[..., T]) -> Callable[..., T]:
        def gated(*args: Any, **kwargs: Any) -> T:
            self.entered.set()
            self.opened_by_loop.append(self.opened.wait(timeout=_BLOCKED_LOOP_LIMIT_S))
            return fn(*args, **kwargs)

        return gated

    async def _open_from_the_loop(self) -> None:
        while not self.entered.is_set():
            await asyncio.sleep(0.01)
        self.opened.set()

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        opener = asyncio.create_task(self._open_from_the_loop())
        try:
            result = await call()
        finally:
            opener.cancel()
        assert self.entered.is_set(), "the gated engine function was never called: the test gates the wrong thing"
        assert self.opened_by_loop[0], "the event loop was blocked while the engine worked"
        return result


@pytest.fixture(scope="module")
def service() -> tinker.ServiceClient:
    return tinker.ServiceClient()


@pytest.fixture(scope="module")
def training_client(service: tinker.ServiceClient) -> tinker.TrainingClient:
    return service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)


@pytest.fixture(scope="module")
def checkpoints(training_client: tinker.TrainingClient) -> dict[str, str]:
    return {
        "sampler": training_client.save_weights_for_sampler("async-sampler").result().path,
        "state": training_client.save_state("async-state").result().path,
    }


@pytest.fixture
def weights_gate(monkeypatch: pytest.MonkeyPatch) -> _LoopGate:
    """Gate the merge of sampling weights (runs on the engine thread for every kind of sampling client)."""
    gate = _LoopGate()
    monkeypatch.setattr(SamplingWeights, "build", staticmethod(gate.wrap(SamplingWeights.build)))
    return gate


@pytest.fixture
def adapter_gate(monkeypatch: pytest.MonkeyPatch) -> _LoopGate:
    """Gate adding a LoRA adapter to the base model (runs on the engine thread for every new training client)."""
    gate = _LoopGate()
    monkeypatch.setattr(BaseModel, "add_adapter", gate.wrap(BaseModel.add_adapter))
    return gate


def test_service_create_sampling_client_async_from_base(service, weights_gate):
    sampler = asyncio.run(weights_gate.run(lambda: service.create_sampling_client_async(base_model=MODEL)))
    assert sampler.get_base_model() == MODEL


def test_service_create_sampling_client_async_from_path(service, checkpoints, weights_gate):
    sampler = asyncio.run(weights_gate.run(
        lambda: service.create_sampling_client_async(model_path=checkpoints["sampler"])))
    assert sampler.model_path == checkpoints["sampler"]


def test_training_create_sampling_client_async(training_client, checkpoints, weights_gate):
    sampler = asyncio.run(weights_gate.run(
        lambda: training_client.create_sampling_client_async(checkpoints["sampler"])))
    assert sampler.model_path == checkpoints["sampler"]


def test_save_weights_and_get_sampling_client_async(training_client, weights_gate):
    sampler = asyncio.run(weights_gate.run(training_client.save_weights_and_get_sampling_client_async))
    prompt = types.ModelInput.from_ints([1, 2, 3])
    assert sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result().sequences


def test_create_lora_training_client_async(service, adapter_gate):
    tc = asyncio.run(adapter_gate.run(
        lambda: service.create_lora_training_client_async(base_model=MODEL, rank=4, seed=1)))
    tc.close()


@pytest.mark.parametrize("with_optimizer", [False, True])
def test_create_training_client_from_state_async(service, checkpoints, adapter_gate, with_optimizer):
    create = (service.create_training_client_from_state_with_optimizer_async if with_optimizer
              else service.create_training_client_from_state_async)
    tc = asyncio.run(adapter_gate.run(lambda: create(checkpoints["state"])))
    assert tc.get_info().model_name == MODEL
    tc.close()


def test_registry_lookups_async(service, training_client, monkeypatch):
    gate = _LoopGate()
    monkeypatch.setattr(models, "available_models", gate.wrap(models.available_models))
    capabilities = asyncio.run(gate.run(service.get_server_capabilities_async))
    assert MODEL in {m.model_name for m in capabilities.supported_models}

    gate = _LoopGate()
    monkeypatch.setattr(models, "get_model_spec", gate.wrap(models.get_model_spec))
    assert asyncio.run(gate.run(training_client.get_info_async)).model_name == MODEL


@pytest.mark.parametrize("save_every", [1, 0], ids=["from-checkpoint", "snapshot"])
def test_rl_next_sampler_keeps_rollouts_running(service, training_client, weights_gate, tmp_path: Path,
                                                save_every: int):
    """The RL loop's next sampler (checkpoint or snapshot) is built while rollouts keep running."""
    from tinker_cookbook.rl.train import RunContext
    from tinker_cookbook.run_core import Evaluators, Plan, Run

    cfg = SimpleNamespace(save_every=save_every, log_path=str(tmp_path), ttl_seconds=None)
    run = Run(config=cfg, plan=Plan(n_batches=5, total_steps=5, end_step=5, start_step=0),  # type: ignore[arg-type]
              ml_logger=None, service_client=service, training_client=training_client)  # type: ignore[arg-type]
    ctx = RunContext(cfg=cfg, run=run, dataset=None, evaluators=Evaluators(),  # type: ignore[arg-type]
                     reference_client=None, tokenizer=None)
    metrics: dict[str, float] = {}
    sampler, pending = asyncio.run(weights_gate.run(lambda: ctx.next_sampler(0, metrics)))
    assert (sampler.model_path is not None) == (save_every == 1) == (pending is not None)
    assert "time/save" in metrics
