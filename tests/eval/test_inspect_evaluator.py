"""InspectEvaluator inline in the SL loop, on a checkpoint (run_inspect_evals) and its error reporting."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from inspect_ai.log import list_eval_logs

from tinker_cookbook import checkpoint_utils, tinker
from tinker_cookbook.eval import run_inspect_evals
from tinker_cookbook.eval.inspect_evaluators import InspectEvaluatorBuilder, task_specs_for_inspect
from tinker_cookbook.exceptions import ConfigurationError, EvalError
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.utils import ml_log

REPO = Path(__file__).resolve().parents[2]
CONTACT_CARDS = str(REPO / "example-data" / "evals" / "contact_cards.py")
TINY = "tinker-cookbook/tiny-smollm2"
CARD_METRICS = {"inspect/contact_cards/card_format/accuracy", "inspect/contact_cards/card_format/stderr",
                "inspect/contact_cards/card_fields/mean", "inspect/contact_cards/card_fields/stderr"}


def _write_cards(path: Path, count: int) -> Path:
    rows = [{"messages": [
        {"role": "system", "content": "You write contact cards."},
        {"role": "user", "content": f"Person {i} is {20 + i} and lives in Town{i}; they are a baker."},
        {"role": "assistant", "content": f"Name: Person {i}\nAge: {20 + i}\nCity: Town{i}\nJob: baker"},
    ]} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def sl_run(tmp_path_factory):
    """Two SL steps of the tiny model (role_colon renderer) with an inline Inspect evaluator every step."""
    tmp = tmp_path_factory.mktemp("sl")
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=TINY, renderer_name="role_colon",
                                            max_length=96, batch_size=4)
    # No log_dir: inline, Inspect's logs go to the run's own inspect/ directory.
    inspect_eval = InspectEvaluatorBuilder(tasks=[CONTACT_CARDS], limit=2, max_tokens=4, renderer_name="role_colon")
    config = train.Config(
        log_path=str(tmp / "run"), model_name=TINY, renderer_name="role_colon",
        dataset_builder=FromConversationFileBuilder(common_config=common, file_path=str(_write_cards(tmp / "d.jsonl", 20)),
                                                    test_size=4),
        learning_rate=5e-3, lora_rank=4, eval_every=1, save_every=0, max_steps=2, evaluator_builders=[inspect_eval],
        behavior_if_log_dir_exists="delete", num_examples_to_show=0,
    )
    asyncio.run(train.main(config))
    return tmp


def test_inline_inspect_evaluator_logs_scores_every_eval(sl_run):
    rows = ml_log.read_metrics(sl_run / "run")
    evaluated = [row for row in rows if CARD_METRICS <= set(row)]
    assert [row["step"] for row in evaluated] == [row["step"] for row in rows if "test/nll" in row]
    assert len(evaluated) >= 2
    for row in evaluated:
        assert 0.0 <= row["inspect/contact_cards/card_fields/mean"] <= 1.0
    # Inspect's own log of each evaluation, two samples each, inside the run's directory
    assert len(list_eval_logs(str(sl_run / "run" / "inspect"))) == len(evaluated)


def test_run_inspect_evals_on_the_checkpoint_uses_its_stored_renderer(sl_run, capsys):
    final = checkpoint_utils.get_last_checkpoint(str(sl_run / "run"), required_key="sampler_path")
    assert final is not None
    config = run_inspect_evals.Config(model_path=final["sampler_path"], tasks=[CONTACT_CARDS], limit=2, max_tokens=4,
                                      log_dir=str(sl_run / "offline-logs"))
    metrics = asyncio.run(run_inspect_evals.run(config))
    assert set(metrics) == CARD_METRICS
    out = capsys.readouterr().out
    assert f"model: {final['sampler_path']} (renderer role_colon)" in out  # from the run's metadata, not chatml
    assert "contact_cards  card_fields  mean" in out and "inspect view --log-dir" in out


def test_run_inspect_evals_needs_a_model():
    with pytest.raises(ConfigurationError, match="pass model_path=tinker://"):
        asyncio.run(run_inspect_evals.run(run_inspect_evals.Config(tasks=[CONTACT_CARDS])))


def test_missing_task_file_and_package_are_clear_errors(tmp_path):
    with pytest.raises(ConfigurationError, match=r"task file .nope/tasks\.py. does not exist"):
        task_specs_for_inspect(["nope/tasks.py"])
    with pytest.raises(ConfigurationError, match="'inspect_evals/ifeval' comes from the Python package 'inspect_evals'"):
        task_specs_for_inspect(["inspect_evals/ifeval"])
    # an absolute path is passed on relative to the working directory (Inspect only accepts those)
    assert not Path(task_specs_for_inspect([CONTACT_CARDS + "@contact_cards"])[0]).is_absolute()


def test_a_failing_task_is_an_eval_error(tmp_path):
    task_file = tmp_path / "broken.py"
    task_file.write_text(
        "from inspect_ai import Task, task\nfrom inspect_ai.dataset import Sample\n"
        "from inspect_ai.solver import solver\n\n"
        "@solver\ndef explode():\n    async def solve(state, generate):\n        raise RuntimeError('kaboom')\n"
        "    return solve\n\n"
        "@task\ndef broken():\n    return Task(dataset=[Sample(input='x', target='y')], solver=explode())\n"
    )
    sampling_client = tinker.ServiceClient().create_sampling_client(base_model=TINY)
    evaluator = InspectEvaluatorBuilder(tasks=[str(task_file)], log_dir=str(tmp_path / "logs"))()
    with pytest.raises(EvalError, match=r"'broken' did not finish.*kaboom"):
        asyncio.run(evaluator(sampling_client))


_LOGGING_CHECK = """
import asyncio, logging, sys
from tinker_cookbook import tinker
from tinker_cookbook.eval.inspect_evaluators import InspectEvaluatorBuilder
root = logging.getLogger()
root.setLevel(logging.INFO)
handlers = list(root.handlers)
sampling_client = tinker.ServiceClient().create_sampling_client(base_model=sys.argv[1])
evaluator = InspectEvaluatorBuilder(tasks=[sys.argv[2]], limit=1, max_tokens=2, log_dir=sys.argv[3])()
asyncio.run(evaluator(sampling_client))
print(logging.getLevelName(root.level), root.handlers == handlers)
"""


def test_the_training_loggers_keep_their_level_and_handlers(tmp_path):
    # Inspect sets the root logger to WARNING on the first eval of a process (hence a fresh one here); the
    # training loop's INFO lines in logs.log must survive it
    result = subprocess.run([sys.executable, "-c", _LOGGING_CHECK, TINY, CONTACT_CARDS, str(tmp_path / "logs")],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["INFO", "True"]


def test_llm_judge_task_with_a_tinker_grader_model(tmp_path):
    # the docs' LLM-as-judge task: the grader is InspectAPIFromTinkerSampling built directly and wrapped in a Model
    sampling_client = tinker.ServiceClient().create_sampling_client(base_model=TINY)
    task = str(REPO / "example-data" / "evals" / "capitals_judge.py")
    evaluator = InspectEvaluatorBuilder(tasks=[task], task_args={"grader_model": TINY}, limit=2, max_tokens=3,
                                       log_dir=str(tmp_path / "logs"))()
    metrics = asyncio.run(evaluator(sampling_client))
    assert set(metrics) == {"inspect/capitals_judge/model_graded_qa/accuracy",
                            "inspect/capitals_judge/model_graded_qa/stderr"}
    [log] = evaluator.last_logs
    # per sample: the evaluated model answers, then the grader model grades (both tiny-smollm2 here)
    for sample in log.samples:
        assert [e.model for e in sample.events if e.event == "model"] == [f"tinker-cookbook/{TINY}"] * 2
