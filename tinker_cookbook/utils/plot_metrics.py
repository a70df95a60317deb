"""Plot chosen keys of a run's ``metrics.jsonl`` against ``step`` and save a PNG.

    python -m tinker_cookbook.utils.plot_metrics path=/tmp/tinker-examples/sl_basic keys=train_mean_nll,test/nll
    python -m tinker_cookbook.utils.plot_metrics path=run/metrics.jsonl keys=learning_rate output=lr.png logy=true

``path`` is a log directory or a ``metrics.jsonl`` file; the PNG goes to ``output`` (default: ``<log dir>/<keys>.png``).
Keys logged only at some steps (``test/nll``) are drawn through the steps that have them.
"""

from __future__ import annotations

from pathlib import Path

import chz

from tinker_cookbook.utils.ml_log import METRICS_FILE, read_metrics


@chz.chz
class Config:
    path: str
    keys: list[str] = chz.field(default_factory=lambda: ["train_mean_nll", "test/nll"])
    output: str | None = None
    logy: bool = False
    title: str | None = None


def metrics_file(path: str | Path) -> Path:
    path = Path(path)
    return path / METRICS_FILE if path.is_dir() else path


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of the rows that have ``key`` (and a step)."""
    points = [(row["step"], row[key]) for row in rows if key in row and row[key] is not None and "step" in row]
    return [float(s) for s, _ in points], [float(v) for _, v in points]


def plot(config: Config) -> Path:
    """Draw the plot and return where the PNG was written."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    source = metrics_file(config.path)
    if not source.is_file():
        raise FileNotFoundError(f"path={config.path!r}: no {METRICS_FILE} there")
    rows = read_metrics(source.parent) if source.name == METRICS_FILE else _read_other(source)
    available = sorted({key for row in rows for key in row} - {"step"})
    missing = [key for key in config.keys if not series(rows, key)[0]]
    if missing:
        raise ValueError(f"keys {missing} are not in {source}; available keys: {available}")
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in config.keys:
        steps, values = series(rows, key)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key)
    ax.set_xlabel("step")
    if config.logy:
        ax.set_yscale("log")
    ax.set_title(config.title or str(source.parent.name))
    ax.grid(alpha=0.3)
    ax.legend()
    default_name = "_".join(key.replace("/", "-") for key in config.keys) + ".png"
    output = Path(config.output) if config.output else source.parent / default_name
    fig.tight_layout()
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def _read_other(path: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(config: Config) -> None:
    print(f"wrote {plot(config)}")


if __name__ == "__main__":
    chz.nested_entrypoint(main)
