"""The docs' learning-rate sweep: several ``sl_loop`` runs that differ only in ``learning_rate``, then a table and
a plot of their final losses.

    python -m recipes.lr_sweep                                  # the docs' six rates, 1e-5 .. 3e-3, one after another
                                                                # (six sl_loop runs of ~4 min each on CPU)
    python -m recipes.lr_sweep 'learning_rates=[1e-4,3e-4,1e-3]' model_name=tinker-cookbook/tiny-smollm2
    python -m recipes.lr_sweep collect_only=true                 # only read back finished runs, table and plot
    python -m recipes.lr_sweep --help                            # every key (the sl_loop ones too)

The docs' spelling, ``python -m tinker_cookbook.recipes.lr_sweep``, runs this same file. Each point is exactly the
docs' command ``python -m recipes.sl_loop learning_rate=<lr> log_path=<sweep_dir>/lr-<lr>`` (run one at a time: on a
CPU, parallel runs only share the same cores); every other key (``model_name=...``, ``batch_size=...``,
``behavior_if_log_dir_exists=resume``) is passed on to every point, and the first point stops the sweep with its
one ``Error:`` line if it is not an ``sl_loop`` key. You can as well launch the points yourself, in parallel
terminals as the docs do, and run ``collect_only=true`` afterwards.

``collect`` is the docs' "Collecting Results" snippet: every ``<sweep_dir>/*/metrics.jsonl`` whose run finished
(last ``progress`` >= 0.98) gives one row: ``learning_rate`` (from the run's ``config.json``), ``final_loss`` (the
last ``train_mean_nll``) and ``final_test_nll`` (the finished run's held-out loss). The rows are printed, written to
``<sweep_dir>/results.csv``, and plotted as the docs' "Final Loss vs Learning Rate" to
``<sweep_dir>/final_loss_vs_lr.png``; the runs' training curves are overlaid (``plot_metrics``, smoothed) in
``<sweep_dir>/train_mean_nll.png`` and ``.html``; the best rate is printed last.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import chz

from tinker_cookbook.cli_utils import Forward, run_recipe
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.utils import plot_metrics

DOCS_LEARNING_RATES = [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3]
FINISHED_PROGRESS = 0.98  # the docs' test that a run is complete
POINT = Forward(field="loop_args", module="recipes.sl_loop")


@chz.chz
class Config:
    """The sweep's settings; every other key is an ``sl_loop`` key, passed on to each point."""

    learning_rates: list[float] = chz.field(default_factory=lambda: list(DOCS_LEARNING_RATES))
    """One sl_loop run per rate (default: the docs' sweep, one order of magnitude either side of ~3e-4)."""
    sweep_dir: str = str(Path(tempfile.gettempdir()) / "sft-lr-sweep")
    """Each run writes to <sweep_dir>/lr-<rate>; results.csv and final_loss_vs_lr.png land here."""
    collect_only: bool = False
    """Skip the runs; only collect, tabulate and plot what is already in sweep_dir."""
    loop_args: list[str] = chz.field(default_factory=list)
    """The sl_loop key=value arguments shared by every point (its learning_rate and log_path are set per point)."""


def run_dir(sweep_dir: str | Path, learning_rate: float) -> Path:
    return Path(sweep_dir) / f"lr-{learning_rate}"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def collect(sweep_dir: str | Path, min_progress: float = FINISHED_PROGRESS) -> list[dict[str, Any]]:
    """One row per finished run under ``sweep_dir``, sorted by learning rate (the docs' collection snippet)."""
    rows = []
    for metrics_path in sorted(Path(sweep_dir).glob("*/metrics.jsonl")):
        metrics = _read_jsonl(metrics_path)
        if not metrics or metrics[-1].get("progress", 0.0) < min_progress:
            continue  # unfinished (or still running): its last loss is not a final loss
        config = json.loads((metrics_path.parent / "config.json").read_text())
        train_losses = [m["train_mean_nll"] for m in metrics if "train_mean_nll" in m]
        test_losses = [m["test/nll"] for m in metrics if "test/nll" in m]
        rows.append({
            "run": metrics_path.parent.name,
            "learning_rate": float(config["learning_rate"]),
            "final_loss": train_losses[-1] if train_losses else math.nan,
            "final_test_nll": test_losses[-1] if test_losses else math.nan,
        })
    return sorted(rows, key=lambda r: r["learning_rate"])


def write_report(rows: list[dict[str, Any]], sweep_dir: str | Path) -> Path:
    """Print the table, write results.csv and the plot; returns the plot's path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: sweeps run in terminals and batch jobs
    import matplotlib.pyplot as plt
    import pandas

    df = pandas.DataFrame(rows)
    print(f"Read metrics for {len(df)} experiments")
    print(df.to_string(index=False))
    df.to_csv(Path(sweep_dir) / "results.csv", index=False)
    fig, ax = plt.subplots()
    ax.plot(df["learning_rate"], df["final_loss"], marker="o")
    ax.axhline(y=df["final_loss"].min(), color="green", linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("Learning Rate (log scale)")
    ax.set_ylabel("Final Loss")
    ax.set_title("Final Loss vs Learning Rate")
    plot_path = Path(sweep_dir) / "final_loss_vs_lr.png"
    fig.savefig(plot_path)
    plt.close(fig)
    curves = plot_metrics.plot(plot_metrics.Config(
        paths=[str(Path(sweep_dir) / row["run"]) for row in rows], keys=["train_mean_nll"], smoothing=0.6,
        output=str(Path(sweep_dir) / "train_mean_nll.png"), title="Training loss per learning rate"))
    print(f"Training curves: {curves.png} and {curves.html}")
    optimal_lr = df["learning_rate"][df["final_loss"].idxmin()]
    print(f"The optimal LR is {optimal_lr:.2e}")
    return plot_path


def run_point(config: Config, learning_rate: float) -> None:
    """The docs' command for one point; a run that fails ends the sweep with its exit status (it has said why)."""
    args = [*config.loop_args, f"learning_rate={learning_rate}", f"log_path={run_dir(config.sweep_dir, learning_rate)}"]
    result = subprocess.run([sys.executable, "-m", POINT.module, *args], check=False)
    if result.returncode != 0:
        raise SystemExit(result.returncode)


def main(config: Config) -> None:
    if not config.collect_only:
        for lr in config.learning_rates:
            run_point(config, lr)
    rows = collect(config.sweep_dir)
    if not rows:
        raise ConfigurationError(f"sweep_dir={config.sweep_dir!r} holds no finished run (metrics.jsonl whose last "
                                 f"progress is >= {FINISHED_PROGRESS}); run the sweep first or wait for it to end")
    write_report(rows, config.sweep_dir)


if __name__ == "__main__":
    run_recipe(main, forward=POINT)
