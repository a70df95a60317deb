"""Command-line helpers shared by the training loops and recipes.

``check_log_dir`` applies the policy for a ``log_path`` that already holds a run
(``behavior_if_log_dir_exists``):

- ``resume``: keep it; the loop continues from the last complete checkpoint in ``checkpoints.jsonl``
  (or starts over when there is none, keeping the old files);
- ``delete``: remove it and start a fresh run;
- ``raise``: stop with an error;
- ``ask``: ask on the terminal (resume / delete / quit). When stdin is not a terminal (a batch job, a pipe, CI)
  there is nobody to answer, so ``ask`` behaves like ``raise`` and the message says which setting to pass.
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

from tinker_cookbook.exceptions import ConfigurationError

if TYPE_CHECKING:
    import chz

logger = logging.getLogger(__name__)

LogdirBehavior: TypeAlias = Literal["delete", "resume", "ask", "raise"]
LOGDIR_BEHAVIORS: tuple[str, ...] = get_args(LogdirBehavior)
LogdirDecision: TypeAlias = Literal["fresh", "resume"]


def _holds_a_run(log_dir: Path) -> bool:
    return log_dir.is_dir() and any(log_dir.iterdir())


def _ask(log_dir: Path, input_fn: Callable[[str], str]) -> LogdirDecision:
    prompt = f"Log directory {log_dir} already holds a run. [r]esume it, [d]elete it and start over, or [q]uit? "
    while True:
        answer = input_fn(prompt).strip().lower()
        if answer in ("r", "resume", "y", "yes"):
            return "resume"
        if answer in ("d", "delete"):
            shutil.rmtree(log_dir)
            return "fresh"
        if answer in ("q", "quit", "n", "no", ""):
            raise ConfigurationError(f"not touching the existing run in log_path={str(log_dir)!r}; stopped on request")


def check_log_dir(
    log_dir: str | Path,
    behavior_if_exists: LogdirBehavior,
    input_fn: Callable[[str], str] = input,
    is_interactive: bool | None = None,
) -> LogdirDecision:
    """Apply the log-dir policy; returns ``"resume"`` when an existing run is kept, else ``"fresh"``.

    ``input_fn`` and ``is_interactive`` exist for tests (default: ``input`` and ``sys.stdin.isatty()``).
    """
    if behavior_if_exists not in LOGDIR_BEHAVIORS:
        raise ConfigurationError(
            f"behavior_if_log_dir_exists={behavior_if_exists!r} is not valid; use one of {list(LOGDIR_BEHAVIORS)}"
        )
    log_dir = Path(log_dir)
    if not _holds_a_run(log_dir):
        return "fresh"
    if behavior_if_exists == "resume":
        return "resume"
    if behavior_if_exists == "delete":
        logger.info("deleting the existing log directory %s (behavior_if_log_dir_exists=delete)", log_dir)
        shutil.rmtree(log_dir)
        return "fresh"
    if is_interactive is None:
        is_interactive = sys.stdin is not None and sys.stdin.isatty()
    if behavior_if_exists == "ask" and is_interactive:
        return _ask(log_dir, input_fn)
    why = "stdin is not a terminal, so there is nobody to ask" if behavior_if_exists == "ask" else "asked to raise"
    raise ConfigurationError(
        f"log_path={str(log_dir)!r} already holds a run ({why}). Pass behavior_if_log_dir_exists=resume to "
        "continue it, behavior_if_log_dir_exists=delete to start over, or choose another log_path"
    )


def model_name_from_argv(argv: Sequence[str], default: str) -> str:
    """The value of a ``model_name=...`` argument, or ``default``: lets a recipe pick model-dependent defaults
    before the full config is parsed."""
    for arg in argv:
        if arg.startswith("model_name="):
            return arg.split("=", 1)[1]
    return default


def run_recipe(main: Callable[..., object], defaults: chz.Blueprint[Any] | None = None) -> None:
    """Run a recipe's ``main`` from the command line (``key=value`` arguments via chz).

    ``defaults``: a ``chz.Blueprint`` of ``main``'s config with the recipe's defaults applied (a recipe that is a
    Blueprint over a loop's ``Config`` rather than a config class of its own); the arguments override them.

    Errors that come from bad input (``TinkerCookbookError``, ``tinker.TinkerError``) already say what is wrong and
    how to fix it, so they are printed as one ``Error: ...`` line with exit status 1 instead of a traceback. Set
    ``TINKER_COOKBOOK_DEBUG=1`` to see the traceback.
    """
    import os

    import chz

    from tinker_cookbook.exceptions import TinkerCookbookError
    from tinker_cookbook.tinker.errors import TinkerError

    try:
        if defaults is None:
            chz.nested_entrypoint(main)
        else:
            main(chz.blueprint.exit_on_entrypoint_error(defaults.make_from_argv)(sys.argv[1:]))
    except (TinkerCookbookError, TinkerError) as exc:
        if os.environ.get("TINKER_COOKBOOK_DEBUG") == "1":
            raise
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(1)
