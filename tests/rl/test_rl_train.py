"""The RL pieces on a real (tiny, random) model through the public API: concurrent rollouts, one training step,
request ordering, and the training loop in sync, streaming and async modes, with resume."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tinker_cookbook import renderers, tinker
from tinker_cookbook.completers import TinkerTokenCompleter
from tinker_cookbook.rl import train
from tinker_cookbook.rl.arithmetic_env import ArithmeticDatasetBuilder
from tinker_cookbook.rl.rollouts import do_batch_rollouts
from tinker_cookbook.rl.train_step import TrainSettings, finish_substeps, prepare_data, submit_substep
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.tokenizer_utils import get_tokenizer

MODEL = "tinker-cookbook/tiny-smollm2"
RENDERER = "chatml"
SETTINGS = TrainSettings(learning_rate=1e-2, loss_fn="importance_sampling", loss_fn_config=None,
                         remove_constant_reward_groups=False, kl_penalty_coef=0.0, kl_discount_factor=0.0)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def service() -> tinker.ServiceClient:
    return tinker.ServiceClient()


class RecordingSampler:
    """Forwards to a real sampling client and records how many requests were in flight at once."""

    def __init__(self, inner: tinker.SamplingClient) -> None:
        self.inner = inner
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0

    async def sample_async(self, **kwargs: Any) -> tinker.SampleResponse:
        self.in_flight += 1
        self.requests += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self.inner.sample_async(**kwargs)
        finally:
            self.in_flight -= 1


class GuessEnv(Env):
    """A toy multi-step env: two turns; each observation extends the previous one by the action and a user turn.

    Reward 1 at the end when the last reply starts with an even token id (arbitrary, but it varies between samples).
    """

    def __init__(self, renderer: renderers.Renderer) -> None:
        self.renderer = renderer
        self.messages: list[dict] = [{"role": "user", "content": "Say a number."}]
        self.turn = 0

    async def initial_observation(self):
        return self.renderer.build_generation_prompt(self.messages), self.renderer.get_stop_sequences()

    async def step(self, action):
        self.turn += 1
        message, _ = self.renderer.parse_response(action)
        self.messages += [message, {"role": "user", "content": "Another one."}]
        done = self.turn == 2
        reward = float(bool(action) and action[0] % 2 == 0) if done else 0.0
        return StepResult(reward, done, self.renderer.build_generation_prompt(self.messages),
                          self.renderer.get_stop_sequences(), metrics={"turn": float(self.turn)})


class GuessGroup(EnvGroupBuilder):
    def __init__(self, renderer: renderers.Renderer, n: int = 4) -> None:
        self.renderer, self.n = renderer, n

    async def make_envs(self):
        return [GuessEnv(self.renderer) for _ in range(self.n)]

    def logging_tags(self):
        return ["guess"]


def _renderer() -> renderers.Renderer:
    return renderers.get_renderer(RENDERER, get_tokenizer(MODEL))


def test_multi_step_rollouts_are_concurrent_and_one_step_trains(service):
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
    sampler = RecordingSampler(tc.save_weights_and_get_sampling_client())
    policy = TinkerTokenCompleter(sampler, max_tokens=6, seed=0)  # type: ignore[arg-type]
    builders = [GuessGroup(_renderer()) for _ in range(3)]
    rollout = run(do_batch_rollouts(builders, policy))
    # 3 groups × 4 envs: the first turn of all 12 episodes was in flight at the same time.
    assert sampler.max_in_flight == 12 and sampler.requests == 24
    assert all(len(t.transitions) == 2 for g in rollout.groups_P for t in g.trajectories_G)

    probe = rollout.groups_P[0].trajectories_G[0].transitions[1]
    sequence = probe.ob.append(tinker.EncodedTextChunk(tokens=probe.ac.tokens))
    before = tc.save_weights_and_get_sampling_client().compute_logprobs(sequence).result()

    async def train_once():
        data_D, _ = await prepare_data(rollout.groups_P, SETTINGS, None)
        return data_D, await finish_substeps([await submit_substep(tc, data_D, SETTINGS)])

    data_D, metrics = run(train_once())
    # An episode is one datum when turn 2's prompt extends turn 1's prompt + sampled tokens, else two (a random
    # model's reply may be cut off by max_tokens or re-tokenize differently once rendered into the history).
    expected = 0
    for group in rollout.groups_P:
        for traj in group.trajectories_G:
            first, second = traj.transitions
            held = first.ob.to_ints() + first.ac.tokens
            expected += 1 if second.ob.to_ints()[: len(held)] == held else 2
    assert len(data_D) == expected and 12 <= expected <= 24
    assert np.isfinite(metrics["optim/kl_sample_train_v1"]) and metrics["optim/entropy"] > 0
    after = tc.save_weights_and_get_sampling_client().compute_logprobs(sequence).result()
    assert not np.allclose(before[1:], after[1:])


class OrderRecorder:
    """A training client proxy that logs submissions and when their results are awaited."""

    def __init__(self, inner: tinker.TrainingClient) -> None:
        self.inner, self.events = inner, []

    def _wrap(self, name: str, future: tinker.APIFuture) -> Any:
        events = self.events

        class Awaited:
            async def result_async(self, timeout=None):
                events.append(f"await {name}")
                return await future.result_async(timeout)

        return Awaited()

    async def forward_backward_async(self, data, loss_fn, loss_fn_config=None):
        self.events.append("submit forward_backward")
        return self._wrap("forward_backward", await self.inner.forward_backward_async(data, loss_fn, loss_fn_config))

    async def optim_step_async(self, params):
        self.events.append("submit optim_step")
        return self._wrap("optim_step", await self.inner.optim_step_async(params))


def test_forward_backward_and_optim_step_are_submitted_back_to_back(service):
    tc = service.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
    policy = TinkerTokenCompleter(tc.save_weights_and_get_sampling_client(), max_tokens=4, seed=1)
    rollout = run(do_batch_rollouts([GuessGroup(_renderer(), 2)], policy))
    recorder = OrderRecorder(tc)

    async def step():
        data_D, _ = await prepare_data(rollout.groups_P, SETTINGS, None)
        await finish_substeps([await submit_substep(recorder, data_D, SETTINGS)])  # type: ignore[arg-type]

    run(step())
    assert recorder.events[:2] == ["submit forward_backward", "submit optim_step"]


# -- the loop -------------------------------------------------------------------------------------------


def _config(tmp_path: Path, name: str, **overrides: Any) -> train.Config:
    builder = ArithmeticDatasetBuilder(batch_size=2, group_size=4, model_name_for_tokenizer=MODEL,
                                       renderer_name=RENDERER, n_batches=6, max_operand=9, n_test_problems=2)
    values: dict[str, Any] = {
        "learning_rate": 1e-3, "dataset_builder": builder, "model_name": MODEL, "renderer_name": RENDERER,
        "max_tokens": 4, "log_path": str(tmp_path / name), "lora_rank": 4, "eval_every": 2, "save_every": 2,
        "max_steps": 4, "behavior_if_log_dir_exists": "resume",
    }
    values.update(overrides)
    return train.Config(**values)


def _metrics(log_path: str) -> list[dict]:
    return [json.loads(line) for line in (Path(log_path) / "metrics.jsonl").read_text().splitlines()]


def _checkpoints(log_path: str) -> list[dict]:
    return [json.loads(line) for line in (Path(log_path) / "checkpoints.jsonl").read_text().splitlines()]


def test_sync_loop_writes_metrics_checkpoints_and_transcripts(tmp_path):
    cfg = _config(tmp_path, "sync", max_steps=3, num_substeps=2)
    run(train.main(cfg))
    rows = _metrics(cfg.log_path)
    train_rows = [r for r in rows if "env/all/reward/total" in r]
    assert [r["step"] for r in train_rows] == [0, 1, 2]
    for key in ("env/all/correct", "env/all/format", "env/all/ac_tokens_per_turn", "optim/kl_sample_train_v1",
                "optim/kl_sample_train_v2", "optim/entropy", "progress/done_frac", "time/total"):
        assert key in train_rows[-1], key
    # The iteration split: sampling, training and the rest add up to the total.
    last = train_rows[-1]
    assert last["time/rollout"] + last["time/train"] <= last["time/rollout_and_train"] + 1e-6
    assert abs(last["time/rollout_and_train"] + last["time/other"] - last["time/total"]) < 1e-6
    assert any("test/env/all/correct" in r for r in rows)  # eval at steps 0, 2 and after the end
    assert [c["name"] for c in _checkpoints(cfg.log_path)] == ["000002", "final"]
    html = (Path(cfg.log_path) / "iteration_000001" / "train.html").read_text()
    assert "What is" in html and "total reward" in html
    assert json.loads((Path(cfg.log_path) / "config.json").read_text())["model_name"] == MODEL
    run(train.main(cfg))  # a finished run is a no-op
    assert len(_metrics(cfg.log_path)) == len(rows)


def test_resume_continues_exactly(tmp_path):
    full = _config(tmp_path, "full")
    run(train.main(full))
    half = _config(tmp_path, "half", max_steps=2)
    run(train.main(half))
    resumed = _config(tmp_path, "half", max_steps=4)
    run(train.main(resumed))
    keys = ("env/all/reward/total", "env/all/ac_tokens_per_turn", "optim/loss:sum", "optim/kl_sample_train_v2")
    a = {r["step"]: r for r in _metrics(full.log_path) if "env/all/reward/total" in r}
    b = {r["step"]: r for r in _metrics(resumed.log_path) if "env/all/reward/total" in r}
    assert sorted(b) == [0, 1, 2, 3]
    for step in (2, 3):
        for key in keys:
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-6), (step, key)


def test_streaming_minibatches_train(tmp_path):
    cfg = _config(tmp_path, "stream", max_steps=2, eval_every=0,
                  stream_minibatch_config=train.StreamMinibatchConfig(groups_per_batch=2, num_minibatches=2))
    run(train.main(cfg))
    rows = [r for r in _metrics(cfg.log_path) if "env/all/reward/total" in r]
    assert len(rows) == 2 and all("optim/kl_sample_train_v1" in r for r in rows)


def test_streaming_batch_size_mismatch_is_a_clear_error(tmp_path):
    cfg = _config(tmp_path, "stream_bad", stream_minibatch_config=train.StreamMinibatchConfig(
        groups_per_batch=3, num_minibatches=1))
    with pytest.raises(ValueError, match="groups_per_batch=3"):
        run(train.main(cfg))


@pytest.mark.parametrize("max_off", [0, 1])
def test_async_trains_on_stale_samples_within_the_bound(tmp_path, max_off):
    cfg = _config(tmp_path, f"async{max_off}", eval_every=0, save_every=0,
                  async_config=train.AsyncConfig(max_steps_off_policy=max_off, groups_per_batch=2))
    run(train.main(cfg))
    rows = [r for r in _metrics(cfg.log_path) if "async/staleness_max" in r]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["async/staleness_max"] <= max_off for r in rows)
    assert all("optim/kl_sample_train_v1" in r for r in rows)  # every step trained on the groups it collected
    if max_off == 1:
        assert any(r["async/staleness_max"] == 1 for r in rows)  # groups from the previous sampler were used


class ExplodingEnv(Env):
    async def initial_observation(self):
        return tinker.ModelInput.from_ints([1, 2]), [2]

    async def step(self, action):
        raise RuntimeError("env exploded")


class MixedDataset(RLDataset):
    """Batch of two arithmetic-like groups plus one group whose env raises."""

    def __init__(self, good: RLDataset) -> None:
        self.good = good

    def get_batch(self, index):
        class Exploding(EnvGroupBuilder):
            async def make_envs(self):
                return [ExplodingEnv(), ExplodingEnv()]

        return [*self.good.get_batch(index), Exploding()]

    def __len__(self):
        return len(self.good)


class MixedBuilder(RLDatasetBuilder):
    inner: ArithmeticDatasetBuilder

    async def __call__(self):
        train_ds, _ = await self.inner()
        return MixedDataset(train_ds), None


def test_env_errors_stop_the_run_or_are_skipped(tmp_path):
    import chz

    mixed = chz.chz(type("Mixed", (MixedBuilder,), {"__annotations__": {"inner": ArithmeticDatasetBuilder}}))
    inner = _config(tmp_path, "x").dataset_builder
    strict = _config(tmp_path, "strict", dataset_builder=mixed(inner=inner), max_steps=2, eval_every=0)
    with pytest.raises(RuntimeError, match="env exploded"):
        run(train.main(strict))
    assert not (Path(strict.log_path) / "checkpoints.jsonl").exists()
    tolerant = _config(tmp_path, "tolerant", dataset_builder=mixed(inner=inner), max_steps=2, eval_every=0,
                       rollout_error_tolerance=True)
    run(train.main(tolerant))
    rows = [r for r in _metrics(tolerant.log_path) if "rollout/failed_groups" in r]
    assert [r["rollout/failed_groups"] for r in rows] == [1.0, 1.0]


def test_kl_penalty_and_ppo_loss_config(tmp_path):
    cfg = _config(tmp_path, "kl", max_steps=1, eval_every=0, kl_penalty_coef=0.5, loss_fn="ppo",
                  loss_fn_config={"clip_low_threshold": 0.9, "clip_high_threshold": 1.1})
    run(train.main(cfg))
    [row] = [r for r in _metrics(cfg.log_path) if "env/all/reward/total" in r]
    # Right after init the LoRA output is zero, so the policy equals the base model: the KL is ~0.
    assert abs(row["kl_policy_base"]) < 1e-3 and "optim/kl_sample_train_v1" in row


def test_unknown_loss_config_key_is_an_error(tmp_path):
    cfg = _config(tmp_path, "badloss", max_steps=1, eval_every=0, loss_fn="ppo", loss_fn_config={"beta": 1.0})
    with pytest.raises(tinker.BadRequestError, match="beta"):
        run(train.main(cfg))


def test_progress_shows_each_iteration_and_its_phases(tmp_path, capsys, monkeypatch):
    from tinker_cookbook.utils.progress import RunProgress

    phases: list[str] = []
    original = RunProgress.set_phase

    def recording(self: RunProgress, name: str) -> None:
        phases.append(name)
        original(self, name)

    monkeypatch.setattr(RunProgress, "set_phase", recording)
    train.run(_config(tmp_path, "progress", max_steps=2, recipe_name="rl"))  # the synchronous entry point
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rl step")]
    assert [line.split(" | ")[0] for line in lines[:2]] == ["rl step 1/2 50%", "rl step 2/2 100%"]
    assert all("ETA" in line and "s/step" in line for line in lines)
    # Sampling and training each iteration, the evaluations (eval_every=2: before step 0, and the final one),
    # the checkpoints (save_every=2: the final one).
    assert {"sampling", "training", "evaluating", "saving"} <= set(phases)
    # The test-set evaluations are traced like the training rollouts, in the iteration's eval.html.
    assert "Evaluator test" in (tmp_path / "progress" / "iteration_000000" / "eval.html").read_text()
