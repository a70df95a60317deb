"""A rank that dies under the ranked engine: rank 0's next request fails at once with an error that names the rank
(no hang), and ``on_failure`` is called once."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "lost_rank_scenario.py"
TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_dead_rank_fails_the_next_request_naming_it() -> None:
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "TINKER_COOKBOOK_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    ranks = [subprocess.Popen([sys.executable, str(SCRIPT)], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for r in range(2)]
    try:
        assert ranks[0].stdout is not None
        readable, _, _ = select.select([ranks[0].stdout], [], [], TIMEOUT_S)
        assert readable, f"rank 0 printed nothing in {TIMEOUT_S} s"
        ready = ranks[0].stdout.readline()
        assert ready.startswith("ready"), ready
        rank1_pid = int(re.search(r"rank1=(\d+)", ready)[1])  # type: ignore[index]
        assert rank1_pid == ranks[1].pid
        os.kill(rank1_pid, signal.SIGKILL)
        output, _ = ranks[0].communicate(timeout=TIMEOUT_S)
    finally:
        for process in ranks:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    assert f"request failed: rank 0: a broadcast with the other ranks failed: rank 1 (pid {rank1_pid}" in output, output
    assert "stopped" in output and "on_failure calls: 1" in output, output
