"""Two ranks (gloo, CPU, under torchrun) against one process on the union batch: the training request's gradients,
the Adam step, the saved adapter and greedy samples are the same; rank 1 ends with rank 0's adapter exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tinker_cookbook.engine.backend import LocalBackend
from tinker_cookbook.engine.ranks.split import balanced_shards
from tinker_cookbook.engine.store.checkpoint_store import CheckpointStore
from tinker_cookbook.engine.store.files import ADAPTER_WEIGHTS_FILE
from tinker_cookbook.tinker import types

sys.path.insert(0, str(Path(__file__).parent))
from scenario_data import ADAM, DATA, GREEDY, LORA, MODEL, PROMPTS  # noqa: E402

HERE = Path(__file__).parent
REPO = HERE.parents[1]
RUN_TIMEOUT_S = 150

# Each rank runs its shard in its own padded groups, so the matmuls see other shapes than the one process that runs
# the union batch: each logprob and gradient term differs by fp32 rounding (unit 6e-8), amplified by the few layers
# and the sums over tokens (at most ~40 terms here) to well under 1e-5 of the largest gradient; the sum over ranks
# adds one rounding per element. 1e-5 relative keeps a margin of 10x over the measured ~1e-6 and is far below any
# real difference (a datum counted twice or missed changes gradients by 10% or more).
GRAD_RTOL = 1e-5


@pytest.fixture(scope="module")
def ranked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the 2-rank scenario once under torchrun (``rank_scenario.py``); what each rank wrote."""
    out = tmp_path_factory.mktemp("ranks")
    env = {**os.environ, "RANK_SCENARIO_OUT": str(out), "TINKER_COOKBOOK_HOME": str(out / "store"),
           "TINKER_COOKBOOK_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    # --standalone: torchrun picks a free port for the rendezvous itself.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(HERE / "rank_scenario.py")]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True, text=True)
    try:
        output, _ = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"the 2-rank run did not finish in {RUN_TIMEOUT_S} s:\n{output[-4000:]}")
    assert process.returncode == 0, output[-4000:]
    return {"rank0": torch.load(out / "rank0.pt"), "rank1": torch.load(out / "rank1.pt"), "store": out / "store"}


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same requests in one process, on the union batch."""
    backend = LocalBackend(CheckpointStore(tmp_path_factory.mktemp("single")), "cpu")
    try:
        run_id = backend.create_session(MODEL, LORA, None)
        session = backend._session(run_id)
        out = backend.forward(run_id, DATA, "cross_entropy", None, True).result()
        grads = {k: p.grad.clone() for k, p in session.params.items() if p.grad is not None}
        backend.optim_step(run_id, ADAM).result()
        handle = backend.snapshot(run_id, None).result()
        samples = [backend.sample(handle, types.ModelInput.from_ints(p), 1, GREEDY, False, 0).result()
                   .sequences[0].tokens for p in PROMPTS]
        return {"grads": grads, "params": {k: p.detach().clone() for k, p in session.params.items()},
                "loss": out.metrics["loss:sum"], "logprobs": [o["logprobs"].data for o in out.loss_fn_outputs],
                "samples": samples}
    finally:
        backend.close()


def adam_tolerance(grad: torch.Tensor, grad_error: float) -> torch.Tensor:
    """How far one Adam step from zero moments can move a weight when its gradient is off by ``grad_error``.

    Step one moves a weight by lr * g / (|g| + eps) (bias-corrected moments m = g, v = g^2), whose derivative in g
    is lr * eps / (|g| + eps)^2: largest where |g| is smallest. Over [g - d, g + d] that bounds the change by
    lr * d * eps / (max(|g| - d, 0) + eps)^2, and the step never moves a weight by more than lr, so by 2 lr at most.
    Plus a few fp32 roundings of the weight itself.
    """
    closest = (grad.abs() - grad_error).clamp(min=0)
    bound = ADAM.learning_rate * grad_error * ADAM.eps / (closest + ADAM.eps) ** 2
    return bound.clamp(max=2 * ADAM.learning_rate) + 1e-6


def test_gradients_equal_one_process_on_the_union_batch(ranked: dict[str, Any], single: dict[str, Any]) -> None:
    grads, expected = ranked["rank0"]["grads"], single["grads"]
    scale = max(float(g.abs().max()) for g in expected.values())
    assert scale > 0
    for name, grad in expected.items():
        assert torch.allclose(grads[name], grad, rtol=0, atol=GRAD_RTOL * scale), name
    # loss:sum adds the ranks' sums: the same total up to the order of ~40 float additions.
    assert ranked["rank0"]["loss"] == pytest.approx(single["loss"], rel=1e-6)
    for got, want in zip(ranked["rank0"]["logprobs"], single["logprobs"], strict=True):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_adam_step_and_saved_adapter_equal_one_process(ranked: dict[str, Any], single: dict[str, Any]) -> None:
    scale = max(float(g.abs().max()) for g in single["grads"].values())
    params = ranked["rank0"]["params"]
    for name, want in single["params"].items():
        tolerance = adam_tolerance(single["grads"][name], GRAD_RTOL * scale)
        assert bool(((params[name] - want).abs() <= tolerance).all()), name
    # Identical Adam steps on identical summed gradients: rank 1 holds exactly rank 0's adapter.
    for name, param in params.items():
        assert torch.equal(ranked["rank1"]["params"][name], param), name
    # Written once, by rank 0: the checkpoint holds rank 0's adapter exactly.
    assert ranked["rank0"]["path"].endswith("/weights/step1")
    saved = CheckpointStore(ranked["store"]).checkpoint_dir(ranked["rank0"]["path"], expected_kind="weights")
    tensors = load_file(saved / ADAPTER_WEIGHTS_FILE)
    assert len(tensors) == len(params)
    def key(t: torch.Tensor) -> tuple[list[int], float]:
        return list(t.shape), float(t.double().sum())

    for got, want in zip(sorted(tensors.values(), key=key), sorted(params.values(), key=key), strict=True):
        assert torch.equal(got, want)


def test_sampling_is_spread_over_the_ranks_and_answers_like_one_process(ranked: dict[str, Any],
                                                                         single: dict[str, Any]) -> None:
    assert ranked["rank1"]["sampled"] == 1  # two prompts of similar cost: one per rank
    assert ranked["rank0"]["samples"] == single["samples"]


def test_a_refused_request_names_its_datum_and_accumulates_nothing(ranked: dict[str, Any]) -> None:
    assert "data[5]" in ranked["rank0"]["refused"]
    assert ranked["rank0"]["pending"] == 0


def test_balanced_shards_split_by_tokens() -> None:
    lengths = [11, 4, 7, 9, 3]
    shards = balanced_shards(lengths, 2)
    assert sorted(i for shard in shards for i in shard) == list(range(5))
    loads = [sum(lengths[i] for i in shard) for shard in shards]
    assert loads == [18, 16]  # largest first, each to the lighter rank: 11, 9, 7 (to 9), 4 (to 11), 3
    assert balanced_shards([5], 3) == [[0], [], []]
    assert balanced_shards([], 2) == [[], []]
