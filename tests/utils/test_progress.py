"""The run progress display: plain lines off a terminal, a live bar in a pseudo-terminal, phases, ETA."""

import io
import os
import pty
import select
import subprocess
import sys
import textwrap

import pytest

from tinker_cookbook.utils import progress
from tinker_cookbook.utils.progress import RunProgress, format_duration, resolve_mode


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_mode_prints_one_line_per_step_with_eta_and_throughput():
    clock, out = _Clock(), io.StringIO()
    # A run resumed at step 2 of 10, stopping at 6: four steps in this invocation, 2 s each.
    with RunProgress("lines", start_step=2, end_step=6, total_steps=10, name="sft", stream=out, clock=clock) as prog:
        for step in range(2, 6):
            clock.now += 2.0
            prog.log_metrics({"num_tokens": 100, "train_mean_nll": 1.0 / (step + 1)}, step=step)
        clock.now += 1.0
        prog.log_metrics({"test/nll": 0.5}, step=6)  # the final evaluation's row: not a step
    lines = out.getvalue().splitlines()
    # 3 steps done after step 2 at 2 s/step: 3 left to step 6 -> ETA 6 s; 100 tokens per 2 s = 50 tok/s.
    assert lines[0] == "sft step 3/10 30% | 2.00 s/step | ETA 6s | 50 tok/s | train_mean_nll=0.333333"
    assert lines[3] == "sft step 6/10 60% | 2.00 s/step | ETA 0s | 50 tok/s | train_mean_nll=0.166667"
    # The evaluation row adds its metric to a fifth line without counting a step (9 s for 4 steps).
    assert lines[4].startswith("sft step 6/10 60% | 2.25 s/step")
    assert lines[4].endswith("train_mean_nll=0.166667 test/nll=0.5")
    assert len(lines) == 5


def test_rl_throughput_counts_the_batch_sampled_tokens_not_the_mean_per_turn():
    clock, out = _Clock(), io.StringIO()
    with RunProgress("lines", start_step=0, end_step=2, total_steps=2, name="rl", stream=out, clock=clock) as prog:
        for step in range(2):
            clock.now += 4.0
            prog.log_metrics({"env/all/ac_tokens_per_turn": 8.0, "env/all/total_ac_tokens": 400.0,
                              "env/all/reward/total": 0.5}, step=step)
    # 400 sampled tokens per 4 s step = 100 tok/s (the per-turn mean, 8, would show 2 tok/s).
    assert out.getvalue().splitlines()[1] == "rl step 2/2 100% | 4.00 s/step | ETA 0s | 100 tok/s | env/all/reward/total=0.5"


def test_phase_marks_the_open_display_and_is_a_no_op_without_one():
    with progress.phase("sampling"):  # no run open: nothing to mark, no error
        assert progress.current() is None
    with RunProgress("off", 0, 3, stream=io.StringIO()) as prog:
        assert progress.current() is prog
        with progress.phase("evaluating"):
            assert prog.current_phase == "evaluating"
            with progress.phase("saving"):
                assert prog.current_phase == "saving"
            assert prog.current_phase == "evaluating"
        assert prog.current_phase == "starting"
    assert progress.current() is None


def test_table_mode_keeps_the_per_step_metrics_table(capsys):
    with RunProgress("table", 0, 2, stream=io.StringIO()) as prog:
        prog.log_metrics({"train_mean_nll": 0.25, "learning_rate": 1e-4}, step=0)
    out = capsys.readouterr().out
    assert "step 0" in out and "train_mean_nll" in out and "1.0000e-04" in out


def test_auto_mode_and_bad_modes():
    assert resolve_mode("auto", io.StringIO()) == "lines"
    assert resolve_mode("table") == "table"
    with pytest.raises(ValueError, match="progress='fancy' must be one of"):
        resolve_mode("fancy")
    assert [format_duration(s) for s in (5, 65, 3725, float("nan"))] == ["5s", "1m05s", "1h02m", "?"]


def test_auto_mode_in_a_pseudo_terminal_draws_a_live_bar():
    script = textwrap.dedent("""
        from tinker_cookbook.utils.progress import RunProgress, phase
        with RunProgress("auto", 0, 3, name="demo") as prog:
            assert prog.mode == "bar", prog.mode
            for step in range(3):
                with phase("sampling"):
                    pass
                prog.log_metrics({"train_mean_nll": 0.5, "num_tokens": 10}, step=step)
    """)
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=follower, stderr=subprocess.PIPE, env=env,
                            cwd=os.getcwd())
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(60) == 0, proc.stderr.read().decode() if proc.stderr else ""
    text = b"".join(chunks).decode(errors="replace")
    assert "\x1b[" in text  # terminal control sequences: a live display, not plain lines
    assert "3/3" in text and "ETA" in text and "tok/s" in text and "train_mean_nll=0.5" in text
    assert "demo step" not in text  # the plain-line form is for non-terminals only
