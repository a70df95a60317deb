"""Every repository path, Python module and command that README.md and docs/*.md name exists or runs.

Paths must exist; markdown links must reach an existing file (and heading, for ``#anchor`` links); dotted names
under ``tinker_cookbook`` or ``recipes`` must resolve to a module (and attribute); and each distinct command
(``.venv/bin/python -m MODULE``, ``.venv/bin/python bench/SCRIPT.py``, ``.venv/bin/tinker-cookbook SUB``, and every
runnable recipe module named) must answer ``--help`` with exit status 0, listing every key and flag the docs give it.
The ``--help`` runs are one subprocess per distinct command, run concurrently.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Top-level entries a path may start with: a path whose first part is one of these is a claim about this repository.
REPO_ENTRIES = ("scripts", "example-data", "bench", "tests", "recipes", "tinker_cookbook", ".ci", "notebooks", "docs",
                "pyproject.toml", "requirements-assets.txt", "README.md")
HELP_TIMEOUT_S = 300
CLI = "import sys; from tinker_cookbook.cli import main; sys.exit(main(sys.argv[1:]))"


def _rel(doc: Path) -> str:
    return str(doc.relative_to(REPO))


def _code(text: str) -> str:
    """The text of every fenced block and inline code span (where names of code appear)."""
    blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.DOTALL)
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    return "\n".join(blocks + re.findall(r"`([^`\n]+)`", prose))


def _prose(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


# -- paths ---------------------------------------------------------------------------------------------------------

# Sub-packages of tinker_cookbook: a source file named from one of them (`engine/training.py`) is a claim too.
SUBPACKAGES = tuple(p.name for p in (REPO / "tinker_cookbook").iterdir() if (p / "__init__.py").exists())


def _repo_paths(text: str) -> set[str]:
    """Repository paths the text names, relative to the repository root."""
    tokens = {t.rstrip(".") for t in re.findall(r"(?<![\w/~.\-])[\w.\-]+(?:/[\w.\-<>]*)+", text) if "<" not in t}
    sources = {f"tinker_cookbook/{t}" for t in tokens
               if t.split("/")[0] in SUBPACKAGES and t.endswith((".py", ".c")) and not (REPO / t).exists()}
    return {t for t in tokens if t.split("/")[0] in REPO_ENTRIES} | sources


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", _prose(doc.read_text()), re.MULTILINE)}


def _broken_links(doc: Path) -> list[str]:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(doc.read_text())):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target} (no heading #{anchor} in {file.name})")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_paths_exist(doc: Path) -> None:
    missing = sorted(p for p in _repo_paths(doc.read_text()) if not (REPO / p).exists())
    assert not missing, f"{_rel(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_links_reach_a_file_and_heading(doc: Path) -> None:
    broken = _broken_links(doc)
    assert not broken, f"{_rel(doc)} has broken links: {broken}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = (REPO / "README.md").read_text()
    unlinked = [_rel(d) for d in DOCS[1:] if f"]({_rel(d)})" not in readme]
    assert not unlinked, f"README.md does not link {unlinked}"


# Words about how the project was built rather than what it is: tracker numbers, who worked on it, and commit
# hashes (a 7-40 character hex word with both a digit and a letter).
MAKING_OF = re.compile(r"\bissue \d+|\bagents?\b|\bother jobs\b|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b",
                       re.IGNORECASE)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_docs_describe_the_project_not_its_making(doc: Path) -> None:
    found = sorted({m.group(0) for m in MAKING_OF.finditer(doc.read_text())})
    assert not found, f"{_rel(doc)}: {found}"


# -- modules -------------------------------------------------------------------------------------------------------

def _dotted_names(text: str) -> set[str]:
    names = re.findall(r"(?<![\w/.\-])(?:tinker_cookbook|recipes)(?:\.[A-Za-z_]\w*)+", _code(text))
    return {n for n in names if not n.endswith((".md", ".py"))}


def _resolve(name: str) -> str | None:
    """None when ``name`` is a module, or a module's attribute; else what is missing."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        module_name = ".".join(parts[:end])
        try:
            found = importlib.util.find_spec(module_name) is not None
        except ModuleNotFoundError:  # a parent is a module, not a package
            found = False
        if not found:
            continue
        obj: object = importlib.import_module(module_name)
        for i, attr in enumerate(parts[end:], start=end):
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[: i + 1])} (no attribute {attr!r} of {'.'.join(parts[:i])})"
            obj = getattr(obj, attr)
        return None
    return f"{name} (no such module)"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_modules_and_names_resolve(doc: Path) -> None:
    unresolved = sorted(filter(None, (_resolve(n) for n in _dotted_names(doc.read_text()))))
    assert not unresolved, f"{_rel(doc)} names what does not exist: {unresolved}"


# -- commands ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    """One distinct program the docs run."""

    kind: str  # "module", "script" or "cli"
    target: str  # a module name, a script path, or the CLI's subcommand words ("" for the CLI itself)

    def __str__(self) -> str:
        return {"module": f"-m {self.target}", "script": self.target, "cli": f"tinker-cookbook {self.target}"}[
            self.kind].strip()


@dataclass
class Usage:
    """What the docs pass to one command: every argument, and each distinct set of ``key=value`` arguments."""

    args: list[str] = field(default_factory=list)
    key_value_sets: list[tuple[str, ...]] = field(default_factory=list)


@dataclass(frozen=True)
class HelpRun:
    args: tuple[str, ...]  # the key=value arguments given before --help
    code: int
    output: str


def _command_lines(text: str) -> list[str]:
    """Every command: the lines of bash blocks (with continuations joined) and inline code that runs .venv/bin."""
    blocks = [b.replace("\\\n", " ") for b in re.findall(r"```bash\n(.*?)```", text, re.DOTALL)]
    lines = [line.split(" #")[0].strip() for block in blocks for line in block.splitlines()]
    inline = [s for s in re.findall(r"`([^`\n]+)`", _prose(text)) if ".venv/bin/" in s]
    # A pipeline or command substitution runs several programs; `python -c "..."` code is not split.
    parts = [p.strip() for c in lines + inline for p in re.split(r"&&|\$\(|\|(?=\s*\.venv/)", c)]
    return [p for p in parts if p.startswith(".venv/bin/")]


def _normalized_module(module: str) -> str:
    # The documentation's spelling runs the same file as the recipes package's (tinker_cookbook/recipes/__init__.py).
    return module.removeprefix("tinker_cookbook.") if module.startswith("tinker_cookbook.recipes.") else module


def _cli_words(words: list[str]) -> list[tuple[Command, list[str]]]:
    """``tinker-cookbook [--format json] SUB [SUBSUB] ARGS``: the global options go to the CLI itself."""
    global_options: list[str] = []
    while words and words[0].startswith("-") and words[0] != "--help":
        global_options.append(words.pop(0))
        if words and not words[0].startswith("-") and "=" not in global_options[-1]:
            global_options.append(words.pop(0))  # its value
    subcommands: list[str] = []
    while words and len(subcommands) < 2 and re.fullmatch(r"[a-z][a-z-]*", words[0]):
        subcommands.append(words.pop(0))
    used = [(Command("cli", " ".join(subcommands)), words)]
    return used + [(Command("cli", ""), global_options)] if global_options else used


def _parse(line: str) -> list[tuple[Command, list[str]]]:
    """The programs a command line runs, each with the arguments it gets; [] for programs not checked here."""
    words = shlex.split(line)
    if words[0] == ".venv/bin/python" and len(words) > 2 and words[1] == "-m" and words[2] != "pytest":
        return [(Command("module", _normalized_module(words[2])), words[3:])]
    if words[0] == ".venv/bin/python" and len(words) > 1 and words[1].endswith(".py"):
        return [(Command("script", words[1]), words[2:])]
    if words[0] == ".venv/bin/tinker-cookbook":
        return _cli_words(words[1:])
    return []


def _is_runnable_module(module: str) -> bool:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    return spec is not None and spec.submodule_search_locations is None


def _key_values(args: list[str]) -> tuple[str, ...]:
    return tuple(a for a in args if "=" in a and not a.startswith("-"))


def _documented_commands() -> dict[Command, Usage]:
    """Each distinct command the docs run, and what they pass to it; every runnable recipe module named counts."""
    found: dict[Command, Usage] = {}
    for doc in DOCS:
        text = doc.read_text()
        for line in _command_lines(text):
            for command, args in _parse(line):
                if "<" in command.target:  # recipes.<name>
                    continue
                usage = found.setdefault(command, Usage())
                usage.args.extend(args)
                if _key_values(args) not in usage.key_value_sets:
                    usage.key_value_sets.append(_key_values(args))
        for name in sorted(_dotted_names(text)):  # sorted: the same test order in every process (xdist workers)
            module = _normalized_module(name)
            if module.startswith("recipes.") and _is_runnable_module(module):
                found.setdefault(Command("module", module), Usage(key_value_sets=[()]))
    return found


COMMANDS = _documented_commands()

# Runs a module's `--help` once per set of documented arguments in one process, as `python -m` would (so that each
# module is imported once): a JSON list of {"args", "code", "output"} on the last line of stdout.
MODULE_HELP_DRIVER = """
import contextlib, io, json, runpy, sys, traceback
module, runs = sys.argv[1], json.loads(sys.argv[2])
results = []
for args in runs:
    out = io.StringIO()
    sys.argv = [module, *args, "--help"]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except Exception:
            traceback.print_exc()
            code = 1
    results.append({"args": args, "code": code, "output": out.getvalue()})
print(json.dumps(results))
"""


def _run_help(command: Command) -> list[HelpRun]:
    env = {**os.environ, "TINKER_COOKBOOK_NO_REEXEC": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    if command.kind == "module":
        runs = COMMANDS[command].key_value_sets
        argv = [sys.executable, "-c", MODULE_HELP_DRIVER, command.target, json.dumps(runs)]
    elif command.kind == "script":
        argv = [sys.executable, command.target, "--help"]
    else:
        argv = [sys.executable, "-c", CLI, *command.target.split(), "--help"]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=HELP_TIMEOUT_S)
    if command.kind != "module":
        return [HelpRun((), done.returncode, done.stdout + done.stderr)]
    if done.returncode != 0:
        return [HelpRun((), done.returncode, done.stdout + done.stderr)]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return [HelpRun(tuple(r["args"]), r["code"], r["output"]) for r in results]


@pytest.fixture(scope="module")
def help_runs() -> dict[Command, list[HelpRun]]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return dict(zip(COMMANDS, pool.map(_run_help, COMMANDS)))


def _listed(arg: str, help_text: str) -> bool:
    """Whether the help lists a ``key=value`` key (chz: ``  key: type``, or ``(or key)``) or a ``--flag``."""
    if arg.startswith("--"):
        flag = arg.split("=", 1)[0]
        return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None
    key = re.escape(arg.split("=", 1)[0])
    return re.search(rf"^\s+(\S+\.)?{key}(\s|:)", help_text, re.MULTILINE) is not None or re.search(
        rf"\(or {key}\)", help_text) is not None


def _flags(args: list[str]) -> list[str]:
    """The ``--flags`` to look up: the first ``--`` ends a script's own options (bench_rl passes the rest on)."""
    if "--" in args:
        args = args[: args.index("--")]
    return [a for a in args if a.startswith("--") and a != "--help"]


def test_there_are_commands_of_every_kind() -> None:
    kinds = {c.kind for c in COMMANDS}
    assert kinds == {"module", "script", "cli"}, kinds
    assert Command("module", "recipes.sl_basic") in COMMANDS


@pytest.mark.parametrize("command", list(COMMANDS), ids=str)
def test_command_answers_help_and_lists_its_documented_keys(command: Command, help_runs) -> None:
    for run in help_runs[command]:
        shown = f"{command} {' '.join(run.args)} --help"
        assert run.code == 0, f"{shown} exited {run.code}:\n{run.output[-2000:]}"
        assert not re.search(r"^Error|Error with the arguments given", run.output, re.MULTILINE), (
            f"{shown}:\n{run.output[-2000:]}")
        asked = [*run.args, *_flags(COMMANDS[command].args)]
        unlisted = sorted({a.split("=", 1)[0] for a in asked if not _listed(a, run.output)})
        assert not unlisted, f"{shown}: its --help does not list {unlisted}:\n{run.output[-3000:]}"
