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



def test_math_rl_hub_gsm8k_offline_fails_in_one_clear_line(tmp_path):
    result = _run("recipes.math_rl.train", "source=hub", f"model_name={TINY}", f"log_path={tmp_path / 'r'}",
                  "behavior_if_log_dir_exists=delete")
    assert result.returncode == 1
    assert result.stderr.startswith("Error: dataset='openai/gsm8k' could not be loaded")
    assert "source=offline" in result.stderr and "Traceback" not in result.stderr

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
    # The points' training curves, overlaid by plot_metrics: a PNG and an HTML page naming both runs.
    assert (sweep_dir / "train_mean_nll.png").read_bytes()[:4] == b"\x89PNG"
    page = (sweep_dir / "train_mean_nll.html").read_text()
    assert "lr-0.0001" in page and "lr-0.01" in page
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


def test_prompt_distillation_creates_data_then_trains_and_measures_the_student(tmp_path):
    data = tmp_path / "distill.jsonl"
    # The tiny random teacher never replies with a label, so target=raw (the docs' r_i = f_T([P, q_i])) is the
    # mode that yields rows; target=label refusing to write an empty file is checked below.
    made = _run("tinker_cookbook.recipes.prompt_distillation.create_data", f"model_name={TINY}",
                f"output_file={data}", "max_inputs=4", "target=raw")
    assert made.returncode == 0, made.stderr[-3000:]
    rows = _rows(data)
    from recipes.prompt_distillation.task import TEACHER_PROMPT, split

    assert [r["messages"][0] for r in rows] == [{"role": "user", "content": s} for s, _ in split("train")[:4]]
    assert all(r["messages"][1]["role"] == "assistant" for r in rows)
    assert TEACHER_PROMPT not in data.read_text()  # the student's data has no trace of the prompt

    log_path = tmp_path / "run"
    trained = _run("tinker_cookbook.recipes.prompt_distillation.train", f"model_name={TINY}", f"file_path={data}",
                   f"log_path={log_path}", "lora_rank=4", "batch_size=2", "max_steps=1",
                   "behavior_if_log_dir_exists=delete")
    assert trained.returncode == 0, trained.stderr[-3000:]
    metrics = _rows(log_path / "metrics.jsonl")
    assert [m["step"] for m in metrics if "train_mean_nll" in m] == [0]
    assert 0.0 <= metrics[0]["held_out/follow_rate"] <= metrics[0]["held_out/label_rate"] <= 1.0
    assert "held-out, without the teacher prompt: follow_rate" in trained.stdout


def test_prompt_distillation_refuses_to_write_no_data_and_to_train_without_data(tmp_path):
    made = _run("recipes.prompt_distillation.create_data", f"model_name={TINY}", f"output_file={tmp_path / 'd.jsonl'}",
                "max_inputs=2")
    assert made.returncode == 1 and "nothing to distil" in made.stderr and not (tmp_path / "d.jsonl").exists()
    trained = _run("recipes.prompt_distillation.train", f"model_name={TINY}", f"file_path={tmp_path / 'none.jsonl'}",
                   f"log_path={tmp_path / 'run'}")
    assert trained.returncode == 1 and "prompt_distillation.create_data" in trained.stderr


def test_reply_label_and_follows():
    from recipes.prompt_distillation.task import follows, reply_label, split

    assert [reply_label(r) for r in ["fr", " FR (French)", "`de`.", "english", "xx", ""]] == \
        ["fr", "fr", "de", None, None, None]
    assert follows("fr") and follows(" en\n") and not follows("fr.") and not follows("The language is fr")
    held_out, train_split = split("held_out"), split("train")
    assert (len(held_out), len(train_split)) == (22, 55) and not {s for s, _ in held_out} & {s for s, _ in train_split}
