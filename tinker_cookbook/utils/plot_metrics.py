"""Plot metrics of one or more runs against ``step``: overlaid, optionally smoothed, as a PNG and a self-contained HTML.

    python -m tinker_cookbook.utils.plot_metrics paths=/tmp/tinker-examples/sl_basic keys=train_mean_nll,test/nll
    python -m tinker_cookbook.utils.plot_metrics 'paths=/tmp/sft-lr-sweep/lr-*' keys=train_mean_nll smoothing=0.6
    python -m tinker_cookbook.utils.plot_metrics paths=runA,runB keys=test/nll output=compare.png logy=true

``paths`` are run directories, ``metrics.jsonl`` files or glob patterns of either (quote a pattern, or the shell
expands it first). Every run gets a colour and every key a line style, so several runs and keys share one plot.
Keys logged only at some steps (``test/nll``) are drawn through the steps that have them. ``smoothing`` is the
exponential moving average weight of TensorBoard's slider (0: raw values; the raw curve stays faint behind the
smoothed one). The PNG goes to ``output`` (default: ``<keys>.png`` in the run's directory, or in the runs' common
parent for several runs), the HTML (an inline SVG and a table of each run's last and best values; no network
needed to view it) next to it with ``.html``.
"""

from __future__ import annotations

import glob
import html
import io
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import chz

from tinker_cookbook.exceptions import ConfigurationError, DataError
from tinker_cookbook.utils.ml_log import METRICS_FILE, format_value, read_metrics

logger = logging.getLogger(__name__)

LINE_STYLES = ("-", "--", ":", "-.")


@chz.chz
class Config:
    """Plot metrics of one or more runs (overlaid, optionally smoothed) to a PNG and a self-contained HTML."""

    paths: list[str]
    """Run directories, metrics.jsonl files or glob patterns of them (``'/tmp/sweep/lr-*'``), comma-separated."""
    keys: list[str] = chz.field(default_factory=lambda: ["train_mean_nll", "test/nll"])
    """The metrics to draw (each run's metrics.jsonl names them; an unknown key lists the available ones)."""
    smoothing: float = 0.0
    """Exponential moving average weight in [0, 1): 0 draws the raw values, 0.6-0.9 smooths noisy curves."""
    output: str | None = None
    """The PNG to write (None: ``<keys>.png`` in the run's directory, or in the common parent of several runs)."""
    html: bool = True
    """Also write a self-contained HTML page next to the PNG (same name, ``.html``)."""
    logy: bool = False
    """Logarithmic y axis."""
    title: str | None = None
    """The plot's title (None: the run's name, or the number of runs)."""

    @chz.validate
    def _check(self) -> None:
        if not self.paths:
            raise ConfigurationError("paths is empty; pass a run directory, e.g. paths=/tmp/tinker-examples/sl_basic")
        if not self.keys:
            raise ConfigurationError("keys is empty; pass the metrics to draw, e.g. keys=train_mean_nll,test/nll")
        if not 0.0 <= self.smoothing < 1.0:
            raise ConfigurationError(f"smoothing={self.smoothing} must be in [0, 1) (0: no smoothing)")
        if self.output is not None and Path(self.output).suffix.lower() != ".png":
            raise ConfigurationError(f"output={self.output!r} must end in .png (the HTML is written next to it)")


@dataclass(frozen=True)
class RunMetrics:
    """One run's rows, with the label it has in the legend."""

    label: str
    source: Path
    rows: list[dict[str, Any]]


@dataclass(frozen=True)
class PlotFiles:
    png: Path
    html: Path | None


def metrics_file(path: str | Path) -> Path:
    """``path`` itself, or the metrics.jsonl in it when it is a directory."""
    path = Path(path).expanduser()
    return path / METRICS_FILE if path.is_dir() else path


def find_runs(paths: Sequence[str]) -> list[Path]:
    """The metrics files that ``paths`` name (globs expanded, in sorted order), each once; a path or pattern that
    names no metrics file is an error that says which."""
    found: list[Path] = []
    for spec in paths:
        if glob.has_magic(spec):  # a pattern names run directories and .jsonl files, never the plots next to them
            expanded = [p for p in sorted(glob.glob(os.path.expanduser(spec))) if Path(p).is_dir() or p.endswith(".jsonl")]
        else:
            expanded = [spec]
        files = [metrics_file(p) for p in expanded if metrics_file(p).is_file()]
        if not files:
            what = "matches no run directory with" if glob.has_magic(spec) else "has no"
            raise ConfigurationError(f"paths: {spec!r} {what} {METRICS_FILE}; pass a run's log_path")
        found += [f for f in files if f.resolve() not in {g.resolve() for g in found}]
    return found


def _labels(files: list[Path]) -> list[str]:
    """Each run's directory name, or the shortest tail of its path that tells it apart from the others."""
    dirs = [f.parent if f.name == METRICS_FILE else f.with_suffix("") for f in files]
    for depth in range(1, max(len(d.resolve().parts) for d in dirs) + 1):
        labels = ["/".join(d.resolve().parts[-depth:]) for d in dirs]
        if len(set(labels)) == len(labels):
            return labels
    return [str(d) for d in dirs]


def load_runs(paths: Sequence[str]) -> list[RunMetrics]:
    files = find_runs(paths)
    return [RunMetrics(label, f, read_metrics(f.parent) if f.name == METRICS_FILE else _read_jsonl(f))
            for label, f in zip(_labels(files), files, strict=True)]


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of the rows that have ``key`` (and a step)."""
    points = [(row["step"], row[key]) for row in rows if key in row and row[key] is not None and "step" in row]
    return [float(s) for s, _ in points], [float(v) for _, v in points]


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average with TensorBoard's debiasing: ``s_t = w s_{t-1} + (1 - w) x_t`` from ``s_0 = 0``,
    divided by ``1 - w^t`` so the first points are not pulled towards 0. NaNs are passed through and skipped."""
    if weight == 0:
        return list(values)
    out, acc, n = [], 0.0, 0
    for x in values:
        if math.isnan(x):
            out.append(x)
            continue
        n += 1
        acc = weight * acc + (1 - weight) * x
        out.append(acc / (1 - weight**n))
    return out


def _check_keys(runs: list[RunMetrics], keys: Sequence[str]) -> None:
    available = sorted({key for run in runs for row in run.rows for key in row} - {"step"})
    missing = [key for key in keys if not any(series(run.rows, key)[0] for run in runs)]
    if missing:
        where = runs[0].source if len(runs) == 1 else f"any of the {len(runs)} runs"
        raise DataError(f"keys {missing} are not in {where}; available keys: {available}")
    for run in runs:
        for key in keys:
            if not series(run.rows, key)[0]:
                logger.warning("run %s has no %s; drawn without it", run.label, key)


def _default_output(runs: list[RunMetrics], keys: Sequence[str]) -> Path:
    name = "_".join(key.replace("/", "-") for key in keys) + ".png"
    dirs = [run.source.parent for run in runs]
    folder = dirs[0] if len(dirs) == 1 else Path(os.path.commonpath([str(d.resolve()) for d in dirs]))
    return folder / name


def _figure(runs: list[RunMetrics], config: Config) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for r, run in enumerate(runs):
        for k, key in enumerate(config.keys):
            steps, values = series(run.rows, key)
            if not steps:
                continue
            color, style = colors[r % len(colors)], LINE_STYLES[k % len(LINE_STYLES)]
            label = key if len(runs) == 1 else (run.label if len(config.keys) == 1 else f"{run.label}: {key}")
            marker = "o" if len(steps) < 30 else None
            if config.smoothing > 0:
                ax.plot(steps, values, color=color, linestyle=style, alpha=0.25, linewidth=1)
                values = smooth(values, config.smoothing)
                marker = None
            ax.plot(steps, values, color=color, linestyle=style, marker=marker, markersize=3, label=label)
    ax.set_xlabel("step")
    if config.logy:
        ax.set_yscale("log")
    default_title = runs[0].label if len(runs) == 1 else f"{len(runs)} runs"
    ax.set_title(config.title or default_title + (f" (smoothing {config.smoothing:g})" if config.smoothing else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def summary_rows(runs: list[RunMetrics], keys: Sequence[str]) -> list[tuple[str, str, float, float, int]]:
    """``(run, key, last value, lowest value, points)`` for each run and key it has."""
    rows = []
    for run in runs:
        for key in keys:
            steps, values = series(run.rows, key)
            if steps:
                rows.append((run.label, key, values[-1], min(values), len(values)))
    return rows


def _html_page(title: str, svg: str, runs: list[RunMetrics], keys: Sequence[str]) -> str:
    cells = "".join(
        f"<tr><td>{html.escape(run)}</td><td>{html.escape(key)}</td><td>{format_value(last)}</td>"
        f"<td>{format_value(low)}</td><td>{n}</td></tr>"
        for run, key, last, low, n in summary_rows(runs, keys))
    sources = "".join(f"<li>{html.escape(run.label)}: <code>{html.escape(str(run.source))}</code></li>" for run in runs)
    style = ("body{font-family:sans-serif;margin:2em;max-width:60em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}td:first-child,td:nth-child(2)"
             "{text-align:left}svg{max-width:100%;height:auto}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1>\n{svg}\n"
            "<h2>Values</h2><table><tr><th>run</th><th>key</th><th>last</th><th>lowest</th><th>points</th></tr>"
            f"{cells}</table><h2>Runs</h2><ul>{sources}</ul></body></html>\n")


def plot(config: Config) -> PlotFiles:
    """Draw the plot; returns where the PNG (and the HTML) were written."""
    import matplotlib

    if "matplotlib_inline" not in matplotlib.get_backend():
        matplotlib.use("Agg")  # files only; in a notebook the inline backend stays
    import matplotlib.pyplot as plt

    runs = load_runs(config.paths)
    _check_keys(runs, config.keys)
    output = Path(config.output).expanduser() if config.output else _default_output(runs, config.keys)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig = _figure(runs, config)
    fig.savefig(output, dpi=120)
    html_path = None
    if config.html:
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg")
        svg = buffer.getvalue()
        svg = svg[svg.index("<svg"):]  # the XML prologue does not belong inside an HTML page
        html_path = output.with_suffix(".html")
        html_path.write_text(_html_page(fig.axes[0].get_title(), svg, runs, config.keys))
    plt.close(fig)
    return PlotFiles(output, html_path)


def _read_jsonl(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(config: Config) -> None:
    files = plot(config)
    print(f"wrote {files.png}" + (f" and {files.html}" if files.html else ""))


if __name__ == "__main__":
    from tinker_cookbook.cli_utils import run_recipe

    run_recipe(main)
