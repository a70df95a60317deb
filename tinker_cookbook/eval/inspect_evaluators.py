"""Inspect AI tasks as a ``SamplingClientEvaluator``: inline evals in the training loops, or on a checkpoint.

    from tinker_cookbook.eval.inspect_evaluators import InspectEvaluatorBuilder

    config = train.Config(..., evaluator_builders=[
        InspectEvaluatorBuilder(tasks=["example-data/evals/contact_cards.py"], limit=16, max_tokens=64),
    ])

Every ``eval_every`` steps the loop hands the evaluator a sampling client on the current weights; the tasks run
in-process through ``InspectAPIFromTinkerSampling`` and each score comes back as a metric named
``inspect/<task>/<scorer>/<metric>`` (e.g. ``inspect/contact_cards/card_fields/mean``). Inspect writes its own
log of every run to ``log_dir``: by default ``<log_path>/inspect`` of the training run it is attached to, and
``~/inspect-logs`` on its own (``inspect view --log-dir DIR`` shows them).

A task is anything Inspect's ``eval`` accepts: a file (``path/tasks.py``, ``path/tasks.py@name``), or a registered
name such as ``inspect_evals/ifeval`` (needs the ``inspect_evals`` package and its datasets, i.e. a network).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chz

from tinker_cookbook import tinker
from tinker_cookbook.eval.evaluators import SamplingClientEvaluator
from tinker_cookbook.exceptions import ConfigurationError, EvalError

logger = logging.getLogger(__name__)

DEFAULT_LOG_DIR = "~/inspect-logs"
DEFAULT_METRIC_PREFIX = "inspect"
TASK_FILE_SUFFIXES = (".py", ".ipynb", ".yaml", ".yml")


@chz.chz
class InspectEvaluatorBuilder:
    """Settings of an ``InspectEvaluator``; calling the builder makes one (configs hold builders)."""

    tasks: list[str]
    """Inspect task specs: ``path/tasks.py``, ``path/tasks.py@task_name`` or a registered name."""
    renderer_name: str | None = None
    """None: the model's recommended renderer."""
    model_name: str | None = None
    """The base model (for the tokenizer and renderer); None: the sampling client's base model."""
    temperature: float | None = None
    """None for this and the other generation settings: the task's own setting, else the API default."""
    max_tokens: int | None = None
    """Most tokens per reply (None: the task's setting)."""
    top_p: float | None = None
    """Nucleus sampling threshold (None: the task's setting)."""
    top_k: int | None = None
    """Sample among the k likeliest tokens (None: the task's setting)."""
    seed: int | None = None
    """Sampling seed, for reproducible samples (None: the task's setting)."""
    num_choices: int | None = None
    """Replies per sample (None: the task's setting)."""
    task_args: dict[str, str] | None = None
    """Arguments of the task functions (``inspect eval -T``), e.g. ``task_args.grader_model=...``."""
    limit: int | None = None
    """Samples per task (None: all)."""
    epochs: int | None = None
    """Times each sample is run (None: the task's setting)."""
    log_dir: str | None = None
    """Where Inspect writes its logs; None: ``<log_path>/inspect`` inside a training run, else ``~/inspect-logs``."""
    max_connections: int | None = None
    """Concurrent generate calls (batched by the sampler); None: the provider's default."""
    include_reasoning: bool = False
    """Keep the model's thinking (``<think>...</think>``) in the replies Inspect scores."""
    verbose: bool = False
    """Log every prompt and reply of the sampler."""
    log_level: str = "warning"
    """Inspect's console log level."""
    debug_errors: bool = False
    """Raise a sample's exception at once instead of recording it in Inspect's log (the eval fails either way)."""
    metric_prefix: str = DEFAULT_METRIC_PREFIX
    """Metrics are named ``<metric_prefix>/<task>/<scorer>/<metric>``."""
    metadata: dict[str, str] | None = None
    """Stored in each Inspect log."""

    @chz.validate
    def _check(self) -> None:
        if not self.tasks:
            raise ConfigurationError("tasks is empty; pass at least one Inspect task, e.g. "
                                     "tasks=example-data/evals/contact_cards.py")
        if self.limit is not None and self.limit < 1:
            raise ConfigurationError(f"limit={self.limit} must be at least 1 (or None for every sample)")

    def __call__(self) -> InspectEvaluator:
        return InspectEvaluator(self)


def _generate_args(cfg: InspectEvaluatorBuilder) -> dict[str, Any]:
    """The generation settings the user set; they override the tasks' own (unset ones leave them alone)."""
    values = dict(temperature=cfg.temperature, max_tokens=cfg.max_tokens, top_p=cfg.top_p, top_k=cfg.top_k,
                  seed=cfg.seed, num_choices=cfg.num_choices, max_connections=cfg.max_connections)
    return {key: value for key, value in values.items() if value is not None}


def task_specs_for_inspect(tasks: list[str]) -> list[str]:
    """``tasks`` as Inspect accepts them, failing early (with the fix) on a missing task file or task package.

    Inspect reports both as "no inspect tasks were found", and it only takes task files by relative path, so a
    file given by absolute or ``~`` path is passed relative to the working directory.
    """
    specs = []
    for spec in tasks:
        path, at, name = spec.partition("@")
        if path.endswith(TASK_FILE_SUFFIXES):
            file = Path(path).expanduser()
            if not file.exists():
                raise ConfigurationError(
                    f"task file {path!r} does not exist (relative to {os.getcwd()}); pass a path to an Inspect "
                    "task file such as example-data/evals/contact_cards.py"
                )
            spec = os.path.relpath(file) + at + name
        elif "/" in spec and "." not in spec:
            package = spec.split("/", 1)[0]
            if importlib.util.find_spec(package) is None:
                raise ConfigurationError(
                    f"task {spec!r} comes from the Python package {package!r}, which is not installed; install it "
                    f"(pip install {package.replace('_', '-')}). Hub tasks such as inspect_evals/ifeval also "
                    "download their datasets, so they need network access; offline, use the project's tasks in "
                    "example-data/evals/"
                )
        specs.append(spec)
    return specs


def metrics_from_logs(logs: list[Any], prefix: str = DEFAULT_METRIC_PREFIX) -> dict[str, float]:
    """``{prefix}/{task}/{scorer}/{metric}: value`` for every score of every successful Inspect log."""
    metrics: dict[str, float] = {}
    for log in logs:
        if log.status != "success":
            message = log.error.message if log.error is not None else f"status {log.status}"
            raise EvalError(f"Inspect task {log.eval.task!r} did not finish: {message}")
        for score in log.results.scores if log.results is not None else []:
            for name, metric in score.metrics.items():
                metrics[f"{prefix}/{log.eval.task}/{score.name}/{name}"] = float(metric.value)
    return metrics


class InspectEvaluator(SamplingClientEvaluator):
    """Runs Inspect tasks on a sampling client and returns their scores as metrics."""

    def __init__(self, config: InspectEvaluatorBuilder, model_path: str | None = None) -> None:
        """``model_path``: the ``tinker://`` checkpoint the sampling clients sample from, if any (names the model in
        Inspect's logs and finds the renderer stored with its training run)."""
        self.config = config
        self.model_path = model_path
        self.last_logs: list[Any] = []
        """The Inspect ``EvalLog`` objects of the latest call (their ``location`` is the log file)."""
        self.run_log_path: str | None = None

    def attach_to_run(self, log_path: str) -> None:
        self.run_log_path = log_path

    @property
    def log_dir(self) -> Path:
        """Where Inspect's logs go: ``log_dir`` when set, else the run's ``inspect/``, else ``~/inspect-logs``."""
        if self.config.log_dir is not None:
            return Path(self.config.log_dir).expanduser()
        if self.run_log_path is not None:
            return Path(self.run_log_path) / "inspect"
        return Path(DEFAULT_LOG_DIR).expanduser()

    def _model(self, sampling_client: tinker.SamplingClient) -> Any:
        from inspect_ai.model import GenerateConfig, Model

        from tinker_cookbook.eval.inspect_utils import DEFAULT_MAX_CONNECTIONS, InspectAPIFromTinkerSampling

        cfg = self.config
        max_connections = cfg.max_connections or DEFAULT_MAX_CONNECTIONS
        api = InspectAPIFromTinkerSampling(
            model_name=cfg.model_name, renderer_name=cfg.renderer_name, sampling_client=sampling_client,
            model_path=self.model_path, verbose=cfg.verbose, include_reasoning=cfg.include_reasoning,
            max_connections=max_connections,
        )
        # A fixed max_connections: Inspect's default adaptive concurrency starts at 20 requests and backs off on
        # errors, which suits rate-limited services; the local sampler batches whatever it gets.
        return Model(api, GenerateConfig(max_connections=max_connections))

    async def run(self, sampling_client: tinker.SamplingClient) -> list[Any]:
        """Run the tasks and return Inspect's ``EvalLog`` per task (also kept in ``last_logs``)."""
        import inspect_ai

        cfg = self.config
        tasks = task_specs_for_inspect(cfg.tasks)
        _quiet_inspect_display()
        try:
            with _root_logging_kept():
                logs = await inspect_ai.eval_async(
                    tasks, model=self._model(sampling_client), task_args=dict(cfg.task_args or {}),
                    limit=cfg.limit, epochs=cfg.epochs,
                    log_dir=str(self.log_dir), log_level=cfg.log_level, metadata=cfg.metadata,
                    debug_errors=cfg.debug_errors, score_display=False, ctl_server=False, **_generate_args(cfg),
                )
        except (ConfigurationError, EvalError):
            raise
        except Exception as exc:  # Inspect's own errors (a task that fails to load, a dataset download, ...)
            raise EvalError(f"Inspect could not run tasks {cfg.tasks}: {type(exc).__name__}: {exc}"
                            f"{_hub_hint(cfg.tasks)}") from exc
        self.last_logs = list(logs)
        return self.last_logs

    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        return metrics_from_logs(await self.run(sampling_client), self.config.metric_prefix)


def _hub_hint(tasks: list[str]) -> str:
    hub = [t for t in tasks if t.startswith("inspect_evals/")]
    if not hub:
        return ""
    return (f". {hub} download their datasets from the hub, so they need network access; offline, use the "
            "project's tasks in example-data/evals/")


@contextlib.contextmanager
def _root_logging_kept() -> Iterator[None]:
    """Undo Inspect's changes to the root logger when the eval ends.

    The first ``eval_async`` of a process sets the root level to its console level (WARNING) and adds its own
    handler to the root logger: the training loop's INFO lines in ``logs.log`` would stop, and its warnings would
    be printed twice. Inspect's handler stays on Inspect's own loggers.
    """
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)


def _quiet_inspect_display() -> None:
    """Ask Inspect for no console display (its progress UI would interleave with the training logs).

    ``eval_async`` falls back to a plain-text display unless one was chosen; ``display_type()`` chooses from
    ``INSPECT_DISPLAY`` the first time it is called, so a user's own choice of display is kept.
    """
    from inspect_ai.util import display_type

    chosen = os.environ.get("INSPECT_DISPLAY")
    os.environ["INSPECT_DISPLAY"] = chosen or "none"
    try:
        display_type()
    finally:
        if chosen is None:
            del os.environ["INSPECT_DISPLAY"]
