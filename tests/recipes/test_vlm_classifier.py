"""The VLM classifier recipe (tiny Qwen3-VL, a few generated images) and the vision snippets of its README."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from recipes.vlm_classifier import data
from recipes.vlm_classifier import train as vlm_train
from tinker_cookbook.cli_utils import run_recipe

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "recipes" / "vlm_classifier" / "README.md"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_generated_splits_are_deterministic_disjoint_and_balanced() -> None:
    train = data.colour_examples("train", 3, seed=0, size=8)
    again = data.colour_examples("train", 3, seed=0, size=8)
    test = data.colour_examples("test", 3, seed=0, size=8)
    assert [e.image.tobytes() for e in train] == [e.image.tobytes() for e in again]
    assert not {e.image.tobytes() for e in train} & {e.image.tobytes() for e in test}
    assert sorted(e.label for e in test) == sorted(list(data.COLOURS) * 3)


def test_answers_are_graded_on_the_class_name_only() -> None:
    assert vlm_train.names_the_class(" Red.", "red")
    assert vlm_train.names_the_class("golden retriever", "golden_retriever".replace("_", " "))
    assert not vlm_train.names_the_class("red or blue", "red")


def test_recipe_trains_and_measures_held_out_accuracy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_path = tmp_path / "run"
    run_recipe(vlm_train.main, vlm_train.blueprint, [vlm_train.DATASET], name="vlm_classifier", argv=[
        f"log_path={log_path}", "max_steps=1", "train_per_class=1", "test_per_class=1", "batch_size=4",
        "lora_rank=4", "behavior_if_log_dir_exists=delete"])
    rows = _rows(log_path / "metrics.jsonl")
    # Step 0 measures the untrained model on the held-out images (a run cut by max_steps has no final evaluation).
    assert [(r["step"], r[vlm_train.METRIC]) for r in rows if vlm_train.METRIC in r] == [(0, 0.0)]
    assert [r["step"] for r in rows if "train_mean_nll" in r] == [0]
    assert "held-out accuracy 0.00 (step 0)" in capsys.readouterr().out


def test_help_documents_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    run_recipe(vlm_train.main, vlm_train.blueprint, [vlm_train.DATASET], name="vlm_classifier", argv=["--help"])
    out = capsys.readouterr().out
    for key in ("dataset", "train_per_class", "test_per_class", "image_size", "learning_rate", "model_name"):
        assert re.search(rf"^  (\S+\.)?{key}( \(or \w+\))?: ", out, re.MULTILINE), f"{key} missing from --help"
    assert "learning_rate: float = 0.005" in out and "renderer_name: str | None = 'qwen3_vl_instruct'" in out


def test_hub_dataset_offline_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(vlm_train.main, vlm_train.blueprint, [vlm_train.DATASET], name="vlm_classifier", argv=[
            "dataset=caltech101", f"log_path={tmp_path / 'run'}", "max_steps=1", "batch_size=4",
            "behavior_if_log_dir_exists=delete"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error:") and "dataset=colours" in err[0], err


def _snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_readme_vision_snippets_run_with_a_local_image(monkeypatch: pytest.MonkeyPatch) -> None:
    # The documentation's image-sampling example (a local image for its download), then the renderer version.
    monkeypatch.chdir(REPO)
    first, second = _snippets()
    namespace: dict = {}
    exec(compile(first, str(DOC), "exec"), namespace)  # noqa: S102 - running the doc's own code
    assert len(namespace["result"].sequences[0].tokens) >= 1
    exec(compile(second, str(DOC), "exec"), namespace)  # noqa: S102
    assert len(namespace["result"].sequences[0].tokens) >= 1
    assert namespace["loss"] > 0
