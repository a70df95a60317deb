import json
import logging

import chz
import numpy as np
import pandas

from tinker_cookbook.utils import ml_log


@chz.chz
class _Inner:
    path: str = "data.jsonl"
    size: int = 3


@chz.chz
class _Config:
    learning_rate: float = 1e-4
    inner: _Inner = chz.field(default_factory=_Inner)
    tags: list[str] = chz.field(default_factory=lambda: ["a", "b"])


def test_metrics_jsonl_rows_have_step_and_read_back_with_pandas(tmp_path):
    log = ml_log.setup_logging(tmp_path, config=_Config(), print_metrics=False)
    log.log_metrics({"train_mean_nll": np.float32(2.5), "progress": 0.5, "num_tokens": 10}, step=0)
    log.log_metrics({"train_mean_nll": 2.0, "test/nll": 2.25, "progress": 1.0}, step=1)
    log.close()

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"step": 0, "train_mean_nll": 2.5, "progress": 0.5, "num_tokens": 10}
    df = pandas.read_json(tmp_path / "metrics.jsonl", lines=True)
    assert list(df["train_mean_nll"]) == [2.5, 2.0]
    assert list(df["test/nll"].dropna()) == [2.25]
    assert df["progress"].iloc[-1] == 1.0


def test_config_json_is_the_dumped_chz_config(tmp_path):
    ml_log.setup_logging(tmp_path, config=_Config(learning_rate=3e-4), print_metrics=False).close()
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["learning_rate"] == 3e-4
    assert config["inner"]["path"] == "data.jsonl" and config["inner"]["size"] == 3
    assert config["inner"]["__class__"].endswith("_Inner")
    assert config["tags"] == ["a", "b"]


def test_python_logging_goes_to_logs_log(tmp_path):
    ml_log.setup_logging(tmp_path, print_metrics=False).close()
    logging.getLogger("tinker_cookbook.test").info("hello from the test")
    for handler in logging.getLogger().handlers:
        handler.flush()
    assert "hello from the test" in (tmp_path / "logs.log").read_text()
    ml_log.configure_logging_module(None)  # detach the file handler from the root logger


def test_pretty_print_shows_each_metric(tmp_path):
    from rich.console import Console

    console = Console(record=True, width=100)
    ml_log.PrettyPrintLogger(console).log_metrics({"train_mean_nll": 1.234567, "time/total": 0.00012}, step=3)
    text = console.export_text()
    assert "step 3" in text and "train_mean_nll" in text and "1.23457" in text and "1.2000e-04" in text


def test_wandb_offline_writes_a_local_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = ml_log.setup_logging(tmp_path, wandb_project="tests", config=_Config(), print_metrics=False)
    log.log_metrics({"train_mean_nll": 1.0}, step=0)
    log.close()
    ml_log.configure_logging_module(None)
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    assert (tmp_path / "metrics.jsonl").exists()


def _wandb_run(log_dir, **kwargs):
    log = ml_log.setup_logging(log_dir, wandb_project="tests", config=_Config(), print_metrics=False, **kwargs)
    run = next(sink for sink in log.loggers if isinstance(sink, ml_log.WandbLogger)).run
    seen = {"id": run.id, "group": run.group, "tags": tuple(run.tags)}
    log.log_metrics({"train_mean_nll": 1.0}, step=0)
    log.close()
    ml_log.configure_logging_module(None)
    return seen


def test_wandb_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    first = _wandb_run(tmp_path / "run", wandb_group="sweep-1", wandb_tags=("lr", "tiny"))
    assert (first["group"], first["tags"]) == ("sweep-1", ("lr", "tiny"))
    assert (tmp_path / "run" / ml_log.WANDB_ID_FILE).read_text().strip() == first["id"]
    again = _wandb_run(tmp_path / "run")  # the same log dir: a resumed run
    assert again["id"] == first["id"]
    # wandb names its offline directories offline-run-<time>-<id> (a -1 suffix when the second is the same): both
    # invocations wrote the same run id.
    runs = [d.name for d in (tmp_path / "run" / "wandb").glob("offline-run-*")]
    assert len(runs) == 2 and all(f"-{first['id']}" in name for name in runs)
    assert _wandb_run(tmp_path / "other")["id"] != first["id"]  # another run dir: another wandb run


def test_read_metrics_skips_a_torn_last_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "a": 1}\n{"step": 1, "a"')
    assert ml_log.read_metrics(tmp_path) == [{"step": 0, "a": 1}]


def test_truncate_metrics_drops_rows_from_the_resumed_step_on(tmp_path):
    rows = [{"step": 0, "a": 1}, {"step": 1, "a": 2}, {"step": 2, "a": 3}, {"note": "no step"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ml_log.truncate_metrics(tmp_path, keep_below_step=1) == 2
    assert ml_log.read_metrics(tmp_path) == [{"step": 0, "a": 1}, {"note": "no step"}]
    assert ml_log.truncate_metrics(tmp_path / "missing", keep_below_step=0) == 0


def test_a_new_logger_removes_a_torn_last_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "a"')
    log = ml_log.JsonLogger(tmp_path)
    log.log_metrics({"a": 2}, step=1)
    log.close()
    assert ml_log.read_metrics(tmp_path) == [{"step": 0}, {"step": 1, "a": 2}]
