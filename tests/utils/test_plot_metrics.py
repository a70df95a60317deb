"""plot_metrics: one or several runs overlaid, smoothing, PNG + self-contained HTML, the CLI's errors."""

import json
import os
import subprocess
import sys

import pytest

from tinker_cookbook.exceptions import ConfigurationError, DataError
from tinker_cookbook.utils.plot_metrics import Config, find_runs, plot, series, smooth, summary_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir, scale=1.0):
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 0, "train_mean_nll": 2.0 * scale, "test/nll": 2.1 * scale},
            {"step": 1, "train_mean_nll": 1.5 * scale},
            {"step": 2, "train_mean_nll": 1.0 * scale, "test/nll": 1.2 * scale}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_series_keeps_only_the_steps_that_have_the_key(tmp_path):
    rows = _write_run(tmp_path)
    assert series(rows, "test/nll") == ([0.0, 2.0], [2.1, 1.2])


def test_smoothing_is_a_debiased_moving_average():
    # w = 0.5 on [2, 0, 4]: acc 1.0 -> 0.5 -> 2.25, divided by 1 - 0.5^t = 0.5, 0.75, 0.875.
    assert smooth([2.0, 0.0, 4.0], 0.5) == pytest.approx([2.0, 0.5 / 0.75, 2.25 / 0.875])
    assert smooth([3.0, 1.0], 0.0) == [3.0, 1.0]


def test_one_run_writes_a_png_and_an_html_page(tmp_path):
    _write_run(tmp_path)
    files = plot(Config(paths=[str(tmp_path)], keys=["train_mean_nll", "test/nll"]))
    assert files.png == tmp_path / "train_mean_nll_test-nll.png"
    assert files.png.read_bytes()[:8] == PNG_MAGIC
    page = files.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "src=" not in page and "<link" not in page  # nothing is fetched to view it: the figure is inline SVG


def test_three_runs_overlaid_from_a_glob_with_smoothing(tmp_path):
    for i, scale in enumerate((1.0, 2.0, 3.0)):
        _write_run(tmp_path / "sweep" / f"lr-{i}", scale)
    (tmp_path / "sweep" / "notes").mkdir()  # not a run: the glob skips it
    config = Config(paths=[str(tmp_path / "sweep" / "*")], keys=["train_mean_nll"], smoothing=0.5)
    files = plot(config)
    assert files.png == tmp_path / "sweep" / "train_mean_nll.png"  # the runs' common parent
    assert files.png.read_bytes()[:8] == PNG_MAGIC
    page = files.html.read_text()
    assert all(f"lr-{i}" in page for i in range(3)) and "3 runs (smoothing 0.5)" in page
    # The table holds each run's last and lowest raw value: 1.0 * scale for every run.
    from tinker_cookbook.utils.plot_metrics import load_runs

    rows = summary_rows(load_runs(config.paths), config.keys)
    assert [(run, last, low) for run, _, last, low, _ in rows] == [("lr-0", 1.0, 1.0), ("lr-1", 2.0, 2.0),
                                                                   ("lr-2", 3.0, 3.0)]


def test_same_named_runs_are_told_apart_and_listed_once(tmp_path):
    _write_run(tmp_path / "a" / "run")
    _write_run(tmp_path / "b" / "run")
    files = find_runs([str(tmp_path / "a" / "run"), str(tmp_path / "*" / "run")])
    assert files == [tmp_path / "a" / "run" / "metrics.jsonl", tmp_path / "b" / "run" / "metrics.jsonl"]
    page = plot(Config(paths=[str(tmp_path / "*" / "run")], keys=["test/nll"])).html.read_text()
    assert "a/run" in page and "b/run" in page


def test_errors_name_the_path_the_key_and_the_value(tmp_path):
    _write_run(tmp_path)
    with pytest.raises(DataError, match=r"\['nope'\].*available keys: \['test/nll', 'train_mean_nll'\]"):
        plot(Config(paths=[str(tmp_path)], keys=["nope"]))
    with pytest.raises(ConfigurationError, match="matches no run directory"):
        plot(Config(paths=[str(tmp_path / "missing-*")]))
    with pytest.raises(ConfigurationError, match=r"smoothing=1.0 must be in \[0, 1\)"):
        Config(paths=[str(tmp_path)], smoothing=1.0)


def test_command_line_help_and_one_line_errors(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tinker_cookbook.utils.plot_metrics", *args],
                              capture_output=True, text=True, check=False,
                              env={**os.environ, "TINKER_COOKBOOK_NO_REEXEC": "1"})  # one process start each

    help_text = cli("--help").stdout
    assert "paths: list[str] = (required)" in help_text and "Exponential moving average" in help_text
    assert "lambda" not in help_text
    missing = cli(f"paths={tmp_path / 'none'}")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and missing.stderr.startswith("Error: paths:")
    _write_run(tmp_path / "run")
    ok = cli(f"paths={tmp_path / 'run'}", "keys=train_mean_nll")
    assert ok.returncode == 0 and (tmp_path / "run" / "train_mean_nll.html").exists(), ok.stderr
