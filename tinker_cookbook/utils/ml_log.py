"""Metrics logging: one ``Logger`` interface, several sinks, always a ``metrics.jsonl``.

``setup_logging(log_dir, wandb_project=None, ...)`` returns a logger that writes

- ``<log_dir>/metrics.jsonl``: one JSON object per ``log_metrics`` call, ``{"step": s, ...metrics}``;
- ``<log_dir>/config.json``: the run's config (``log_hparams``), chz configs dumped recursively;
- ``<log_dir>/logs.log``: the Python ``logging`` output of the run;
- a table of each step's metrics on the console (rich);
- Weights & Biases, when ``wandb_project`` is set (works with ``WANDB_MODE=offline``; install the ``wandb`` extra).

The loops call the returned logger unconditionally: a sink that is not wanted is simply not in the multiplexer,
so there are no ``if wandb:`` branches in training code.

Reading the files back (the documentation's snippets work as written)::

    df = pandas.read_json(f"{log_dir}/metrics.jsonl", lines=True)
    df["train_mean_nll"], df["test/nll"].dropna()
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import chz

from tinker_cookbook.base.atomic_files import atomic_file
from tinker_cookbook.exceptions import ConfigurationError

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
WANDB_ID_FILE = "wandb_run_id"
CONFIG_FILE = "config.json"
LOG_FILE = "logs.log"


# ---------------------------------------------------------------------------------------------------------
# Config and value serialization
# ---------------------------------------------------------------------------------------------------------


def dump_config(value: Any) -> Any:
    """A JSON-able copy of a config: chz classes and dataclasses become dicts (with their class under
    ``"__class__"``), enums their values, callables ``"module.name"``, paths strings."""
    if chz.is_chz(value):
        out: dict[str, Any] = {"__class__": f"{type(value).__module__}.{type(value).__qualname__}"}
        for name in chz.chz_fields(value):
            out[name] = dump_config(getattr(value, name))
        return out
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"__class__": f"{type(value).__module__}.{type(value).__qualname__}"}
        for field in dataclasses.fields(value):
            out[field.name] = dump_config(getattr(value, field.name))
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): dump_config(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [dump_config(v) for v in value]
    if callable(value):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', repr(value))}"
    return repr(value)


def _scalar(value: Any) -> Any:
    """Plain Python numbers for numpy/torch scalars; other values unchanged."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return value.item()
    return value


def format_value(value: Any) -> str:
    """A metric value for the console: 6 significant digits, scientific notation for tiny or huge values."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.4e}"
        return f"{value:.6g}"
    return str(value)


# ---------------------------------------------------------------------------------------------------------
# Loggers
# ---------------------------------------------------------------------------------------------------------


class Logger(ABC):
    """A sink for a run's config, metrics and long texts."""

    def log_hparams(self, config: Any) -> None:
        """Record the run's config (once, at the start)."""

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Record the metrics of one step."""

    def log_long_text(self, key: str, text: str) -> None:
        """Record a long text (an example transcript, a report)."""

    def sync(self) -> None:
        """Flush what was logged so far."""

    def close(self) -> None:
        """Flush and release resources; the logger is not used afterwards."""

    def get_logger_url(self) -> str | None:
        """A URL where the run can be viewed, if the sink has one."""
        return None


class JsonLogger(Logger):
    """Writes ``config.json``, ``metrics.jsonl`` and long texts (``<key>.txt``) into ``log_dir``."""

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.log_dir / METRICS_FILE
        remove_torn_tail(self.metrics_path)
        # Line-buffered so that a killed run leaves every completed row on disk.
        self._file = open(self.metrics_path, "a", buffering=1)  # noqa: SIM115 - kept open for the run, closed in close()

    def log_hparams(self, config: Any) -> None:
        with open(self.log_dir / CONFIG_FILE, "w") as f:
            json.dump(dump_config(config), f, indent=2)
            f.write("\n")

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        row: dict[str, Any] = {} if step is None else {"step": step}
        row.update({key: _scalar(value) for key, value in metrics.items()})
        self._file.write(json.dumps(row) + "\n")

    def log_long_text(self, key: str, text: str) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
        with open(self.log_dir / f"{safe}.txt", "a") as f:
            f.write(text.rstrip("\n") + "\n")

    def sync(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class PrettyPrintLogger(Logger):
    """Prints each step's metrics as a table on the console (rich)."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console()

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        from rich.table import Table

        title = "metrics" if step is None else f"step {step}"
        table = Table(title=title, show_header=True, header_style="bold", title_justify="left")
        table.add_column("metric", style="cyan")
        table.add_column("value", justify="right")
        for key in sorted(metrics):
            table.add_row(key, format_value(_scalar(metrics[key])))
        self.console.print(table)


class WandbLogger(Logger):
    """Logs to Weights & Biases (``WANDB_MODE=offline`` writes a local run that can be synced later).

    The wandb run id is kept in ``<log_dir>/wandb_run_id``: a resumed run (the same ``log_dir``) continues the same
    wandb run (``resume="allow"``) instead of starting a second one; a fresh run in a new or deleted log dir gets a
    new id.
    """

    def __init__(self, project: str, name: str | None, log_dir: str | Path, config: Any = None, *,
                 entity: str | None = None, group: str | None = None, tags: Sequence[str] = ()) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigurationError(
                f"wandb_project={project!r} needs the wandb package: pip install 'wandb==0.31.0' "
                "(or leave wandb_project unset)"
            ) from exc
        self._wandb = wandb
        self.run_id = wandb_run_id(log_dir)
        try:
            self.run = wandb.init(
                project=project, name=name, dir=str(log_dir), entity=entity, group=group, tags=list(tags) or None,
                id=self.run_id, resume="allow",
                config=dump_config(config) if config is not None else None, reinit="finish_previous",
            )
        except Exception as exc:  # wandb raises its own UsageError/CommError types
            raise ConfigurationError(
                f"could not start a wandb run for wandb_project={project!r}: {exc}. Set WANDB_API_KEY, or "
                "WANDB_MODE=offline to log locally, or leave wandb_project unset"
            ) from exc

    def log_hparams(self, config: Any) -> None:
        self.run.config.update(dump_config(config), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        self.run.log({key: _scalar(value) for key, value in metrics.items()}, step=step)

    def log_long_text(self, key: str, text: str) -> None:
        self.run.log({key: self._wandb.Html(f"<pre>{text}</pre>")})

    def close(self) -> None:
        self.run.finish()

    def get_logger_url(self) -> str | None:
        return getattr(self.run, "url", None)


class MultiplexLogger(Logger):
    """Forwards every call to each of its loggers."""

    def __init__(self, loggers: Sequence[Logger]) -> None:
        self.loggers = list(loggers)

    def log_hparams(self, config: Any) -> None:
        for sink in self.loggers:
            sink.log_hparams(config)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        for sink in self.loggers:
            sink.log_metrics(metrics, step)

    def log_long_text(self, key: str, text: str) -> None:
        for sink in self.loggers:
            sink.log_long_text(key, text)

    def sync(self) -> None:
        for sink in self.loggers:
            sink.sync()

    def close(self) -> None:
        for sink in self.loggers:
            sink.close()

    def get_logger_url(self) -> str | None:
        urls = [url for url in (sink.get_logger_url() for sink in self.loggers) if url]
        return urls[0] if urls else None


def wandb_run_id(log_dir: str | Path) -> str:
    """The wandb run id of the run in ``log_dir``: the one recorded there, else a new one, recorded now."""
    path = Path(log_dir) / WANDB_ID_FILE
    if path.is_file() and (recorded := path.read_text().strip()):
        return recorded
    import secrets

    run_id = secrets.token_hex(4)  # wandb's own ids are 8 lowercase alphanumerics
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id


# ---------------------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------------------

_HANDLER_TAG = "_tinker_cookbook_handler"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each record, so that a live progress bar that
    redirects the console (rich) prints log records above the bar instead of through it."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # logging.StreamHandler.__init__ assigns it; the property ignores it
        pass


def configure_logging_module(log_file: str | Path | None, level: int = logging.INFO) -> None:
    """Send Python logging to stderr and (when given) ``log_file``; calling it again replaces our handlers."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_TAG, False):
            root.removeHandler(handler)
            handler.close()
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    handlers: list[logging.Handler] = [_StderrHandler()]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(fmt)
        setattr(handler, _HANDLER_TAG, True)
        root.addHandler(handler)
    root.setLevel(level)
    # Third-party libraries are chatty at INFO (HTTP requests, file locks).
    for name in ("httpx", "filelock", "urllib3", "datasets", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.WARNING)


def setup_logging(
    log_dir: str | Path,
    wandb_project: str | None = None,
    wandb_name: str | None = None,
    config: Any = None,
    do_configure_logging_module: bool = True,
    print_metrics: bool = True,
    *,
    wandb_entity: str | None = None,
    wandb_group: str | None = None,
    wandb_tags: Sequence[str] = (),
    extra_sinks: Sequence[Logger] = (),
) -> Logger:
    """The standard sinks for a run in ``log_dir``; ``config`` (if given) is written to ``config.json`` now.

    ``print_metrics`` prints each step's metrics as a table; ``extra_sinks`` (a progress display) get every call too.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    if do_configure_logging_module:
        configure_logging_module(log_dir / LOG_FILE)
    sinks: list[Logger] = [JsonLogger(log_dir)]
    if print_metrics:
        sinks.append(PrettyPrintLogger())
    if wandb_project:
        sinks.append(WandbLogger(wandb_project, wandb_name, log_dir, config, entity=wandb_entity, group=wandb_group,
                                 tags=wandb_tags))
    sinks.extend(extra_sinks)
    multiplexer = MultiplexLogger(sinks)
    if config is not None:
        multiplexer.log_hparams(config)
    url = multiplexer.get_logger_url()
    logger.info("logging to %s%s", log_dir, f" and {url}" if url else "")
    if os.environ.get("WANDB_MODE") == "offline" and wandb_project:
        logger.info("wandb is offline: sync later with `wandb sync %s/wandb/offline-run-*`", log_dir)
    return multiplexer


def remove_torn_tail(path: str | Path) -> None:
    """Cut a last line that lacks its newline (an append that was killed), so that the next appended row
    starts on a line of its own instead of being glued to the fragment."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    logger.warning("%s ends with an incomplete line (the process was killed while writing it); removing it", path)
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)


def read_metrics(log_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``<log_dir>/metrics.jsonl`` (a torn last line from a killed run is skipped)."""
    path = Path(log_dir) / METRICS_FILE
    rows: list[dict[str, Any]] = []
    if not path.exists():
        return rows
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                logger.warning("skipping a torn last line of %s (the run was killed while writing it)", path)
                continue
            raise
    return rows


def truncate_metrics(log_dir: str | Path, keep_below_step: int) -> int:
    """Drop the rows of ``metrics.jsonl`` whose ``step`` is ``>= keep_below_step``; returns how many were dropped.

    A resumed run calls this before continuing from ``keep_below_step``: rows past the last checkpoint came from
    the interrupted attempt and are recomputed, so the file ends up as if the run had never stopped.
    """
    path = Path(log_dir) / METRICS_FILE
    if not path.exists():
        return 0
    rows = read_metrics(log_dir)
    kept = [row for row in rows if not (isinstance(row.get("step"), int) and row["step"] >= keep_below_step)]
    dropped = len(rows) - len(kept)
    with atomic_file(path) as tmp, open(tmp, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in kept)
    if dropped:
        logger.info("dropped %d metrics rows from step %d on (they are recomputed)", dropped, keep_below_step)
    return dropped
