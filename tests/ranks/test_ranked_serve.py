"""``tinker-cookbook serve --nproc-per-node 2`` (two gloo ranks on the CPU), driven by the official ``tinker`` SDK:
sampling and training answer; killing rank 1 stops the whole server with a message naming rank 1, not a hang."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

tinker_sdk = pytest.importorskip("tinker", reason="the official tinker SDK is not installed "
                                 "(pip install 'tinker==0.38.0')")

REPO = Path(__file__).resolve().parents[2]
MODEL = "tinker-cookbook/tiny-qwen3"
START_TIMEOUT_S = 120
REQUEST_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60


class Server:
    """The serve command in its own session (so that every rank it starts can be killed with it)."""

    def __init__(self, home: Path) -> None:
        env = {**os.environ, "TINKER_COOKBOOK_HOME": str(home), "TINKER_COOKBOOK_DEVICE": "cpu",
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "tinker_cookbook.cli", "serve", "--nproc-per-node", "2", "--port", "0"]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        found = None
        try:
            while found is None:
                found = re.search(pattern, self.lines.get(timeout=timeout))
        except queue.Empty:
            pytest.fail(f"the server printed no line matching {pattern!r} in {timeout} s:\n{''.join(self.output)}")
        return found

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    running = Server(tmp_path)
    try:
        yield running
    finally:
        running.kill()


def test_serve_on_two_ranks_answers_and_stops_when_a_rank_dies(server: Server) -> None:
    url = server.wait_for(r"listening on (http://127\.0\.0\.1:\d+)", START_TIMEOUT_S)[1]
    rank1_pid = int(server.wait_for(r"rank 1 pid (\d+)", 10)[1])
    types = tinker_sdk.types
    service = tinker_sdk.ServiceClient(base_url=url)
    sampler = service.create_sampling_client(base_model=MODEL).result(timeout=REQUEST_TIMEOUT_S)
    greedy = types.SamplingParams(max_tokens=4, temperature=0.0)
    futures = [sampler.sample(types.ModelInput.from_ints([3, 5, 7, i]), 1, greedy) for i in range(4)]
    answers = [f.result(timeout=REQUEST_TIMEOUT_S) for f in futures]
    assert [len(a.sequences[0].tokens) for a in answers] == [4, 4, 4, 4]

    trainer = service.create_lora_training_client(base_model=MODEL, rank=4).result(timeout=REQUEST_TIMEOUT_S)
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
                        loss_fn_inputs={"target_tokens": [2, 3, 4, 5], "weights": [1.0] * 4})
    out = trainer.forward_backward([datum, datum, datum], "cross_entropy").result(timeout=REQUEST_TIMEOUT_S)
    assert len(out.loss_fn_outputs) == 3
    step = trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=REQUEST_TIMEOUT_S)
    assert step.metrics["grad_norm"] > 0

    os.kill(rank1_pid, signal.SIGKILL)
    try:
        status = server.process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server still runs {STOP_TIMEOUT_S} s after rank 1 died:\n{''.join(server.output)}")
    output = "".join(server.output)
    assert status == 1, output
    assert f"rank 1 (pid {rank1_pid}) was killed by SIGKILL" in output, output
