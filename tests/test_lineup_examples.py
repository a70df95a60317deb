"""The documentation's quickstart, image-sampling and rendering examples with the tiny mixture-of-experts models in
place of Qwen3-VL-30B-A3B-Instruct and Qwen3-30B-A3B, as docs/models.md shows them (its python blocks run here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "models.md"
SECTION = "## The documentation's examples on the tiny mixture-of-experts models"


def _snippets() -> list[str]:
    text = DOC.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


@pytest.mark.parametrize("model", ["tinker-cookbook/tiny-qwen3-vl-moe", "tinker-cookbook/tiny-qwen3-moe"])
def test_quickstart_runs_and_learns_on_the_tiny_moe_models(model: str) -> None:
    from recipes.quickstart import Config, main

    # The same three steps at lr 1e-2 that the tiny dense model's quickstart test takes: the loss falls.
    losses = main(Config(model_name=model, steps=3, rank=4, learning_rate=1e-2))
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_image_sampling_example_runs_on_the_tiny_vision_moe(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(REPO)  # the example reads example-data/images/chess.png
    image, _ = _snippets()
    namespace: dict = {}
    exec(compile(image, str(DOC), "exec"), namespace)  # noqa: S102 - running the doc's own code
    assert "tiny-qwen3-vl-moe" in namespace["model_name"]
    assert capsys.readouterr().out.strip()  # the decoded answer (random tokens on a random model)


def test_rendering_example_samples_and_parses_on_the_tiny_moe() -> None:
    _, rendering = _snippets()
    namespace: dict = {}
    exec(compile(rendering, str(DOC), "exec"), namespace)  # noqa: S102 - running the doc's own code
    tokens = namespace["output"].sequences[0].tokens
    assert 1 <= len(tokens) <= 100
    # A random model rarely stops: the parse is clean exactly when the sample ended with the stop token.
    stopped = tokens[-1] in namespace["stop_sequences"]
    assert namespace["sampled_message"]["role"] == "assistant" and bool(namespace["parse_success"]) == stopped
