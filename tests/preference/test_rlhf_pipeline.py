"""The RLHF pipeline recipe on the tiny model: one step per stage, hand-offs, re-runs, and a kill in a stage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kill_helpers import Killed, die_after_step, restore_logging  # noqa: F401 (fixture)
from pref_helpers import TINY_MODEL

from recipes.preference.rlhf import rlhf_pipeline
from tinker_cookbook import checkpoint_utils
from tinker_cookbook.cli_utils import run_recipe
from tinker_cookbook.utils import ml_log

REPO = Path(__file__).resolve().parents[2]
ONE_STEP_EACH = (f"model_name={TINY_MODEL}", "sft.max_steps=1", "rm.max_steps=1", "rl.max_steps=1",
                 "sft.lora_rank=4", "rm.lora_rank=4", "rl.lora_rank=4", "win_rate_max_prompts=4")


def _run(*args: str, module: str = "recipes.preference.rlhf.rlhf_pipeline") -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TINKER_COOKBOOK_NO_REEXEC": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          check=False, timeout=900)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _steps(log_path: Path) -> list[int]:
    return [row["step"] for row in ml_log.read_metrics(log_path)]


def test_one_step_per_stage_hands_checkpoints_on_and_reruns_skip_finished_stages(tmp_path):
    log = tmp_path / "rlhf"
    result = _run(*ONE_STEP_EACH, f"log_path={log}")
    assert result.returncode == 0, result.stderr[-3000:]
    for stage in rlhf_pipeline.STAGES:
        assert {"metrics.jsonl", "checkpoints.jsonl", "config.json", "logs.log"} <= {p.name for p in (log / stage).iterdir()}
    sft, rm = (_rows(log / stage / "checkpoints.jsonl")[-1] for stage in ("sft", "rm"))
    rl_config = json.loads((log / "rl" / "config.json").read_text())
    assert rl_config["load_checkpoint_path"] == sft["state_path"]  # RL starts from the SFT policy ...
    judge = rl_config["dataset_builder"]["preference_model_builder"]
    assert judge["model_path"] == rm["sampler_path"]  # ... is judged by the preference model ...
    win_rate = rl_config["evaluator_builders"][-1]
    assert win_rate["reference_model_path"] == sft["sampler_path"]  # ... and measured against the SFT policy
    assert "preference/accuracy" in _rows(log / "rm" / "metrics.jsonl")[0]
    rl_rows = _rows(log / "rl" / "metrics.jsonl")
    assert {"env/all/win_fraction", "env/all/format", "win_rate/win_rate", "win_rate/stderr"} <= set(rl_rows[0])

    before = {stage: (log / stage / "metrics.jsonl").read_text() for stage in rlhf_pipeline.STAGES}
    again = _run(*ONE_STEP_EACH, f"log_path={log}")  # every stage already reached its max_steps
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("Nothing to do") == 3
    assert {stage: (log / stage / "metrics.jsonl").read_text() for stage in rlhf_pipeline.STAGES} == before

    # Stage 3 only, from the saved stages, one step further (the docs' docstring command with a raised max_steps).
    more = _run(*ONE_STEP_EACH, f"log_path={log}", "run_sft=False", "run_rm=False", "rl.max_steps=2",
                module="tinker_cookbook.recipes.preference.rlhf.rlhf_pipeline")
    assert more.returncode == 0, more.stderr[-3000:]
    assert _steps(log / "rl") == [0, 1, 2]  # 2: the final evaluation
    assert {s: (log / s / "metrics.jsonl").read_text() for s in ("sft", "rm")} == {s: before[s] for s in ("sft", "rm")}


def test_stage_three_alone_without_saved_stages_is_one_error_line(tmp_path):
    result = _run(*ONE_STEP_EACH, f"log_path={tmp_path / 'empty'}", "run_sft=False", "run_rm=False")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("Error: stage sft has no checkpoint")


def test_hub_data_offline_is_one_error_line(tmp_path):
    result = _run(*ONE_STEP_EACH, f"log_path={tmp_path / 'hub'}", "dataset=hub")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and "no_robots" in last and "Traceback" not in result.stderr


# -- killed in a stage ----------------------------------------------------------------------------------------


def die_in_stage(stage: int, step: int, sigkill: bool = False) -> None:
    """Make the ``stage``-th loop of the pipeline (0 = SFT) die right after it logged ``step``."""
    die_after_step(step, sigkill, skip_loops=stage)


# Every test here may leave the logging patched (a killed run never restores it): undo it after each.
pytestmark = pytest.mark.usefixtures("restore_logging")


KILL_ARGS = (f"model_name={TINY_MODEL}", "sft.max_steps=2", "rm.max_steps=4", "rl.max_steps=3", "rm.save_every=2",
             "rl.save_every=2", "sft.lora_rank=4", "rm.lora_rank=4", "rl.lora_rank=4", "rm.eval_every=0",
             "rl.eval_every=0")


def _pipeline(log: Path, *extra: str) -> None:
    run_recipe(rlhf_pipeline.main, rlhf_pipeline.blueprint, [rlhf_pipeline.DATASET],
               argv=[*KILL_ARGS, *extra, f"log_path={log}"])


def test_killed_in_the_preference_model_stage_a_rerun_continues_there(tmp_path):
    log = tmp_path / "rlhf"
    die_in_stage(1, step=2)  # the preference model, after logging step 2 (its last checkpoint is after step 2)
    with pytest.raises(Killed):
        _pipeline(log)
    sft_metrics = (log / "sft" / "metrics.jsonl").read_text()
    assert _steps(log / "rm") == [0, 1, 2] and checkpoint_utils.get_last_checkpoint(log / "rm")["step"] == 2
    assert not (log / "rl").exists()

    _pipeline(log)
    assert (log / "sft" / "metrics.jsonl").read_text() == sft_metrics  # finished: skipped
    assert _steps(log / "rm") == [0, 1, 2, 3]  # continued from step 2, each step logged once
    assert [r["name"] for r in checkpoint_utils.load_checkpoints_file(log / "rm")] == ["000002", "000004"]
    assert _steps(log / "rl") == [0, 1, 2]


_SIGKILL_CHILD = """
import sys
sys.path[:0] = [{tests!r}, {tests_root!r}]
import test_rlhf_pipeline as t
t.die_in_stage(2, step=2, sigkill=True)
t._pipeline(t.Path({log!r}))
"""


def test_sigkilled_in_the_rl_stage_a_rerun_continues_there(tmp_path):
    log = tmp_path / "rlhf"
    code = _SIGKILL_CHILD.format(tests=str(REPO / "tests" / "preference"), tests_root=str(REPO / "tests"), log=str(log))
    child = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=900,
                           env={**os.environ, "TINKER_COOKBOOK_NO_REEXEC": "1"}, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    # Row 2 was logged after the checkpoint taken after two iterations; the process died before the last one.
    assert _steps(log / "rl") == [0, 1, 2]
    assert [r["name"] for r in checkpoint_utils.load_checkpoints_file(log / "rl")] == ["000002"]
    done = {s: (log / s / "metrics.jsonl").read_text() for s in ("sft", "rm")}

    _pipeline(log)
    assert {s: (log / s / "metrics.jsonl").read_text() for s in ("sft", "rm")} == done
    assert _steps(log / "rl") == [0, 1, 2]  # iteration 2 again, from the checkpoint, logged once
    assert [r["name"] for r in checkpoint_utils.load_checkpoints_file(log / "rl")] == ["000002", "final"]


def test_killed_in_the_sft_stage_a_rerun_continues_there(tmp_path):
    log = tmp_path / "rlhf"
    die_in_stage(0, step=1)  # the SFT policy, after logging step 1 (before any checkpoint of its own)
    with pytest.raises(Killed):
        _pipeline(log, "sft.save_every=1")
    assert _steps(log / "sft") == [0, 1] and checkpoint_utils.get_last_checkpoint(log / "sft")["step"] == 1
    assert not (log / "rm").exists()

    _pipeline(log, "sft.save_every=1")
    assert _steps(log / "sft") == [0, 1]  # step 1 again from its checkpoint, logged once
    assert [r["name"] for r in checkpoint_utils.load_checkpoints_file(log / "sft")] == ["000001", "000002"]
    assert _steps(log / "rm") == [0, 1, 2, 3] and _steps(log / "rl") == [0, 1, 2]
