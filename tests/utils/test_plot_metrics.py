import json

import pytest

from tinker_cookbook.utils.plot_metrics import Config, plot, series


def _write_run(tmp_path):
    rows = [{"step": 0, "train_mean_nll": 2.0, "test/nll": 2.1}, {"step": 1, "train_mean_nll": 1.5},
            {"step": 2, "train_mean_nll": 1.0, "test/nll": 1.2}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_series_keeps_only_the_steps_that_have_the_key(tmp_path):
    rows = _write_run(tmp_path)
    assert series(rows, "test/nll") == ([0.0, 2.0], [2.1, 1.2])


def test_plot_writes_a_png(tmp_path):
    _write_run(tmp_path)
    out = plot(Config(path=str(tmp_path), keys=["train_mean_nll", "test/nll"]))
    assert out == tmp_path / "train_mean_nll_test-nll.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_key_lists_the_available_ones(tmp_path):
    _write_run(tmp_path)
    with pytest.raises(ValueError, match=r"\['nope'\].*available keys: \['test/nll', 'train_mean_nll'\]"):
        plot(Config(path=str(tmp_path), keys=["nope"]))
