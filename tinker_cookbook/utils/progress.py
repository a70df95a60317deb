"""A run's progress on the console: steps done / total, ETA, the current phase, throughput, a few headline metrics.

``RunProgress`` is a metrics sink (``ml_log.Logger``): each row a loop logs for a step advances it, so every loop
that logs its rows through ``run_core.open_run`` shows progress without code of its own. Phases (``sampling``,
``training``, ``evaluating``, ``saving``) are set with ``phase(name)`` around long work; the run's display is
found through a context variable, so code deep in a loop (evaluators, checkpoints, rollouts) marks its phase
without being handed the display, and does nothing when no run is open.

Modes (``RunConfig.progress``):

- ``auto``: ``bar`` when stdout is a terminal, else ``lines``;
- ``bar``: a live rich progress bar (prints and log records appear above it);
- ``lines``: one plain line per step, for log files and CI (``step 3/17 18% | 2.1 s/step | ETA 29s | ...``);
- ``table``: the full table of each step's metrics (rich), no bar;
- ``off``: nothing on the console (``metrics.jsonl`` is written regardless).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TextIO, TypeAlias, get_args

from tinker_cookbook.utils.ml_log import Logger, PrettyPrintLogger, format_value

ProgressMode: TypeAlias = Literal["auto", "bar", "lines", "table", "off"]
PROGRESS_MODES: tuple[str, ...] = get_args(ProgressMode)

# The metrics shown next to the bar, when a row has them: the loss or reward of each loop, then held-out ones.
HEADLINE_KEYS = (
    "train_mean_nll", "dpo_loss", "env/all/reward/total", "reward/total", "test/nll", "test/dpo_loss",
    "test/env/all/reward/total",
)
# Tokens a step handled, for the throughput, in the order they are looked for: SL/DPO's trained tokens, RL's
# sampled tokens of the whole batch (a per-turn mean would understate it by the number of turns).
TOKEN_KEYS = ("num_tokens", "env/all/total_ac_tokens")

_current: contextvars.ContextVar[RunProgress | None] = contextvars.ContextVar("tinker_cookbook_progress", default=None)


def resolve_mode(mode: str, stream: TextIO | None = None) -> str:
    """``auto`` made concrete: ``bar`` on a terminal, ``lines`` elsewhere; other modes unchanged."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress={mode!r} must be one of {list(PROGRESS_MODES)}")
    if mode != "auto":
        return mode
    stream = stream if stream is not None else sys.stdout
    isatty = getattr(stream, "isatty", None)
    return "bar" if callable(isatty) and isatty() else "lines"


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``: short, for a one-line display."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{(whole % 3600) // 60:02d}m"


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Show ``name`` as the current phase of the open run's display while the block runs (no-op without one)."""
    progress = _current.get()
    if progress is None:
        yield
        return
    previous = progress.current_phase
    progress.set_phase(name)
    try:
        yield
    finally:
        progress.set_phase(previous)


class RunProgress(Logger):
    """The console display of one invocation of a run, from ``start_step`` to ``end_step`` of ``total_steps``."""

    def __init__(self, mode: str, start_step: int, end_step: int, total_steps: int | None = None, *,
                 name: str = "run", stream: TextIO | None = None, clock: Any = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.mode = resolve_mode(mode, self.stream)
        self.start_step, self.end_step = start_step, end_step
        self.total_steps = total_steps if total_steps is not None else end_step
        self.name = name
        self.current_phase = "starting"
        self._clock = clock
        self._started = clock()
        self._done = 0  # steps completed in this invocation
        self._last: dict[str, Any] = {}
        self._tokens = 0.0
        self._table = PrettyPrintLogger() if self.mode == "table" else None
        self._bar: Any = None
        self._task: Any = None
        self._token: contextvars.Token[RunProgress | None] | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------
    def __enter__(self) -> RunProgress:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self) -> None:
        """Start the display and make it the one ``phase`` marks."""
        self._token = _current.set(self)
        if self.mode == "bar":
            self._start_bar()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._token is not None:
            with contextlib.suppress(ValueError):  # closed from another context than the one that opened it
                _current.reset(self._token)
            self._token = None

    # -- what loops call ------------------------------------------------------------------------------------
    def set_phase(self, name: str) -> None:
        self.current_phase = name
        self._refresh()

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if self._table is not None:
            self._table.log_metrics(metrics, step)
        if step is None:
            return
        self._last.update({k: v for k, v in metrics.items() if k in HEADLINE_KEYS})
        tokens = next((metrics[k] for k in TOKEN_KEYS if isinstance(metrics.get(k), (int, float))), None)
        done = min(step + 1, self.end_step) - self.start_step
        if done > self._done:  # a row after the last step (a final evaluation) does not count as a step
            self._tokens += float(tokens or 0)
            self._done = done
            if self.mode == "lines":
                print(self.line(), file=self.stream, flush=True)
        elif self.mode == "lines" and any(k in HEADLINE_KEYS for k in metrics):
            print(self.line(), file=self.stream, flush=True)
        self._refresh()

    # -- what is shown --------------------------------------------------------------------------------------
    @property
    def steps_done(self) -> int:
        """Steps of the planned run done so far (the resumed ones included)."""
        return self.start_step + self._done

    def seconds_per_step(self) -> float:
        elapsed = self._clock() - self._started
        return elapsed / self._done if self._done else math.nan

    def eta_seconds(self) -> float:
        """Time left for this invocation at the average pace of its steps so far."""
        return self.seconds_per_step() * (self.end_step - self.steps_done)

    def throughput(self) -> str:
        elapsed = self._clock() - self._started
        if not self._done or elapsed <= 0:
            return ""
        if self._tokens:
            return f"{self._tokens / elapsed:,.0f} tok/s"
        return f"{self._done / elapsed:.2f} steps/s"

    def headline(self) -> str:
        return " ".join(f"{k}={format_value(self._last[k])}" for k in HEADLINE_KEYS if k in self._last)

    def line(self) -> str:
        """The plain one-line form: ``name step 3/17 18% | 2.1 s/step | ETA 29s | 512 tok/s | train_mean_nll=...``."""
        total = max(self.total_steps, 1)
        parts = [f"{self.name} step {self.steps_done}/{self.total_steps} {100 * self.steps_done / total:.0f}%",
                 f"{self.seconds_per_step():.2f} s/step", f"ETA {format_duration(self.eta_seconds())}"]
        parts += [p for p in (self.throughput(), self.headline()) if p]
        return " | ".join(parts)

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(file=self.stream, force_terminal=True)
        self._bar = Progress(
            TextColumn("[bold]{task.fields[phase]:<10}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
            TextColumn("{task.fields[info]}"), console=console, refresh_per_second=4, transient=False,
        )
        self._task = self._bar.add_task(self.name, total=self.total_steps, completed=self.start_step,
                                        phase=self.current_phase, eta="?", info="")
        self._bar.start()

    def _refresh(self) -> None:
        if self._bar is None:
            return
        info = " | ".join(p for p in (self.throughput(), self.headline()) if p)
        self._bar.update(self._task, completed=self.steps_done, phase=self.current_phase,
                         eta=format_duration(self.eta_seconds()), info=info)


def current() -> RunProgress | None:
    """The display of the run open in this context, if any."""
    return _current.get()
