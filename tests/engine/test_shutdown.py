"""Engine lifetime: clean process exit with requests in flight, closing the engine, releasing training clients."""

from __future__ import annotations

import concurrent.futures
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from tinker_cookbook import tinker
from tinker_cookbook.engine.backend import LocalBackend
from tinker_cookbook.tinker import types
from tinker_cookbook.tinker.errors import BadRequestError, RequestFailedError

MODEL = "tinker-cookbook/tiny-smollm2"
REPO_ROOT = Path(__file__).resolve().parents[2]
# Generous: a run takes seconds on an idle machine; this only bounds a hang.
_EXIT_RUN_LIMIT_S = 300

# Trains and samples, then exits while the sampler is still decoding long requests, a training request is
# queued and the training client is alive. Before the exit hooks, the sampler's daemon thread was inside a
# torch op when the interpreter finalized, and the process aborted with "terminate called without an active
# exception" (every run on a 2-core machine).
_EXIT_SCRIPT = textwrap.dedent(
    """
    from tinker_cookbook import tinker
    from tinker_cookbook.tinker import types

    service = tinker.ServiceClient()
    tc = service.create_lora_training_client(base_model={model!r}, rank=2, seed=0)
    tokens = list(range(100, 120))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={{"target_tokens": tokens[1:], "weights": [1.0] * 19}})
    tc.forward_backward([datum], "cross_entropy")
    sampler = tc.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints([1, 2, 3])
    unwaited = [sampler.sample(prompt, 4, types.SamplingParams(max_tokens=1500)) for _ in range(8)]
    sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
    tc.forward_backward([datum], "cross_entropy")  # queued, never waited for
    print("script finished")
    """
)


def test_scripts_exit_cleanly_with_requests_in_flight(tmp_path: Path) -> None:
    script = tmp_path / "train_and_exit.py"
    script.write_text(_EXIT_SCRIPT.format(model=MODEL))
    # One run at a time keeps memory bounded on small machines; before the fix every run aborted.
    for _ in range(3):
        try:
            run = subprocess.run([sys.executable, str(script)], cwd=REPO_ROOT, capture_output=True, text=True,
                                 env=_env_with_repo_on_path(), timeout=_EXIT_RUN_LIMIT_S, check=False)
        except subprocess.TimeoutExpired as expired:
            pytest.fail(f"the script did not exit within {_EXIT_RUN_LIMIT_S} s; stderr: {expired.stderr!r}")
        assert "script finished" in run.stdout, run.stderr
        assert "terminate called" not in run.stderr, run.stderr
        assert run.returncode == 0, run.stderr


def _env_with_repo_on_path() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


# --- closing the engine ---------------------------------------------------------------------------------


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalBackend]:
    """A private engine, so that adapter counts are not disturbed by other tests' clients."""
    engine = LocalBackend()
    monkeypatch.setitem(LocalBackend._defaults, str(engine.device), engine)
    yield engine
    engine.close()


def test_close_fails_queued_training_requests_and_refuses_new_ones(backend: LocalBackend) -> None:
    running, release = threading.Event(), threading.Event()

    def blocking_request() -> str:
        running.set()
        release.wait(timeout=60)
        return "finished"

    first = backend.submit(blocking_request)
    queued = backend.submit(lambda: "should not run")
    running.wait()
    closer = threading.Thread(target=backend.close)
    closer.start()
    while not backend._closed:  # close() marks the engine closed first, then waits for the running request
        threading.Event().wait(0.001)
    release.set()
    closer.join()
    assert first.result() == "finished"
    with pytest.raises(RequestFailedError, match="closed.*had not started"):
        queued.result()
    with pytest.raises(RequestFailedError, match="engine is closed"):
        backend.submit(lambda: None)
    backend.close()  # idempotent
    replacement = LocalBackend.default()
    assert replacement is not backend, "a closed default engine is replaced"
    replacement.close()


def test_close_fails_pending_sample_requests(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    from tinker_cookbook.engine.sampling.sampler import SamplerEngine

    sampler = tinker.ServiceClient().create_sampling_client(base_model=MODEL)
    stepping, release = threading.Event(), threading.Event()
    original_step = SamplerEngine._step

    def held_step(engine: SamplerEngine, batch: object) -> None:
        stepping.set()
        release.wait(timeout=60)  # hold the worker inside a step, so close() arrives while all are pending
        original_step(engine, batch)

    monkeypatch.setattr(SamplerEngine, "_step", held_step)
    prompt = types.ModelInput.from_ints([1, 2, 3])
    pending = [sampler.sample(prompt, 4, types.SamplingParams(max_tokens=1500)) for _ in range(4)]
    stepping.wait()
    closer = threading.Thread(target=backend.close)
    closer.start()
    while not backend._sampler._closed:
        threading.Event().wait(0.001)
    release.set()
    closer.join()
    assert not backend._sampler._thread.is_alive()
    for future in pending:
        with pytest.raises(RequestFailedError, match="shut down"):
            future.result()
    with pytest.raises(RequestFailedError, match="engine is closed"):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2))


# --- releasing training clients -------------------------------------------------------------------------


def _adapter_footprint(backend: LocalBackend) -> tuple[list[str], int]:
    """Adapter names on the shared base model and its total parameter count."""
    base = backend._bases[MODEL]
    model = base._peft_model if base._peft_model is not None else base._model
    names = sorted(base._peft_model.peft_config) if base._peft_model is not None else []
    return names, sum(p.numel() for p in model.parameters())


def _train_one_step(tc: tinker.TrainingClient) -> None:
    tokens = list(range(100, 130))
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    tc.forward_backward([datum], "cross_entropy")
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()


def test_close_frees_the_adapter_and_optimizer_state(backend: LocalBackend) -> None:
    service = tinker.ServiceClient()
    keeper = service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)  # another client on the base
    baseline = _adapter_footprint(backend)
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=1)
    _train_one_step(tc)
    session = weakref.ref(backend._sessions[tc.model_id])
    names, params = _adapter_footprint(backend)
    assert names == sorted([keeper.model_id, tc.model_id]) and params > baseline[1]
    snapshot = tc.save_weights_and_get_sampling_client()

    tc.close()
    gc.collect()
    assert _adapter_footprint(backend) == baseline
    assert tc.model_id not in backend._sessions and session() is None, "session (Adam state) still referenced"
    # A snapshot holds its own merged weights; the other client is untouched.
    prompt = types.ModelInput.from_ints([5, 6, 7])
    assert snapshot.sample(prompt, 1, types.SamplingParams(max_tokens=3)).result().sequences
    _train_one_step(keeper)
    tc.close()  # idempotent


def test_closed_client_raises_a_clear_error(backend: LocalBackend) -> None:
    import asyncio

    with tinker.ServiceClient().create_lora_training_client(base_model=MODEL, rank=4, seed=0) as tc:
        path = tc.save_weights_for_sampler("s").result().path
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2]),
                        loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]})
    calls = [
        lambda: tc.forward_backward([datum], "cross_entropy"),
        lambda: tc.forward([datum], "cross_entropy"),
        lambda: tc.optim_step(types.AdamParams(learning_rate=1e-3)),
        lambda: tc.save_state("late"),
        lambda: tc.save_weights_and_get_sampling_client(),
        lambda: tc.create_sampling_client(path),
        lambda: tc.get_info(),
        lambda: asyncio.run(tc.forward_backward_async([datum], "cross_entropy")),
    ]
    for call in calls:
        with pytest.raises(BadRequestError, match=rf"model_id='{tc.model_id}'\) is closed"):
            call()
    assert "closed" in repr(tc)


def _wait_until_released(backend: LocalBackend, model_id: str) -> None:
    """The reaper thread queues a collected client's release; wait (bounded) for the engine to run it."""
    deadline = time.monotonic() + 60
    while model_id in backend._sessions and time.monotonic() < deadline:
        backend.submit(lambda: None).result()
        time.sleep(0.01)
    assert model_id not in backend._sessions


def test_garbage_collected_client_releases_its_session(backend: LocalBackend) -> None:
    service = tinker.ServiceClient()
    keeper = service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
    baseline = _adapter_footprint(backend)
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=1)
    _train_one_step(tc)
    model_id = tc.model_id
    del tc
    gc.collect()
    _wait_until_released(backend, model_id)
    assert _adapter_footprint(backend) == baseline
    assert keeper.model_id in backend._sessions


@pytest.mark.parametrize("held", ["queue lock", "executors' module lock"])
def test_collection_while_a_lock_is_held_never_blocks(backend: LocalBackend, held: str) -> None:
    """The collector runs finalizers in whatever thread allocates, holding whatever it holds: the engine's queue
    lock (inside its own submit) or the lock every ``ThreadPoolExecutor.submit`` in the process takes (a server's
    thread pool). Collecting a client there must not take a lock, or the process deadlocks."""
    lock = backend._requests._queue_lock if held == "queue lock" else concurrent.futures.thread._global_shutdown_lock
    service = tinker.ServiceClient()
    clients = [service.create_lora_training_client(base_model=MODEL, rank=4, seed=1)]
    model_id, finalizer = clients[0].model_id, clients[0]._release
    returned = threading.Event()

    def collect_holding_the_lock() -> None:
        with lock:  # as the thread that holds it would be when the collector runs
            clients.clear()
            gc.collect()
            returned.set()

    thread = threading.Thread(target=collect_holding_the_lock, daemon=True)
    thread.start()
    assert returned.wait(30), f"collecting a client while holding the {held} blocked (a deadlock)"
    thread.join(30)
    assert not finalizer.alive, "the client was not collected inside the thread that held the lock"
    _wait_until_released(backend, model_id)
