"""Smoke tests of the docs' recipes that extend the basic ones: chat_sl, math_rl (tiny random model, 2 steps)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = "tinker-cookbook/tiny-smollm2"


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TINKER_COOKBOOK_NO_REEXEC": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_chat_sl_trains_two_steps_on_the_example_data(tmp_path):
    log_path = tmp_path / "run"
    result = _run("tinker_cookbook.recipes.chat_sl.train", f"model_name={TINY}", "max_steps=2",
                  f"log_path={log_path}", "lora_rank=4", "batch_size=4", "max_length=128",
                  "behavior_if_log_dir_exists=delete")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _rows(log_path / "metrics.jsonl")
    assert [m["step"] for m in metrics if "train_mean_nll" in m] == [0, 1]
    config = json.loads((log_path / "config.json").read_text())
    assert (config["model_name"], config["recipe_name"]) == (TINY, "chat_sl")


def test_chat_sl_hub_dataset_offline_fails_in_one_clear_line(tmp_path):
    result = _run("recipes.chat_sl.train", "dataset=no_robots", f"model_name={TINY}", f"log_path={tmp_path / 'r'}",
                  "behavior_if_log_dir_exists=delete")
    assert result.returncode == 1
    assert result.stderr.startswith("Error: dataset='HuggingFaceH4/no_robots' could not be loaded")
    assert "dataset=example" in result.stderr and "Traceback" not in result.stderr


def test_math_rl_runs_two_iterations_on_offline_gsm8k_problems(tmp_path):
    log_path = tmp_path / "run"
    result = _run("recipes.math_rl.train", f"model_name={TINY}", "max_steps=2", f"log_path={log_path}",
                  "lora_rank=4", "max_tokens=16", "n_test=4", "behavior_if_log_dir_exists=delete")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _rows(log_path / "metrics.jsonl")
    assert [m["step"] for m in metrics if "env/all/reward/total" in m] == [0, 1]
    assert "test/env/all/correct" in metrics[0]
    config = json.loads((log_path / "config.json").read_text())
    assert config["dataset_builder"]["source"] == "offline" and config["dataset_builder"]["group_size"] == 4
    assert _rows(log_path / "checkpoints.jsonl")[-1]["name"] == "final"


def test_lr_sweep_runs_two_points_and_collects_a_table_and_a_plot(tmp_path):
    # Six conversations, two held out, batch 4: one step is the whole epoch, so both runs finish (progress 1.0)
    # and pass the docs' "completed" filter.
    data = tmp_path / "six.jsonl"
    data.write_text("".join((REPO / "example-data" / "conversations.jsonl").read_text().splitlines(True)[:6]))
    sweep_dir = tmp_path / "sweep"
    result = _run("recipes.lr_sweep", "learning_rates=[1e-4,1e-2]", f"sweep_dir={sweep_dir}", f"model_name={TINY}",
                  f"data_path={data}", "test_size=2", "batch_size=4", "lora_rank=4", "max_length=128", "max_steps=1",
                  "behavior_if_log_dir_exists=delete")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Read metrics for 2 experiments" in result.stdout and "The optimal LR is" in result.stdout
    import pandas

    table = pandas.read_csv(sweep_dir / "results.csv")
    assert list(table["run"]) == ["lr-0.0001", "lr-0.01"]
    assert list(table["learning_rate"]) == [1e-4, 1e-2]
    assert table["final_loss"].notna().all()
    # One Adam step moves each weight by about the learning rate: 1e-2 against 1e-4 changes the held-out loss far
    # beyond float noise, so equal values would mean both rows came from one run.
    assert abs(table["final_test_nll"][0] - table["final_test_nll"][1]) > 1e-3
    assert (sweep_dir / "final_loss_vs_lr.png").stat().st_size > 0


def test_lr_sweep_collect_skips_unfinished_runs(tmp_path):
    from recipes.lr_sweep import collect

    for name, lr, progress in [("lr-0.001", 1e-3, 1.0), ("lr-0.01", 1e-2, 0.5)]:
        run = tmp_path / name
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"learning_rate": lr}))
        rows = [{"step": 0, "train_mean_nll": 2.0, "progress": progress / 2},
                {"step": 1, "train_mean_nll": 1.5, "test/nll": 1.7, "progress": progress}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert collect(tmp_path) == [{"run": "lr-0.001", "learning_rate": 1e-3, "final_loss": 1.5, "final_test_nll": 1.7}]
