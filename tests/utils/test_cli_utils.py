import pytest

from tinker_cookbook.cli_utils import check_log_dir
from tinker_cookbook.exceptions import ConfigurationError


def _run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    return run


def test_missing_or_empty_dir_is_fresh(tmp_path):
    assert check_log_dir(tmp_path / "nope", "raise") == "fresh"
    (tmp_path / "empty").mkdir()
    assert check_log_dir(tmp_path / "empty", "raise") == "fresh"


def test_resume_keeps_and_delete_removes(tmp_path):
    run = _run_dir(tmp_path)
    assert check_log_dir(run, "resume") == "resume" and (run / "metrics.jsonl").exists()
    assert check_log_dir(run, "delete") == "fresh" and not run.exists()


def test_raise_names_the_setting(tmp_path):
    with pytest.raises(ConfigurationError, match="behavior_if_log_dir_exists=resume"):
        check_log_dir(_run_dir(tmp_path), "raise")


def test_ask_without_a_terminal_raises_instead_of_hanging(tmp_path):
    def no_input(prompt: str) -> str:
        raise AssertionError("must not prompt when stdin is not a terminal")

    with pytest.raises(ConfigurationError, match="not a terminal"):
        check_log_dir(_run_dir(tmp_path), "ask", input_fn=no_input, is_interactive=False)


def test_ask_on_a_terminal(tmp_path):
    run = _run_dir(tmp_path)
    answers = iter(["maybe", "r"])  # an unknown answer is asked again
    assert check_log_dir(run, "ask", input_fn=lambda _: next(answers), is_interactive=True) == "resume"
    assert check_log_dir(run, "ask", input_fn=lambda _: "d", is_interactive=True) == "fresh" and not run.exists()
    run = _run_dir(tmp_path)
    with pytest.raises(ConfigurationError, match="stopped on request"):
        check_log_dir(run, "ask", input_fn=lambda _: "q", is_interactive=True)
    assert run.exists()


def test_bad_behavior_value():
    with pytest.raises(ConfigurationError, match="behavior_if_log_dir_exists='maybe'"):
        check_log_dir(".", "maybe")  # type: ignore[arg-type]  # the bad value is the point

