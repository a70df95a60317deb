"""Command-line helpers shared by the training loops and recipes.

``run_recipe`` is every recipe's entry point (``python -m recipes.<name> key=value ...``). A recipe is a chz
Blueprint of its loop's ``Config`` with the recipe's defaults applied::

    def blueprint(args: Mapping[str, str]) -> chz.Blueprint[train.Config]:
        return chz.Blueprint(train.Config).apply({"model_name": ..., "dataset_builder": ..., ...})

    if __name__ == "__main__":
        run_recipe(main, blueprint, [DATASET], name="sl_basic")

(a plain Blueprint when no default depends on the arguments given). ``run_recipe`` does the rest, once for every
recipe: the process setup (the allocator restart of ``perf_env``), the default ``log_path``
(``default_log_path(name)``), the command line (every field of the config is a key, nested ones by their dotted
path, or by their last part when that is not a top-level key: ``batch_size=4`` for
``dataset_builder.common_config.batch_size``; ``RecipeKey``s add keys that pick defaults or name a field),
``--help`` (every key with its type, its default and its docstring) and the errors: bad input (an unknown key, a
value that does not parse, a validator's ``ValueError``, a cookbook or API error) prints one ``Error: ...`` line
and exits 1; ``TINKER_COOKBOOK_DEBUG=1`` shows the traceback instead.

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

import ast
import inspect
import itertools
import logging
import os
import re
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeAlias, TypeVar, get_args

import chz
from chz.blueprint import (
    ConstructionException,
    ExtraneousBlueprintArg,
    InvalidBlueprintArg,
    MissingBlueprintArg,
    Reference,
)
from chz.data_model import MISSING

from tinker_cookbook.exceptions import ConfigurationError

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


# ---------------------------------------------------------------------------------------------------------
# Recipes: a Blueprint of the loop's config, with the recipe's defaults
# ---------------------------------------------------------------------------------------------------------

ConfigT = TypeVar("ConfigT")
HELP_FLAGS = ("--help", "-h")
# What chz raises for an unknown key, a value that does not parse, or a missing one.
CHZ_ARGUMENT_ERRORS = (ExtraneousBlueprintArg, InvalidBlueprintArg, MissingBlueprintArg, ConstructionException)


def default_log_path(recipe: str) -> str:
    """Where a recipe writes its run unless given ``log_path``: ``<tmp>/tinker-examples/<recipe>``."""
    return str(Path(tempfile.gettempdir()) / "tinker-examples" / recipe)


@dataclass(frozen=True)
class RecipeKey:
    """A command-line key of a recipe that is not a config field: its value chooses the recipe's defaults
    (``dataset=...`` picks the dataset builder and its settings), or, with ``short_for``, it names a config field
    (``dataset=hhh`` sets ``<short_for>=hhh`` and ``dataset.<field>=...`` sets ``<short_for>.<field>=...``)."""

    name: str
    default: str
    doc: str
    short_for: str | None = None


Defaults: TypeAlias = chz.Blueprint[Any] | Callable[[Mapping[str, str]], chz.Blueprint[Any]]
"""The recipe's defaults: ``chz.Blueprint(Config).apply({...})``, or a function of the ``key=value`` arguments as
given that returns one (for defaults that follow what is given: the model's learning rate, the dataset a
``RecipeKey`` picks). Values may be ``chz.blueprint.Reference("key")`` to follow another key."""


@dataclass(frozen=True)
class Forward:
    """Keys that a recipe passes on to the runs of another recipe that it launches (a sweep's points): every
    ``key=value`` that is not the recipe's own lands, as given, in the config's ``field`` (a ``list[str]``);
    ``--help`` lists them from ``python -m <module> --help``, and each run checks them."""

    field: str
    module: str


def run_recipe(
    main: Callable[[ConfigT], object],
    defaults: Defaults | None = None,
    keys: Sequence[RecipeKey] = (),
    *,
    name: str | None = None,
    forward: Forward | None = None,
    argv: Sequence[str] | None = None,
) -> None:
    """Every recipe's entry point: build ``main``'s config from the command line over the recipe's defaults, and
    call ``main`` with it.

    The config is ``defaults`` (``chz.Blueprint(Config)`` when None, Config being ``main``'s parameter
    annotation) with ``argv`` applied as chz does in ``make_from_argv``, after ``keys`` are taken out (or
    expanded) and bare nested keys are spelled as chz wildcards (``batch_size=4`` -> ``...batch_size=4``).
    ``name`` gives ``log_path`` its default, ``default_log_path(name)``. With ``argv`` None (a real command line:
    ``sys.argv[1:]``) the process first restarts once with the allocator settings of ``perf_env``.
    """
    if argv is None:
        from tinker_cookbook.perf_env import reexec_with_fast_malloc

        reexec_with_fast_malloc()
    args = list(sys.argv[1:] if argv is None else argv)
    wants_help = any(a in HELP_FLAGS for a in args)
    args = [a for a in args if a not in HELP_FLAGS]
    given = dict(a.split("=", 1) for a in args if "=" in a)
    try:
        base = _recipe_blueprint(main, defaults, given, name)
        args, forwarded = _split_forwarded(base.target, args, keys, forward)
        if forward is not None:
            base = base.apply({forward.field: forwarded}, layer_name="passed on")
        blueprint = base.clone().apply_from_argv(_spell_nested_keys(base.target, _expand_keys(args, keys)))
        if wants_help:
            passed_on = _forwarded_help(forward) if forward is not None else []
            _print_help(recipe_help(blueprint, base, keys, given, _command_name(main), _summary(main), passed_on))
            return
        config = blueprint.make()
    except (ValueError, *CHZ_ARGUMENT_ERRORS) as exc:  # validators raise ValueError; chz: keys and values
        _fail(exc)
    except Exception as exc:  # only the cookbook's and the API's own errors are bad input
        _fail_if_user_error(exc)
        raise
    try:
        main(config)
    except Exception as exc:
        _fail_if_user_error(exc)
        raise


def _recipe_blueprint(main: Callable[..., object], defaults: Defaults | None, given: Mapping[str, str],
                      name: str | None) -> chz.Blueprint[Any]:
    """The recipe's defaults (``chz.Blueprint`` of ``main``'s config when None) over the default log path."""
    if defaults is None:
        recipe = chz.Blueprint(chz.get_nested_target(main))
    else:
        recipe = defaults.clone() if isinstance(defaults, chz.Blueprint) else defaults(given)
    if name is None or "log_path" not in chz.chz_fields(recipe.target):
        return recipe
    base = chz.Blueprint(recipe.target).apply({"log_path": default_log_path(name)}, layer_name="default log path")
    return base.apply(recipe)


def _split_forwarded(target: Any, args: list[str], keys: Sequence[RecipeKey],
                     forward: Forward | None) -> tuple[list[str], list[str]]:
    """``(the recipe's own arguments, those passed on)``."""
    if forward is None:
        return args, []
    own = {*chz.chz_fields(target), *(k.name for k in keys)}
    return ([a for a in args if _arg_key(a).split(".")[0] in own],
            [a for a in args if _arg_key(a).split(".")[0] not in own])


def _forwarded_help(forward: Forward) -> list[str]:
    """The key lines of ``python -m <module> --help``: the keys every launched run accepts."""
    import subprocess

    result = subprocess.run([sys.executable, "-m", forward.module, "--help"], capture_output=True, text=True,
                            check=False, env={**os.environ, "TINKER_COOKBOOK_NO_REEXEC": "1"})
    lines = result.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Keys")), len(lines))
    rows = [line for line in lines[start + 1:] if line.startswith("  ")]
    return ["", f"Keys passed on to every python -m {forward.module} run ({forward.field}):", "", *rows]


def _expand_keys(args: list[str], keys: Sequence[RecipeKey]) -> list[str]:
    """Recipe keys out: ``short_for`` ones spelled as their field (``dataset.x=1`` -> ``<short_for>.x=1``)."""
    short = {k.name: k.short_for for k in keys if k.short_for}
    names = {k.name for k in keys}
    expanded = []
    for arg in args:
        key = _arg_key(arg)
        head, dot, rest = key.partition(".")
        if head in short:
            expanded.append(f"{short[head]}{dot}{rest}{arg[len(key):]}")
        elif key not in names:
            expanded.append(arg)
    return expanded


def _print_help(text: str) -> None:
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `--help | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _arg_key(arg: str) -> str:
    match = re.match(r"[^=@]*", arg)
    return match.group(0) if match else arg


def _spell_nested_keys(target: Any, args: list[str]) -> list[str]:
    """``key=value`` for a key that does not start with a top-level field becomes the wildcard ``...key=value``
    (``batch_size=4``, ``columns.prompt=question``: the nested field of that name, wherever it is)."""
    top = set(chz.chz_fields(target))
    return [f"...{arg}" if "=" in arg and _arg_key(arg) and _arg_key(arg).split(".")[0] not in top
            and not _arg_key(arg).startswith(".") else arg for arg in args]


def _fail_if_user_error(exc: BaseException) -> None:
    from tinker_cookbook.exceptions import TinkerCookbookError
    from tinker_cookbook.tinker.errors import TinkerError

    if isinstance(exc, (TinkerCookbookError, TinkerError)):
        _fail(exc)


def _fail(exc: BaseException) -> NoReturn:
    """Print ``exc`` as one ``Error:`` line and exit 1 (or re-raise it under ``TINKER_COOKBOOK_DEBUG=1``)."""
    if os.environ.get("TINKER_COOKBOOK_DEBUG") == "1":
        raise exc
    print(f"Error: {_one_line(exc)}", file=sys.stderr)
    sys.exit(1)


def _one_line(exc: BaseException) -> str:
    text = re.sub(r"'\.\.\.([\w.]+)'", r"'\1'", str(exc))  # say a key as the user wrote it, not as its wildcard
    if not isinstance(exc, CHZ_ARGUMENT_ERRORS):
        return text.strip()
    # chz explains over several lines; say it in one, in the recipe's terms.
    lines = [line.strip(" -") for line in text.splitlines() if line.strip()]
    first = lines[0]
    if match := re.match(r"Extraneous argument '(.+?)' to Blueprint", first):
        first = f"{match.group(1)} is not a key of this recipe"
    elif match := re.match(r"Could not interpret argument '(.*)' provided for param '(.+?)'", first):
        first = f"{match.group(2)}={match.group(1)!r} is not a valid value"
    hints = [ln for ln in lines[1:] if ln.startswith(("Could not cast", "Did you mean", "Missing"))]
    return "; ".join([first, *hints]) + " (--help lists the keys)"


def _summary(main: Callable[..., object]) -> str:
    """The first paragraph of the recipe's module docstring."""
    doc = inspect.getdoc(sys.modules.get(main.__module__)) or ""
    return doc.split("\n\n")[0]


def _command_name(main: Callable[..., object]) -> str:
    module = main.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else Path(sys.argv[0]).stem
    return f"python -m {module}"


# ---------------------------------------------------------------------------------------------------------
# --help
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _HelpRow:
    key: str
    type: str
    default: str
    doc: str
    entry_of: str | None = None
    """For an entry of a mapping field (``columns.prompt``): the field's key."""


def recipe_help(
    blueprint: chz.Blueprint[Any],
    defaults_only: chz.Blueprint[Any],
    recipe_keys: Sequence[RecipeKey],
    given: Mapping[str, str],
    command: str,
    summary: str = "",
    passed_on: Sequence[str] = (),
) -> str:
    """Every key: its type, its value with the arguments given so far (the default when none), its docstring."""
    problem = ""
    config: Any = None
    try:
        config = blueprint.make()
    except Exception as exc:  # noqa: BLE001 - a bad value given with --help: say so, list the defaults
        if not isinstance(exc, MissingBlueprintArg):
            problem = f"Error with the arguments given: {_one_line(exc)}"
        try:
            config = defaults_only.make()
        except Exception:  # noqa: BLE001 - required keys without defaults: listed from the class itself
            config = None
    target: Any = type(config) if config is not None else blueprint.target
    rows = [_HelpRow(k.name, "str", repr(given.get(k.name, k.default)), k.doc) for k in recipe_keys]
    follows = _references(defaults_only)
    rows += _config_rows(config, "", follows) if config is not None else _class_rows(target)
    short = _short_keys([r.key for r in rows if r.entry_of is None], set(chz.chz_fields(target)))
    short.update({r.key: short[r.entry_of] + r.key[len(r.entry_of):] for r in rows
                  if r.entry_of is not None and r.entry_of in short})
    out = [f"Usage: {command} [key=value ...]", ""]
    summary = summary or (inspect.getdoc(target) or "").split("\n\n")[0]
    if summary:
        out += [summary, ""]
    if short:
        example = "batch_size" if "batch_size" in short.values() else next(iter(short.values()))
        out += [f"Keys (a nested key can also be given by its short name, the one after 'or': {example}=...):", ""]
    else:
        out += ["Keys:", ""]
    for row in rows:
        alias = f" (or {short[row.key]})" if row.key in short else ""
        out.append(f"  {row.key}{alias}: {row.type} = {row.default}")
        if row.doc:
            out += textwrap.wrap(row.doc, 100, initial_indent="      ", subsequent_indent="      ")
    out += passed_on
    out += ["", "Bad input prints one Error: line; TINKER_COOKBOOK_DEBUG=1 shows the traceback instead."]
    if problem:
        out += ["", problem]
    return "\n".join(out)


def _references(blueprint: chz.Blueprint[Any]) -> dict[str, str]:
    """``{key: the key it follows}`` for the defaults that are ``Reference``s, a later layer overriding an earlier
    one. chz keeps the applied values in its argument map's layers and has no public reader for them, so this
    reads them defensively: without them --help only loses its "(follows ...)" notes."""
    follows: dict[str, str] = {}
    for layer in getattr(getattr(blueprint, "_arg_map", None), "_layers", []):
        for key, value in getattr(layer, "qualified", {}).items():
            if isinstance(value, Reference):
                follows[key] = value.ref
            else:
                follows.pop(key, None)
    return follows


def _config_rows(config: Any, prefix: str, follows: Mapping[str, str]) -> list[_HelpRow]:
    docs = _attribute_docs(type(config))
    rows: list[_HelpRow] = []
    for name, field in chz.chz_fields(type(config)).items():
        value = getattr(config, name)
        path = prefix + name
        doc = docs.get(name) or getattr(field, "_doc", "") or ""
        if path in follows:
            doc = f"(follows {follows[path]}) {doc}".strip()
        shown = type(value).__name__ if chz.is_chz(value) else _value_repr(value)
        rows.append(_HelpRow(path, _type_repr(field.final_type), shown, " ".join(doc.split())))
        if isinstance(value, dict):  # each entry given so far is a key of its own (``columns.prompt=...``)
            rows += [_HelpRow(f"{path}.{k}", type(v).__name__, _value_repr(v), "", entry_of=path)
                     for k, v in value.items()]
        if chz.is_chz(value):
            rows += _config_rows(value, path + ".", follows)
    return rows


def _class_rows(cls: type) -> list[_HelpRow]:
    """The rows of a config class that cannot be made without arguments: class defaults, required keys marked."""
    docs = _attribute_docs(cls)
    rows = []
    for name, field in chz.chz_fields(cls).items():
        # chz keeps a field's default (or factory) in private attributes, MISSING when there is none.
        default: Any = field._default
        factory: Any = field._default_factory
        if default is MISSING and factory is not MISSING:
            default = factory()
        shown = "(required)" if default is MISSING else _value_repr(default)
        rows.append(_HelpRow(name, _type_repr(field.final_type), shown, " ".join(docs.get(name, "").split())))
    return rows


def _short_keys(keys: list[str], top: set[str]) -> dict[str, str]:
    """The last part of each nested leaf key that names exactly one key and is not a top-level key."""
    nested = {k.rsplit(".", 1)[0] for k in keys if "." in k}
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: part for k, part in zip(keys, last, strict=True)
            if "." in k and part not in top and last.count(part) == 1 and k not in nested}


def _value_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _type_repr(tp: Any) -> str:
    """``chz``'s type text without module paths: ``AsyncConfig | None``."""
    return re.sub(r"\b(?:[A-Za-z_]\w*[.:])+([A-Za-z_]\w*)", r"\1", chz.tiepin.type_repr(tp))


def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written under fields (``x: int = 0`` then ``\"\"\"...\"\"\"``), over the class and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # builtins, classes made at run time
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, after in itertools.pairwise(body):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs
