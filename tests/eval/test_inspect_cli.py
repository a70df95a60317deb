"""``inspect eval --model tinker-cookbook/...`` in a fresh process, found through the package's entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from inspect_ai.log import list_eval_logs, read_eval_log

REPO = Path(__file__).resolve().parents[2]
TINY = "tinker-cookbook/tiny-smollm2"


def _entry_point_metadata(directory: Path) -> Path:
    """A distribution declaring the ``inspect_ai`` entry points of pyproject.toml, as pip would install them.

    The test builds it from pyproject.toml so that it checks this checkout's declaration whatever metadata the
    environment's editable install was made from (it may predate the entry point).
    """
    entry_points = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["inspect_ai"]
    dist_info = directory / "tinker_cookbook_entry_points-0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: tinker-cookbook-entry-points\nVersion: 0\n")
    (dist_info / "entry_points.txt").write_text(
        "[inspect_ai]\n" + "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    )
    return directory


def _inspect_eval(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    metadata = _entry_point_metadata(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(metadata), str(REPO)])}
    # the task path is relative: Inspect only accepts relative task paths
    command = [sys.executable, "-m", "inspect_ai", "eval", "example-data/evals/contact_cards.py", "--limit", "2",
               "--max-tokens", "4", "--log-dir", str(tmp_path / "logs"), "--display", "none", *args]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_inspect_cli_evaluates_a_base_model_through_the_entry_point(tmp_path):
    result = _inspect_eval(tmp_path, "--model", f"tinker-cookbook/{TINY}", "-M", "renderer_name=role_colon")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    [info] = list_eval_logs(str(tmp_path / "logs"))
    log = read_eval_log(info, resolve_attachments=True)
    assert log.status == "success" and log.eval.model == f"tinker-cookbook/{TINY}"
    assert log.eval.model_args == {"renderer_name": "role_colon"}
    assert log.results.completed_samples == 2
    assert {score.name for score in log.results.scores} == {"card_format", "card_fields"}
    for sample in log.samples:
        assert 1 <= sample.output.usage.output_tokens <= 4
        [event] = [e for e in sample.events if e.event == "model"]
        # the raw call in the log: the prompt as role_colon renders it, and the sampling settings
        assert event.call.request["prompt"].rstrip().endswith("Assistant:")
        assert event.call.request["sampling_params"]["max_tokens"] == 4


def test_inspect_cli_reports_an_unknown_checkpoint(tmp_path):
    result = _inspect_eval(tmp_path, "--model", "tinker-cookbook/tinker://no-such-run/sampler_weights/final")
    assert result.returncode != 0
    assert "cannot sample from model path 'tinker://no-such-run/sampler_weights/final'" in result.stderr
