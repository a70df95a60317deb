"""Every training loop resumes the same way after being killed between two checkpoints (``checkpoint_utils.resume_point``).

Each test runs a loop uninterrupted, then runs it again in a fresh log dir but kills it right after it has logged
step ``KILL_AFTER`` (checkpoints every 2 steps, so the last checkpoint is at step 2 and row 2 was logged after it),
resumes it, and checks that ``metrics.jsonl`` has every step exactly once with the values of the uninterrupted run.
The kill is either an exception raised by an extra metrics sink right after row ``KILL_AFTER`` was written, or a
real ``SIGKILL`` of a subprocess at the same point (no cleanup, no ``finally``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kill_helpers import Killed, die_after_step, restore_logging  # noqa: F401 (fixture)

from tinker_cookbook import checkpoint_utils
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.rl.arithmetic_env import ArithmeticDatasetBuilder
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.utils import ml_log

TINY = "tinker-cookbook/tiny-smollm2"
KILL_AFTER = 2
REPO = Path(__file__).resolve().parents[1]


# Every test here may leave the logging patched (a killed run never restores it): undo it after each.
pytestmark = pytest.mark.usefixtures("restore_logging")


def _steps(log_path: Path) -> list[int]:
    return [row["step"] for row in ml_log.read_metrics(log_path)]


def assert_same_rows(resumed: Path, straight: Path, keys: tuple[str, ...]) -> None:
    """Each step exactly once, in order, with the uninterrupted run's values (timings aside)."""
    a, b = ml_log.read_metrics(resumed), ml_log.read_metrics(straight)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert {k for k in keys if k in x} == {k for k in keys if k in y}, x["step"]
        for key in keys:
            if key in x:
                # Resume is bit-exact (same weights, Adam state, data order and sampling seeds); the slack only
                # covers float32 reductions whose order may differ between two processes' thread pools.
                assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-6), (x["step"], key)


# -- the supervised loop ------------------------------------------------------------------------------------

SL_KEYS = ("train_mean_nll", "test/nll", "learning_rate", "progress", "num_tokens", "num_loss_tokens")


def sl_config(log_path: Path, data_file: Path, **overrides: Any) -> sl_train.Config:
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=TINY, renderer_name="chatml", max_length=64,
                                            batch_size=4)
    builder = FromConversationFileBuilder(common_config=common, file_path=str(data_file), test_size=4)
    values: dict[str, Any] = {
        "log_path": str(log_path), "model_name": TINY, "dataset_builder": builder, "learning_rate": 5e-3,
        "lora_rank": 4, "eval_every": 2, "save_every": 2, "behavior_if_log_dir_exists": "resume",
        "num_examples_to_show": 0,
    }
    values.update(overrides)
    return sl_train.Config(**values)


@pytest.fixture(scope="module")
def sl_data(tmp_path_factory) -> Path:
    """20 contact-card conversations: 4 held out, 16 to train = 4 steps of 4."""
    path = tmp_path_factory.mktemp("data") / "conversations.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"Person {i} is {20 + i} and lives in Town{i}."},
                          {"role": "assistant", "content": f"Name: Person {i}\nAge: {20 + i}\nCity: Town{i}"}]}
            for i in range(20)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_supervised_loop_killed_between_checkpoints(tmp_path, sl_data):
    straight = tmp_path / "straight"
    asyncio.run(sl_train.main(sl_config(straight, sl_data)))
    run = tmp_path / "killed"
    die_after_step(KILL_AFTER)
    with pytest.raises(Killed):
        asyncio.run(sl_train.main(sl_config(run, sl_data)))
    assert _steps(run) == [0, 1, 2] and checkpoint_utils.get_last_checkpoint(run)["step"] == 2
    asyncio.run(sl_train.main(sl_config(run, sl_data)))
    assert_same_rows(run, straight, SL_KEYS)


# -- the RL loop ---------------------------------------------------------------------------------------------

RL_KEYS = ("env/all/reward/total", "env/all/ac_tokens_per_turn", "optim/loss:sum", "optim/kl_sample_train_v2",
           "test/env/all/correct", "progress/done_frac")


def rl_config(log_path: Path, **overrides: Any) -> rl_train.Config:
    builder = ArithmeticDatasetBuilder(batch_size=2, group_size=4, model_name_for_tokenizer=TINY,
                                       renderer_name="chatml", n_batches=6, max_operand=9, n_test_problems=2)
    values: dict[str, Any] = {
        "learning_rate": 1e-3, "dataset_builder": builder, "model_name": TINY, "renderer_name": "chatml",
        "max_tokens": 4, "log_path": str(log_path), "lora_rank": 4, "eval_every": 2, "save_every": 2, "max_steps": 4,
        "behavior_if_log_dir_exists": "resume",
    }
    values.update(overrides)
    return rl_train.Config(**values)


@pytest.fixture(scope="module")
def rl_straight(tmp_path_factory) -> Path:
    log_path = tmp_path_factory.mktemp("rl") / "straight"
    asyncio.run(rl_train.main(rl_config(log_path)))
    return log_path


def test_rl_loop_killed_between_checkpoints(tmp_path, rl_straight):
    run = tmp_path / "killed"
    die_after_step(KILL_AFTER)
    with pytest.raises(Killed):
        asyncio.run(rl_train.main(rl_config(run)))
    assert _steps(run) == [0, 1, 2] and checkpoint_utils.get_last_checkpoint(run)["batch"] == 2
    asyncio.run(rl_train.main(rl_config(run)))
    assert _steps(run) == [0, 1, 2, 3, 4]  # 4: the evaluation after the last step
    assert_same_rows(run, rl_straight, RL_KEYS)
    assert [c["name"] for c in checkpoint_utils.load_checkpoints_file(run)] == ["000002", "final"]
    asyncio.run(rl_train.main(rl_config(run)))  # finished: a no-op
    assert _steps(run) == [0, 1, 2, 3, 4]


_SIGKILL_CHILD = """
import asyncio, sys
sys.path.insert(0, {tests!r})
import test_resume_after_kill as t
t.die_after_step({step}, sigkill=True)
asyncio.run(t.rl_train.main(t.rl_config(t.Path({log_path!r}))))
"""


def test_rl_loop_sigkilled_between_checkpoints(tmp_path, rl_straight):
    run = tmp_path / "sigkilled"
    code = _SIGKILL_CHILD.format(tests=str(REPO / "tests"), step=KILL_AFTER, log_path=str(run))
    child = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "TINKER_COOKBOOK_NO_REEXEC": "1"}, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert _steps(run) == [0, 1, 2]
    asyncio.run(rl_train.main(rl_config(run)))
    assert_same_rows(run, rl_straight, RL_KEYS)


def test_async_rl_loop_killed_between_checkpoints(tmp_path):
    # Which groups an async step trains on depends on timing, so only the bookkeeping is compared here.
    async_config = rl_train.AsyncConfig(max_steps_off_policy=1, groups_per_batch=2)
    run = tmp_path / "async"
    die_after_step(KILL_AFTER)
    with pytest.raises(Killed):
        asyncio.run(rl_train.main(rl_config(run, eval_every=0, async_config=async_config)))
    assert _steps(run) == [0, 1, 2]
    asyncio.run(rl_train.main(rl_config(run, eval_every=0, async_config=async_config)))
    assert _steps(run) == [0, 1, 2, 3]
    assert [c["name"] for c in checkpoint_utils.load_checkpoints_file(run)] == ["000002", "final"]


def test_rl_resume_with_another_config_is_refused(rl_straight):
    before = (rl_straight / "config.json").read_text()
    with pytest.raises(ConfigurationError, match=r"(?s)holds another run.*model_name: 'tinker-cookbook/tiny-smollm2'"):
        asyncio.run(rl_train.main(rl_config(rl_straight, model_name="tinker-cookbook/tiny-qwen3")))
    other_data = rl_config(rl_straight).dataset_builder
    with pytest.raises(ConfigurationError, match=r"(?s)dataset_builder\.max_operand: 9 .* 5.*lora_rank: 4 .* 8"):
        asyncio.run(rl_train.main(rl_config(rl_straight, lora_rank=8, dataset_builder=type(other_data)(
            **{**_fields(other_data), "max_operand": 5}))))
    assert (rl_straight / "config.json").read_text() == before  # the refused run wrote nothing


def _fields(config: Any) -> dict[str, Any]:
    import chz

    return {name: getattr(config, name) for name in chz.chz_fields(config)}


# -- the flat recipes ---------------------------------------------------------------------------------------


def test_rl_loop_recipe_killed_between_checkpoints(tmp_path):
    from recipes import rl_loop

    def config(name: str) -> rl_loop.Config:
        return rl_loop.Config(model_name=TINY, log_path=str(tmp_path / name), batch_size=2, group_size=4,
                              max_tokens=4, lora_rank=4, n_steps=4, save_every=2, behavior_if_log_dir_exists="resume")

    rl_loop.main(config("straight"))
    die_after_step(KILL_AFTER)
    with pytest.raises(Killed):
        rl_loop.main(config("killed"))
    assert _steps(tmp_path / "killed") == [0, 1, 2]
    rl_loop.main(config("killed"))
    assert_same_rows(tmp_path / "killed", tmp_path / "straight", ("reward/total", "loss:sum", "num_datums"))


def test_sl_loop_recipe_killed_between_checkpoints(tmp_path, sl_data):
    from recipes import sl_loop

    def config(name: str) -> sl_loop.Config:
        return sl_loop.Config(model_name=TINY, data_path=str(sl_data), test_size=4, log_path=str(tmp_path / name),
                              batch_size=4, learning_rate=5e-3, max_length=64, lora_rank=4, eval_every=2,
                              save_every=2, behavior_if_log_dir_exists="resume")

    sl_loop.main(config("straight"))
    die_after_step(KILL_AFTER)
    with pytest.raises(Killed):
        sl_loop.main(config("killed"))
    assert _steps(tmp_path / "killed") == [0, 1, 2]
    sl_loop.main(config("killed"))
    assert_same_rows(tmp_path / "killed", tmp_path / "straight", ("train_mean_nll", "test/nll", "learning_rate"))
