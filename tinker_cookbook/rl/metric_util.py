"""Metrics of rolled-out trajectory groups, and an evaluator that rolls out a test set.

``compute_trajectory_metrics`` reports ``env/all/<key>`` and, for each logging tag that selects only part of the
batch, ``env/<tag>/<key>``. Keys: ``reward/total`` (mean total reward per episode), ``ac_tokens_per_turn``,
``ob_tokens_per_turn``, ``turns_per_episode``, ``total_episodes``, ``total_turns``, ``total_ac_tokens``,
``total_ob_tokens``, ``by_group/frac_mixed`` / ``frac_all_good`` / ``frac_all_bad`` (a reward above 0.5 is good), and
the mean of every per-step and per-group metric the envs report (``correct``, ``format``, ...).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from tinker_cookbook import tinker
from tinker_cookbook.completers import TinkerTokenCompleter
from tinker_cookbook.eval.evaluators import SamplingClientEvaluator
from tinker_cookbook.rl.rollouts import do_batch_rollouts
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, TrajectoryGroup
from tinker_cookbook.utils.misc_utils import dict_mean

GOOD_REWARD_THRESHOLD = 0.5


def _group_stats(groups_P: Sequence[TrajectoryGroup]) -> dict[str, float]:
    episodes = [t for g in groups_P for t in g.trajectories_G]
    turns = [tr for t in episodes for tr in t.transitions]
    ac_tokens = sum(len(tr.ac.tokens) for tr in turns)
    ob_tokens = sum(tr.ob.length for tr in turns)
    rewards = [r for g in groups_P for r in g.get_total_rewards()]
    mixed = good = bad = 0
    for g in groups_P:
        goods = [r > GOOD_REWARD_THRESHOLD for r in g.get_total_rewards()]
        good += all(goods)
        bad += not any(goods)
        mixed += any(goods) and not all(goods)
    n_turns = max(len(turns), 1)
    return {
        "reward/total": sum(rewards) / max(len(rewards), 1),
        "ac_tokens_per_turn": ac_tokens / n_turns,
        "ob_tokens_per_turn": ob_tokens / n_turns,
        "turns_per_episode": len(turns) / max(len(episodes), 1),
        "total_episodes": float(len(episodes)),
        "total_turns": float(len(turns)),
        "total_ac_tokens": float(ac_tokens),
        "total_ob_tokens": float(ob_tokens),
        "by_group/frac_mixed": mixed / max(len(groups_P), 1),
        "by_group/frac_all_good": good / max(len(groups_P), 1),
        "by_group/frac_all_bad": bad / max(len(groups_P), 1),
    }


def _env_metric_means(groups_P: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """Mean of each env-reported metric: step metrics averaged over turns, group metrics over episodes."""
    step_metrics = [tr.metrics for g in groups_P for t in g.trajectories_G for tr in t.transitions]
    group_metrics = [m for g in groups_P for m in g.metrics_G]
    return {**dict_mean(step_metrics), **dict_mean(group_metrics)}


def compute_trajectory_metrics(
    groups_P: Sequence[TrajectoryGroup], tags_P: Sequence[Sequence[str]]
) -> dict[str, float]:
    """``env/all/...`` over all groups and ``env/<tag>/...`` for each tag that selects a strict subset."""
    if len(groups_P) != len(tags_P):
        raise ValueError(f"got {len(groups_P)} groups but {len(tags_P)} tag lists")
    by_tag: dict[str, list[TrajectoryGroup]] = defaultdict(list)
    for group, tags in zip(groups_P, tags_P, strict=True):
        for tag in tags:
            by_tag[tag].append(group)
    selections = {"all": list(groups_P)}
    selections.update({tag: gs for tag, gs in by_tag.items() if len(gs) < len(groups_P)})
    metrics: dict[str, float] = {}
    for name, groups in selections.items():
        if not groups:
            continue
        stats = {**_group_stats(groups), **_env_metric_means(groups)}
        metrics.update({f"env/{name}/{k}": v for k, v in stats.items()})
    return metrics


class RLTestSetEvaluator(SamplingClientEvaluator):
    """Rolls out every batch of a test ``RLDataset`` with a sampling client; metrics are ``<name>/env/all/...``.

    A ``SamplingClientEvaluator``: ``await evaluator(sampling_client) -> dict[str, float]``. Attached to a training
    run (the loops do it), it also writes the first ``num_groups_to_log`` groups of each evaluation as an HTML
    transcript, like the training rollouts': ``<log_path>/evals/<name>_step<NNNNNN>.html`` (the step the evaluation
    sees the weights of).
    """

    def __init__(self, dataset: RLDataset, max_tokens: int, name: str = "test", temperature: float = 1.0,
                 num_groups_to_log: int = 4) -> None:
        self.builders: list[EnvGroupBuilder] = [b for i in range(len(dataset)) for b in dataset.get_batch(i)]
        self.max_tokens = max_tokens
        self.name = name
        self.temperature = temperature
        self.num_groups_to_log = num_groups_to_log
        self.log_path: str | None = None
        self._calls = 0

    def attach_to_run(self, log_path: str) -> None:
        self.log_path = log_path

    async def __call__(self, sampling_client: tinker.SamplingClient) -> dict[str, float]:
        policy = TinkerTokenCompleter(sampling_client, self.max_tokens, temperature=self.temperature)
        rollout = await do_batch_rollouts(self.builders, policy)
        metrics = compute_trajectory_metrics(rollout.groups_P, [b.logging_tags() for b in rollout.builders_P])
        if self.log_path is not None:
            self._write_transcript(rollout.groups_P, rollout.builders_P, sampling_client)
        self._calls += 1
        return {f"{self.name}/{k}": v for k, v in metrics.items()}

    def _write_transcript(self, groups_P: Sequence[TrajectoryGroup], builders_P: Sequence[EnvGroupBuilder],
                          sampling_client: tinker.SamplingClient) -> None:
        from tinker_cookbook.rl.train_step import write_transcript
        from tinker_cookbook.utils import progress

        run = progress.current()
        step = run.steps_done if run is not None else self._calls  # outside a loop: the evaluation's number
        path = Path(self.log_path or ".") / "evals" / f"{self.name}_step{step:06d}.html"
        write_transcript(path, f"{self.name} evaluation at step {step}", groups_P, builders_P,
                         sampling_client.get_tokenizer(), self.num_groups_to_log)
