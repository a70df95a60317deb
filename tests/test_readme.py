"""The README's commands run as written on a fresh clone (after ``bash scripts/install.sh``)."""

from __future__ import annotations

import re
import runpy
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
# Top-level entries of the repository that the README may point into (plus docs/, which must not be pointed to
# unless it exists).
REPO_DIRS = ("scripts", "example-data", "bench", "tests", "recipes", "tinker_cookbook", ".ci", "notebooks", "docs")


# CI (.ci/run) and people on a fresh clone run these two lines exactly as written.
TWO_COMMANDS = ("bash scripts/install.sh && .venv/bin/python -m recipes.sl_basic",
                "bash scripts/install.sh && .venv/bin/python -m pytest")
MAX_LINES = 350


def _code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.DOTALL)


def _commands() -> list[str]:
    """Every command: the lines of bash blocks, and inline code that runs a program."""
    # A line ending in a backslash continues on the next one (one command).
    blocks = [block.replace("\\\n", " ") for block in _code_blocks("bash")]
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    prose = re.sub(r"```.*?```", "", README, flags=re.DOTALL).replace("\n", " ")
    inline = [span for span in re.findall(r"`([^`]+)`", prose)
              if re.search(r"\bpython\b|\bpytest\b|tinker-cookbook |\.sh\b", span) and " " in span]
    return [c for c in lines + inline if c]


def test_the_two_commands_are_given_verbatim_and_ci_runs_the_tests_one():
    lines = {line.strip() for block in _code_blocks("bash") for line in block.splitlines()}
    assert set(TWO_COMMANDS) <= lines, TWO_COMMANDS
    assert TWO_COMMANDS[1] in (REPO / ".ci" / "run").read_text()


def test_a_newcomer_can_read_it_through():
    """Short enough to read, with a table of contents whose entries are the README's own sections."""
    assert len(README.splitlines()) <= MAX_LINES
    contents = README.split("## Contents", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"\[([^]]+)\]\(#", contents)
    sections = re.findall(r"^## (.+)$", README, re.MULTILINE)
    assert len(entries) >= 6 and all(entry in sections for entry in entries), (entries, sections)


def test_every_command_names_the_environment_it_runs_in():
    runs_a_program = re.compile(r"(^|&&\s*|\$\(|\|\s*)(python3?|pytest|tinker-cookbook)\b")
    bare = [c for c in _commands() if runs_a_program.search(c)]
    assert not bare, f"run these as .venv/bin/...: {bare}"
    assert any(c.startswith(".venv/bin/python -m recipes.") for c in _commands())


def test_paths_the_readme_points_to_exist():
    tokens = re.findall(r"[\w.\-]+(?:/[\w.\-<>]*)+", README)
    missing = sorted({t for t in tokens if t.split("/")[0] in REPO_DIRS and "<" not in t
                      and not (REPO / t).exists()})
    assert not missing, missing


def _recipe_commands() -> list[list[str]]:
    commands = []
    for command in _commands():
        words = shlex.split(command.split("&&")[-1])
        if words[:2] == [".venv/bin/python", "-m"] and words[2].startswith("recipes.") and "<name>" not in words[2]:
            commands.append(words[2:])
    return commands


@pytest.mark.parametrize("command", _recipe_commands(), ids=lambda words: " ".join(words))
def test_recipe_commands_parse(command, monkeypatch, capsys):
    # --help builds the config from the arguments as given (and reports any error) without training.
    monkeypatch.setenv("TINKER_COOKBOOK_NO_REEXEC", "1")
    monkeypatch.setattr("sys.argv", [command[0], *command[1:], "--help"])
    runpy.run_module(command[0], run_name="__main__", alter_sys=True)
    out = capsys.readouterr().out
    assert f"Usage: python -m {command[0]}" in out and "Error with the arguments given" not in out, out[-500:]
    for arg in command[1:]:
        key = arg.split("=", 1)[0]
        assert re.search(rf"^  (\S+\.)?{re.escape(key)}( \(or \w+\))?: ", out, re.MULTILINE) or re.search(
            rf"\(or {re.escape(key)}\)", out), f"{key} is not a listed key"


def test_cookbook_snippet_runs():
    [snippet] = [b for b in _code_blocks("python") if "renderers.get_renderer" in b]
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)  # noqa: S102 - running the README's own code
    assert namespace["ok"] and namespace["message"]["content"] == "4"
    assert sum(namespace["weights"].tolist()) > 0


@pytest.mark.slow
def test_api_snippet_runs():
    [snippet] = [b for b in _code_blocks("python") if "create_lora_training_client" in b]
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)  # noqa: S102 - running the README's own code
    assert namespace["path"].startswith("tinker://") and namespace["sampling_client"] is not None
