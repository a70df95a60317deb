"""The recipes' command line (``cli_utils.run_recipe``): keys, --help, and one-line errors.

Most checks call ``run_recipe`` in-process with a ``main`` that only keeps the config it is given, so no model is
loaded; a few run ``python -m recipes.<name>`` to see exactly what a user sees (exit status, no traceback).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import chz
import pytest

from recipes import quickstart, rl_basic, rl_loop, sl_basic, sl_loop
from tinker_cookbook import cli_utils
from tinker_cookbook.exceptions import DataError
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.supervised import train as sl_train

REPO = Path(__file__).resolve().parents[2]
TINY = "tinker-cookbook/tiny-smollm2"
SL = (sl_basic.blueprint, [sl_basic.DATASET])
RL = (rl_basic.blueprint, [rl_basic.ENV])

made: list = []


def keep_sl(config: sl_train.Config) -> None:
    made.append(config)


def keep_rl(config: rl_train.Config) -> None:
    made.append(config)


def build(keep, recipe, *argv: str):
    made.clear()
    cli_utils.run_recipe(keep, *recipe, name="recipe", argv=list(argv))
    [config] = made
    return config


def fails(capsys, keep, recipe, *argv: str) -> str:
    """Run with ``argv``, expect exit 1 and return the single line printed."""
    with pytest.raises(SystemExit) as exit_info:
        cli_utils.run_recipe(keep, *recipe, name="recipe", argv=list(argv))
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    return err


def run_module(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TINKER_COOKBOOK_NO_REEXEC": "1"}
    env.pop("TINKER_COOKBOOK_DEBUG", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


# -- the keys -------------------------------------------------------------------------------------------------


def test_sl_basic_keeps_its_keys(tmp_path):
    config = build(keep_sl, SL, f"model_name={TINY}", "dataset=example", "renderer_name=role_colon",
                   "train_on_what=last_assistant_message", "test_size=5", "batch_size=4", "max_length=128",
                   "learning_rate=2e-4", "lr_schedule=cosine", "num_epochs=2", "lora_rank=4", "eval_every=3",
                   "save_every=5", "max_steps=7", "load_checkpoint_path=tinker://r/weights/x", f"log_path={tmp_path}",
                   "behavior_if_log_dir_exists=resume", "wandb_project=p", "wandb_name=n")
    common = config.dataset_builder.common_config
    assert (common.model_name_for_tokenizer, common.renderer_name, common.batch_size, common.max_length,
            common.train_on_what) == (TINY, "role_colon", 4, 128, "last_assistant_message")
    assert config.dataset_builder.test_size == 5 and config.renderer_name == "role_colon"
    assert (config.learning_rate, config.lr_schedule, config.num_epochs, config.lora_rank, config.eval_every,
            config.save_every, config.max_steps) == (2e-4, "cosine", 2, 4, 3, 5, 7)
    assert (config.log_path, config.behavior_if_log_dir_exists, config.wandb_project) == (str(tmp_path), "resume", "p")
    # every field of the loop's config is a key, nested ones by their path too
    config = build(keep_sl, SL, "adam_beta2=0.99", "dataset_builder.shuffle_seed=3", "on_invalid_line=skip")
    assert config.adam_beta2 == 0.99 and config.dataset_builder.shuffle_seed == 3
    assert config.dataset_builder.on_invalid_line == "skip"


def test_sl_basic_defaults_follow_the_model():
    from tinker_cookbook import hyperparam_utils

    config = build(keep_sl, SL, f"model_name={TINY}")
    assert config.learning_rate == hyperparam_utils.get_lr(TINY)
    assert config.dataset_builder.common_config.model_name_for_tokenizer == TINY
    assert config.dataset_builder.test_size == 48 and config.recipe_name == "sl_basic"


def test_sl_basic_dataset_key_picks_the_builder(tmp_path):
    data = tmp_path / "mine.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    config = build(keep_sl, SL, f"dataset={data}")
    assert config.dataset_builder.file_path == str(data) and config.dataset_builder.test_size == 0
    assert type(build(keep_sl, SL, "dataset=no_robots").dataset_builder).__name__ == "NoRobotsBuilder"


def test_the_suggested_on_invalid_line_key_is_real(tmp_path):
    data = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}
    data.write_text("".join(json.dumps(good) + "\n" for _ in range(3)) + "not json\n")
    args = (f"model_name={TINY}", f"dataset={data}", "batch_size=1")
    with pytest.raises(DataError, match="on_invalid_line=skip") as raised:
        build(keep_sl, SL, *args).dataset_builder()
    suggestion = str(raised.value).split("pass ")[1].split(" ")[0]  # the key=value the message tells us to pass
    train, _ = build(keep_sl, SL, *args, suggestion).dataset_builder()
    assert len(train) == 3


def test_rl_basic_keeps_its_keys(tmp_path):
    config = build(keep_rl, RL, f"model_name={TINY}", "env=arithmetic", "renderer_name=role_colon", "batch_size=4",
                   "group_size=2", "n_batches=3", "max_operand=5", "learning_rate=1e-3", "max_tokens=6",
                   "lora_rank=4", "temperature=0.7", "loss_fn=ppo", "remove_constant_reward_groups=False",
                   "kl_penalty_coef=0.1", "eval_every=2", "save_every=3", "max_steps=2", "seed=7",
                   f"log_path={tmp_path}", "behavior_if_log_dir_exists=delete", "wandb_project=p")
    builder = config.dataset_builder
    assert (builder.batch_size, builder.group_size, builder.n_batches, builder.max_operand, builder.seed,
            builder.renderer_name, builder.model_name_for_tokenizer) == (4, 2, 3, 5, 7, "role_colon", TINY)
    assert (config.learning_rate, config.max_tokens, config.lora_rank, config.temperature, config.loss_fn,
            config.remove_constant_reward_groups, config.kl_penalty_coef, config.eval_every, config.save_every,
            config.max_steps, config.seed) == (1e-3, 6, 4, 0.7, "ppo", False, 0.1, 2, 3, 2, 7)
    assert type(build(keep_rl, RL, "env=gsm8k", "group_size=4").dataset_builder).__name__ == "Gsm8kDatasetBuilder"
    # a key of the loop that the old recipe did not forward
    assert build(keep_rl, RL, "num_substeps=2", "ttl_seconds=None").num_substeps == 2


# -- --help ---------------------------------------------------------------------------------------------------


def test_help_exits_0_and_lists_every_key_with_type_default_and_docstring():
    result = run_module("recipes.sl_basic", "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert "lambda" not in text and "(default)" not in text
    assert "dataset: str = 'example'" in text
    assert "dataset_builder.common_config.batch_size (or batch_size): int = 16\n      Conversations per training step." in text
    assert "log_path: str = '" in text and "tinker-examples" in text
    documented = _help_keys(text)
    for name in chz.chz_fields(sl_train.Config):
        assert documented.get(name), f"{name} is not listed with a docstring"


@pytest.mark.parametrize("main, recipe", [
    (keep_sl, SL), (keep_rl, RL), (quickstart.main, (None, [])), (sl_loop.main, (None, [])),
    (rl_loop.main, (None, [])),
])
def test_help_of_every_recipe_documents_every_key(capsys, main, recipe):
    cli_utils.run_recipe(main, *recipe, name="recipe", argv=["--help"])
    documented = _help_keys(capsys.readouterr().out)
    undocumented = [key for key, doc in documented.items() if not doc]
    assert documented and not undocumented


def _help_keys(text: str) -> dict[str, str]:
    """``{key: docstring}`` from the help's ``  key (or short): type = value`` lines and the indented lines below."""
    keys: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("      ") and current:
            keys[current] += line.strip() + " "
        elif line.startswith("  ") and ": " in line:
            current = line.strip().split(" ")[0].rstrip(":")
            keys[current] = ""
        else:
            current = None
    return keys


# -- errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep, recipe, arg, named", [
    (keep_sl, SL, "batch_size=-3", "batch_size=-3"),
    (keep_sl, SL, "learning_rate=-1", "learning_rate=-1"),
    (keep_sl, SL, "lora_rank=x", "lora_rank='x'"),
    (keep_sl, SL, "batch_sze=3", "batch_sze is not a key"),
    (keep_sl, SL, "dataset=nope", "dataset='nope'"),
    (keep_rl, RL, "batch_size=-3", "batch_size=-3"),
    (keep_rl, RL, "learning_rate=-1", "learning_rate=-1"),
    (keep_rl, RL, "env=chess", "env='chess'"),
])
def test_bad_input_is_one_error_line(capsys, keep, recipe, arg, named):
    assert named in fails(capsys, keep, recipe, arg)


def test_a_misspelled_key_gets_the_real_key_suggested(capsys):
    assert "Did you mean 'batch_size'?" in fails(capsys, keep_sl, SL, "batch_sze=3")


def test_validator_error_from_the_command_line_has_no_traceback():
    result = run_module("recipes.sl_basic", "batch_size=-3")
    assert result.returncode == 1
    assert result.stderr.strip() == "Error: batch_size=-3 must be positive"


def test_debug_variable_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("TINKER_COOKBOOK_DEBUG", "1")
    with pytest.raises(ValueError, match="learning_rate=-1"):
        cli_utils.run_recipe(keep_sl, *SL, name="recipe", argv=["learning_rate=-1"])


def test_defaults_can_also_be_a_blueprint(capsys):
    from tinker_cookbook.rl.arithmetic_env import ArithmeticDatasetBuilder

    values = {"model_name": TINY, "learning_rate": 1e-3, "max_tokens": 4, "log_path": "/nonexistent/run",
              "dataset_builder": ArithmeticDatasetBuilder, "dataset_builder.batch_size": 2,
              "dataset_builder.group_size": 2, "dataset_builder.n_batches": 3, "renderer_name": "chatml",
              "dataset_builder.model_name_for_tokenizer": TINY, "dataset_builder.renderer_name": "chatml"}
    blueprint = chz.Blueprint(rl_train.Config).apply(values)
    for defaults in (blueprint, lambda args: blueprint.clone().apply({"max_tokens": int(args.get("group_size", 4))})):
        config = build(keep_rl, (defaults, []), "group_size=5")
        assert config.dataset_builder.group_size == 5 and config.learning_rate == 1e-3
        assert config.max_tokens == (4 if defaults is blueprint else 5)  # a function sees the arguments as given
        cli_utils.run_recipe(keep_rl, defaults, argv=["--help"])
        assert "dataset_builder.n_batches (or n_batches): int = 3" in capsys.readouterr().out


# -- the default log path, short names, keys passed on ----------------------------------------------------------


def test_the_recipe_name_gives_log_path_its_default_under_the_recipes_own_defaults(tmp_path):
    made.clear()
    cli_utils.run_recipe(keep_sl, sl_basic.blueprint, name="sl_basic", argv=[])
    assert made[-1].log_path == cli_utils.default_log_path("sl_basic")
    assert Path(made[-1].log_path).parts[-2:] == ("tinker-examples", "sl_basic")
    own = lambda args: sl_basic.blueprint(args).apply({"log_path": str(tmp_path)})  # noqa: E731
    cli_utils.run_recipe(keep_sl, own, name="sl_basic", argv=[])
    cli_utils.run_recipe(keep_sl, sl_basic.blueprint, name="sl_basic", argv=[f"log_path={tmp_path / 'given'}"])
    assert [c.log_path for c in made[1:]] == [str(tmp_path), str(tmp_path / "given")]


def test_a_short_name_key_sets_its_field_and_the_fields_below_it():
    from recipes.preference.dpo import train as dpo
    from tinker_cookbook.preference import train_dpo
    from tinker_cookbook.preference.preference_datasets import (
        ExampleComparisonBuilder,
        JsonlComparisonBuilder,
    )

    made.clear()

    def keep_dpo(config: train_dpo.Config) -> None:
        made.append(config)

    cli_utils.run_recipe(keep_dpo, dpo.blueprint(), [dpo.DATASET], name="dpo", argv=["batch_size=3"])
    cli_utils.run_recipe(keep_dpo, dpo.blueprint(), [dpo.DATASET], name="dpo", argv=[
        "dataset=jsonl", "dataset.train_path=a.jsonl", "dataset.test_size=4", "max_length=64"])
    default, jsonl = made
    assert isinstance(default.dataset_builder.comparison_builder, ExampleComparisonBuilder)
    assert default.dataset_builder.common_config.batch_size == 3
    assert isinstance(jsonl.dataset_builder.comparison_builder, JsonlComparisonBuilder)
    assert (jsonl.dataset_builder.comparison_builder.train_path, jsonl.dataset_builder.comparison_builder.test_size,
            jsonl.dataset_builder.common_config.max_length) == ("a.jsonl", 4, 64)


@chz.chz
class Sweep:
    """A sweep over another recipe's runs."""

    rates: list[float] = chz.field(default_factory=lambda: [1.0])
    """The points."""
    point_args: list[str] = chz.field(default_factory=list)
    """Passed on to every point."""


def test_keys_that_are_not_the_recipes_own_are_passed_on_and_help_lists_them(capsys):
    made.clear()

    def keep_sweep(config: Sweep) -> None:
        made.append(config)

    forward = cli_utils.Forward(field="point_args", module="recipes.sl_loop")
    cli_utils.run_recipe(keep_sweep, forward=forward, argv=["rates=[2.0]", "batch_size=4", "model_name@=x"])
    assert made[-1] == Sweep(rates=[2.0], point_args=["batch_size=4", "model_name@=x"])
    cli_utils.run_recipe(keep_sweep, forward=forward, argv=["--help"])
    text = capsys.readouterr().out
    assert "Keys passed on to every python -m recipes.sl_loop run (point_args):" in text
    assert "\n  batch_size: int = 16\n      Conversations per step." in text
    assert text.rstrip().endswith("shows the traceback instead.")


# -- one idiom --------------------------------------------------------------------------------------------------


RECIPE_FILES = sorted((REPO / "recipes").rglob("*.py"))


def _is_runnable(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text()


def _imported_recipe_modules(path: Path) -> list[str]:
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "recipes":
            names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names if alias.name.split(".")[0] == "recipes"]
    return names


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_recipes_never_import_recipes(path):
    """A recipe may use the non-runnable modules of its own package (its data, its task), never another recipe."""
    for name in _imported_recipe_modules(path):
        parts = name.split(".")
        module = REPO.joinpath(*parts).with_suffix(".py")
        if not module.is_file():  # ``from recipes.x import y`` where y is a name, not a module
            module = REPO.joinpath(*parts[:-1]).with_suffix(".py")
        assert module.parent == path.parent and not _is_runnable(module), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", [p for p in RECIPE_FILES if _is_runnable(p)], ids=lambda p: str(p.relative_to(REPO)))
def test_every_recipe_runs_through_run_recipe_which_owns_process_setup_and_the_log_path(path):
    text = path.read_text()
    main_block = text.split('if __name__ == "__main__":')[1]
    assert "run_recipe(" in main_block or "runpy.run_module(" in main_block
    assert "reexec_with_fast_malloc" not in text and "tinker-examples" not in text and "sys.argv" not in text


PROBE = """
import chz
from tinker_cookbook import cli_utils
from tinker_cookbook.perf_env import fast_malloc_active

@chz.chz
class Probe:
    x: int = 1

def main(config: Probe) -> None:
    print(fast_malloc_active(), config.x)

cli_utils.run_recipe(main, argv={argv})
"""


@pytest.mark.parametrize("argv, restarted", [(None, True), (["x=2"], False)])
def test_a_command_line_run_restarts_once_with_the_allocator_settings(argv, restarted):
    from tinker_cookbook.perf_env import FAST_MALLOC_ENV

    env = {k: v for k, v in os.environ.items() if k not in FAST_MALLOC_ENV and k != "TINKER_COOKBOOK_NO_REEXEC"}
    result = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv), "x=2"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [str(restarted), "2"]
