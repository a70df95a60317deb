"""The run core every training loop shares (``tinker_cookbook.run_core``): the run fields and their defaults, the
plan and checkpoint cadence, resuming (and dropping the metrics rows past the checkpoint), the training client's
renderer check, and which evaluators are due when. The expectations are worked out by hand in the comments."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import chz
import pytest

from tinker_cookbook import checkpoint_utils, run_core, tinker
from tinker_cookbook.eval.evaluators import SamplingClientEvaluator, TrainingClientEvaluator
from tinker_cookbook.exceptions import CheckpointError, ConfigurationError, DataError
from tinker_cookbook.preference import train_dpo
from tinker_cookbook.preference.preference_datasets import DPODatasetBuilder, JsonlComparisonBuilder
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.rl.arithmetic_env import ArithmeticDatasetBuilder
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.utils import ml_log

LOOP_CONFIGS = [sl_train.Config, train_dpo.Config, rl_train.Config]


# -- the run fields ------------------------------------------------------------------------------------------


def test_every_loop_takes_the_run_fields_from_the_core_with_one_default_each():
    run_fields = chz.chz_fields(run_core.RunConfig)
    assert {"log_path", "base_url", "model_name", "lora_rank", "renderer_name", "save_every", "eval_every",
            "ttl_seconds", "wandb_project", "wandb_name", "behavior_if_log_dir_exists",
            "load_checkpoint_path"} <= set(run_fields)
    for config in LOOP_CONFIGS:
        assert issubclass(config, run_core.RunConfig)
        redeclared = set(vars(config).get("__annotations__", {})) & set(run_fields)
        assert not redeclared, f"{config.__module__} declares {redeclared} again"
        fields = chz.chz_fields(config)
        for name, field in run_fields.items():
            assert fields[name] is field, (config.__module__, name)  # the same field, so the same key and default


@pytest.mark.parametrize("config", LOOP_CONFIGS, ids=["supervised", "dpo", "rl"])
def test_defaults_and_command_line_keys_are_the_same_in_every_loop(config):
    blueprint = chz.Blueprint(config).apply(_required(config))
    made = blueprint.make_from_argv(["log_path=~/runs/x"])
    assert made.log_path == str(Path.home() / "runs" / "x")  # ~ expanded in every loop
    assert (made.eval_every, made.save_every, made.ttl_seconds, made.lora_rank, made.seed, made.max_steps) == (
        10, 20, None, 32, 0, None)
    assert (made.behavior_if_log_dir_exists, made.base_url, made.renderer_name, made.evaluator_builders) == (
        "ask", None, None, [])
    made = blueprint.make_from_argv(["log_path=/r", "save_every=3", "eval_every=0", "ttl_seconds=60",
                                     "wandb_project=p", "behavior_if_log_dir_exists=resume"])
    assert (made.save_every, made.eval_every, made.ttl_seconds, made.wandb_project,
            made.behavior_if_log_dir_exists) == (3, 0, 60, "p", "resume")


def _required(config: type) -> dict[str, Any]:
    """A loop config's required keys (the dataset builders are only made, never called)."""
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer="m", renderer_name="chatml", batch_size=1)
    if config is rl_train.Config:
        builder: Any = ArithmeticDatasetBuilder(batch_size=1, group_size=1, n_batches=1, model_name_for_tokenizer="m",
                                                renderer_name="chatml")
        return {"model_name": "m", "learning_rate": 1e-4, "max_tokens": 4, "dataset_builder": builder}
    if config is train_dpo.Config:
        builder = DPODatasetBuilder(common_config=common, comparison_builder=JsonlComparisonBuilder(train_path="x"))
    else:
        builder = FromConversationFileBuilder(common_config=common, file_path="x")
    return {"model_name": "m", "dataset_builder": builder}


@pytest.mark.parametrize("field, value, named", [
    ("max_steps", 0, "max_steps=0"), ("lora_rank", 0, "lora_rank=0"), ("save_every", -1, "save_every"),
    ("ttl_seconds", 0, "ttl_seconds=0"), ("behavior_if_log_dir_exists", "keep", "behavior_if_log_dir_exists='keep'"),
])
def test_bad_run_fields_name_the_field(field, value, named):
    with pytest.raises(ConfigurationError, match=named):
        run_core.RunConfig(log_path="x", model_name="m", **{field: value})


def test_learning_rate_check():
    for bad in (0.0, -1e-4, float("nan"), float("inf")):
        with pytest.raises(ConfigurationError, match="learning_rate="):
            run_core.check_learning_rate(bad)
    run_core.check_learning_rate(3e-4)


# -- plan and checkpoint cadence ------------------------------------------------------------------------------


def test_cadence_of_a_run_cut_short_by_max_steps():
    # 4 batches x 2 epochs = 8 planned steps; max_steps=7 stops before the end, so the last checkpoint is named
    # after its step (after 7 steps: epoch 1, batch 3) and the run is not finished.
    plan = run_core.make_plan(4, 2, 7, None)
    assert (plan.total_steps, plan.end_step, plan.start_step, plan.finished) == (8, 7, 0, False)
    # periodic checkpoints strictly between start (0) and end (7), every 2 steps
    assert [s for s in range(10) if plan.checkpoint_due(s, 2)] == [2, 4, 6]
    assert plan.last_checkpoint() == ("000007", {"step": 7, "epoch": 1, "batch": 3})
    assert [s for s in range(10) if plan.checkpoint_due(s, 0)] == []  # 0: only the last one


def test_cadence_of_a_resumed_run_that_finishes():
    # resumed after 4 steps of 4 batches per epoch: epoch 1, batch 0; runs steps 4..7 and ends with "final"
    plan = run_core.make_plan(4, 2, None, {"name": "000004", "step": 4, "epoch": 1, "batch": 0})
    assert (plan.start_step, plan.end_step, plan.finished) == (4, 8, True)
    assert [s for s in range(10) if plan.checkpoint_due(s, 3)] == [6]  # not 3 (before the start), not 9 (past the end)
    assert [s for s in range(10) if plan.checkpoint_due(s, 4)] == []  # 4 is the start, 8 the end
    assert plan.last_checkpoint() == ("final", {"step": 8, "epoch": 2, "batch": 0, "final": True})
    assert plan.position(6) == (1, 2)


def test_max_steps_can_plan_the_run_instead_of_cutting_it():
    # RL: 6 dataset batches, max_steps=4: the planned run is 4 steps, so it finishes and ends with "final"
    plan = run_core.make_plan(6, 1, 4, None, max_steps_plans_run=True)
    assert (plan.total_steps, plan.end_step, plan.finished) == (4, 4, True)
    assert plan.last_checkpoint() == ("final", {"step": 4, "epoch": 0, "batch": 4, "final": True})
    # the same with the supervised meaning: the plan stays 6 steps and the run stops at 4, unfinished
    assert run_core.make_plan(6, 1, 4, None).last_checkpoint()[0] == "000004"


def test_resumed_step_of_checkpoint_rows():
    assert run_core.resumed_step(None, 4) == 0
    assert run_core.resumed_step({"step": 5, "epoch": 1, "batch": 1}, 4) == 5  # 1 * 4 + 1
    assert run_core.resumed_step({"name": "000003", "batch": 3}, 6) == 3  # a row that has only the steps done
    with pytest.raises(CheckpointError, match="different number of batches per epoch"):
        run_core.resumed_step({"name": "000005", "step": 5, "epoch": 1, "batch": 1}, 3)  # 1 * 3 + 1 = 4 != 5
    with pytest.raises(CheckpointError, match="no valid 'epoch'"):
        run_core.resumed_step({"step": 5, "batch": 1}, 4)
    with pytest.raises(DataError, match="no full batch"):
        run_core.make_plan(0, 1, None, None)


class _Datasets:
    """A supervised dataset that records the epochs it was ordered for."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def set_epoch(self, seed: int = 0) -> None:
        self.epochs.append(seed)

    def get_batch(self, index: int) -> list[Any]:
        return [(self.epochs[-1], index)]

    def __len__(self) -> int:
        return 3


def test_epoch_batches_order_each_epoch_once():
    dataset = _Datasets()
    batches = run_core.EpochBatches(dataset, run_core.make_plan(3, 3, None, None))  # type: ignore[arg-type]
    # steps 2..7 of 3 batches per epoch: epoch 0 batch 2, epoch 1 batches 0-2, epoch 2 batches 0-1
    assert [batches.get(s) for s in range(2, 8)] == [[(0, 2)], [(1, 0)], [(1, 1)], [(1, 2)], [(2, 0)], [(2, 1)]]
    assert dataset.epochs == [0, 1, 2]


# -- resuming: the log dir ------------------------------------------------------------------------------------


def _run_config(log_path: Path, **overrides: Any) -> run_core.RunConfig:
    values: dict[str, Any] = {"log_path": str(log_path), "model_name": "m", "lora_rank": 4,
                              "behavior_if_log_dir_exists": "resume", **overrides}
    return run_core.RunConfig(**values)


def _interrupted_run(log_path: Path, config: run_core.RunConfig, metric_steps: int, checkpoint_steps: list[int]) -> None:
    """A log dir as a run killed after logging ``metric_steps`` rows leaves it (4 batches per epoch)."""
    log_path.mkdir(parents=True)
    (log_path / "config.json").write_text(json.dumps(ml_log.dump_config(config)))
    (log_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n"
                                                    for s in range(metric_steps)))
    for step in checkpoint_steps:
        checkpoint_utils.append_checkpoint_record(log_path, {
            "name": f"{step:06d}", **run_core.make_plan(4, 1, None, None).loop_state(step),
            "state_path": f"tinker://run/weights/{step:06d}"})


def test_resume_drops_the_metrics_rows_past_the_last_checkpoint(tmp_path):
    config = _run_config(tmp_path / "run")
    _interrupted_run(tmp_path / "run", config, metric_steps=4, checkpoint_steps=[2])  # rows 0..3, checkpoint at 2
    resume = run_core.resume_point(config)
    assert resume.row is not None and resume.row["name"] == "000002"
    plan = run_core.make_plan(4, 2, None, resume.row)
    assert (plan.start_step, plan.end_step) == (2, 8)
    assert resume.begin(plan.start_step, plan.end_step)
    # rows 2 and 3 were logged after the checkpoint by the killed attempt: they are logged again by the rerun
    assert [row["step"] for row in ml_log.read_metrics(tmp_path / "run")] == [0, 1]


def test_a_finished_run_is_left_alone(tmp_path):
    config = _run_config(tmp_path / "run")
    _interrupted_run(tmp_path / "run", config, metric_steps=4, checkpoint_steps=[2, 4])
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    resume = run_core.resume_point(config)
    plan = run_core.make_plan(4, 1, None, resume.row)  # resumed at step 4 of 4
    assert asyncio.run(run_core.open_run(config, plan, resume)) is None  # no logging, no client
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_resuming_another_run_is_refused(tmp_path):
    _interrupted_run(tmp_path / "run", _run_config(tmp_path / "run"), metric_steps=2, checkpoint_steps=[])
    with pytest.raises(ConfigurationError, match=r"(?s)holds another run.*lora_rank: 4 .* 8"):
        run_core.resume_point(_run_config(tmp_path / "run", lora_rank=8))


# -- the training client ---------------------------------------------------------------------------------------


class _Service:
    """Records which creation call the core made; the checkpoint at any path was trained with ``stored``."""

    def __init__(self, stored: str | None) -> None:
        self.stored = stored
        self.calls: list[tuple[Any, ...]] = []

    def create_rest_client(self) -> Any:
        run = SimpleNamespace(user_metadata={} if self.stored is None else {"renderer_name": self.stored})
        future = SimpleNamespace(result=lambda: run)
        return SimpleNamespace(get_training_run_by_tinker_path=lambda path: future)

    async def create_training_client_from_state_with_optimizer_async(self, path: str, **kw: Any) -> str:
        self.calls.append(("resume", path, kw["user_metadata"]))
        return "client"

    async def create_training_client_from_state_async(self, path: str, **kw: Any) -> str:
        self.calls.append(("weights", path, kw["user_metadata"]))
        return "client"

    async def create_lora_training_client_async(self, **kw: Any) -> str:
        self.calls.append(("fresh", kw["base_model"], kw["rank"], kw["seed"], kw["user_metadata"]))
        return "client"


def _create(service: _Service, config: run_core.RunConfig, row: dict[str, Any] | None) -> Any:
    return asyncio.run(run_core.create_training_client(service, config, row))  # type: ignore[arg-type]


def test_training_client_resumed_started_from_weights_or_fresh(tmp_path):
    row = {"name": "000002", "state_path": "tinker://r/weights/000002"}
    service = _Service(stored="chatml")
    config = _run_config(tmp_path, renderer_name="chatml", load_checkpoint_path="tinker://r0/weights/final", seed=3)
    _create(service, config, row)  # the log dir's checkpoint wins over load_checkpoint_path
    _create(service, config, None)
    _create(service, chz.replace(config, load_checkpoint_path=None), None)
    assert service.calls == [
        ("resume", "tinker://r/weights/000002", {"renderer_name": "chatml"}),
        ("weights", "tinker://r0/weights/final", {"renderer_name": "chatml"}),
        ("fresh", "m", 4, 3, {"renderer_name": "chatml"}),
    ]


def test_resuming_a_checkpoint_of_another_renderer_is_refused(tmp_path):
    row = {"name": "000002", "state_path": "tinker://r/weights/000002"}
    config = _run_config(tmp_path, renderer_name="role_colon")
    for start in ({"row": row}, {"row": None, "load": "tinker://r0/weights/final"}):
        service = _Service(stored="chatml")
        cfg = chz.replace(config, load_checkpoint_path=start.get("load"))
        with pytest.raises(ConfigurationError, match="renderer_name='role_colon' differs from the renderer 'chatml'"):
            _create(service, cfg, start["row"])
        assert service.calls == []
    # unknown on either side: nothing to compare
    _create(_Service(stored=None), config, row)
    _create(_Service(stored="chatml"), chz.replace(config, renderer_name=None), row)


def test_renderer_recorded_by_the_engine_is_checked_on_resume(tmp_path):
    """The same check through the real in-process service: the renderer is what the training run recorded."""
    service = tinker.ServiceClient()
    config = _run_config(tmp_path, model_name="tinker-cookbook/tiny-smollm2", renderer_name="chatml")
    client = asyncio.run(run_core.create_training_client(service, config, None))
    row = checkpoint_utils.save_checkpoint(client, "000001", tmp_path, {"step": 1}, "state")
    with pytest.raises(ConfigurationError, match="differs from the renderer 'chatml'"):
        asyncio.run(run_core.create_training_client(service, chz.replace(config, renderer_name="llama3"), row))
    resumed = asyncio.run(run_core.create_training_client(service, config, row))
    assert resumed.get_info().model_name == "tinker-cookbook/tiny-smollm2"


# -- evaluations ---------------------------------------------------------------------------------------------------


class _TrainingEval(TrainingClientEvaluator):
    def __init__(self, name: str) -> None:
        self.name = name

    async def __call__(self, training_client: Any) -> dict[str, float]:
        return {self.name: float(training_client.snapshots)}


class _SamplingEval(SamplingClientEvaluator):
    def __init__(self, name: str) -> None:
        self.name = name

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        return {self.name: float(sampling_client)}


def test_which_evaluators_are_due_when():
    a, b, c = _TrainingEval("a"), _TrainingEval("b"), _TrainingEval("c")
    evaluators = run_core.Evaluators()
    evaluators.add(2, [a])
    evaluators.add(3, [b])
    evaluators.add(0, [c])  # never
    assert [evaluators.due(s) for s in range(7)] == [[a, b], [], [a], [b], [a], [], [a, b]]
    assert evaluators.due(5, final=True) == [a, b]
    finished = run_core.make_plan(6, 1, None, None)  # steps 0..5
    # before the last step of a finished run: nothing (that row gets the final model's evaluations instead)
    assert [evaluators.before_step(finished, s) for s in (4, 5)] == [[a], []]
    assert evaluators.after_run(finished) == [a, b]
    cut = run_core.make_plan(6, 1, 5, None)  # stops after step 4: no final evaluations, step 4 as usual
    assert evaluators.before_step(cut, 4) == [a] and evaluators.after_run(cut) == []


def test_run_evaluators_snapshots_the_weights_once_for_the_sampling_evaluators():
    class Client:
        snapshots = 0

        async def save_weights_and_get_sampling_client_async(self) -> int:
            self.snapshots += 1
            return 100 + self.snapshots

    client = Client()
    evaluators = [_TrainingEval("t0"), _SamplingEval("s1"), _SamplingEval("s2"), _TrainingEval("t3")]
    metrics = asyncio.run(run_core.run_evaluators(evaluators, client))  # type: ignore[arg-type]
    assert metrics == {"t0": 0.0, "s1": 101.0, "s2": 101.0, "t3": 1.0}  # one snapshot, made when first needed
    given = asyncio.run(run_core.run_evaluators([_SamplingEval("s")], client, 7))  # type: ignore[arg-type]
    assert given == {"s": 7.0} and client.snapshots == 1  # a given sampler is used as it is


def test_a_run_that_fails_at_start_leaves_no_stub_directory(tmp_path, monkeypatch):
    async def unavailable_model(*args: Any, **kwargs: Any) -> Any:
        raise ConfigurationError("Model 'm' is not available on this machine")

    monkeypatch.setattr(run_core, "create_training_client", unavailable_model)
    config = _run_config(tmp_path / "fresh", progress="off")
    resume = run_core.resume_point(config)
    with pytest.raises(ConfigurationError, match="not available"):
        asyncio.run(run_core.open_run(config, run_core.make_plan(4, 1, None, None), resume))
    assert not (tmp_path / "fresh").exists()  # the next attempt starts fresh, nothing to resume or delete
    # A directory that already held a run is never removed by a failed start.
    kept = _run_config(tmp_path / "kept", progress="off")
    _interrupted_run(tmp_path / "kept", kept, metric_steps=2, checkpoint_steps=[])
    resume = run_core.resume_point(kept)
    with pytest.raises(ConfigurationError):
        asyncio.run(run_core.open_run(kept, run_core.make_plan(4, 1, None, resume.row), resume))
    assert (tmp_path / "kept" / "metrics.jsonl").exists()
