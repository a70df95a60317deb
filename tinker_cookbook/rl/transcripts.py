"""Rollout transcripts in ``logtree`` reports: the HTML pages of an RL run (``iteration_NNNNNN/train.html``, and
``eval.html`` for the evaluators' rollouts).

Per group: its tags and rewards; per rollout: each turn's prompt and sampled response (decoded), reward, stop
reason, metrics and logs, then whatever the env itself logged through ``logtree`` during the episode (recorded by
``do_group_rollout(record=True)``), and last what ``compute_group_rewards`` logged. A turn whose prompt extends the
previous turn shows only the tokens the env added.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tinker_cookbook.rl.types import EnvGroupBuilder, Trajectory, TrajectoryGroup
from tinker_cookbook.utils import logtree


def _decode(tokenizer: Any, tokens: Sequence[int]) -> str:
    return tokenizer.decode(list(tokens)) if tokenizer is not None else " ".join(map(str, tokens))


def _log_turns(traj: Trajectory, tokenizer: Any) -> None:
    context: list[int] = []
    for k, tr in enumerate(traj.transitions):
        ob_ints = tr.ob.to_ints()
        if context and ob_ints[: len(context)] == context:
            # A multi-turn observation that extends the last turn: show only what the env added.
            logtree.log_text(_decode(tokenizer, ob_ints[len(context):]), div_class="prompt")
        else:
            with logtree.scope_details(f"turn {k} prompt ({tr.ob.length} tokens)"):
                logtree.log_text(_decode(tokenizer, ob_ints), div_class="prompt")
        context = ob_ints + list(tr.ac.tokens)
        logtree.log_text(_decode(tokenizer, tr.ac.tokens), div_class="response good" if tr.reward > 0.5 else
                         "response bad")
        logtree.table_from_dict({"reward": tr.reward, "stop_reason": tr.ac.stop_reason, **tr.metrics, **tr.logs})


def log_group_transcripts(groups_P: Sequence[TrajectoryGroup], builders_P: Sequence[EnvGroupBuilder],
                          tokenizer: Any, num_groups: int) -> None:
    """Log the first ``num_groups`` groups into the active ``logtree`` trace (nothing when none is active)."""
    for g, (group, builder) in enumerate(zip(groups_P[:num_groups], builders_P[:num_groups], strict=True)):
        rewards_G = group.get_total_rewards()
        tags = ", ".join(builder.logging_tags()) or type(builder).__name__
        with logtree.scope_header(f"Group {g} ({tags}): rewards {[round(r, 3) for r in rewards_G]}"):
            for t, (traj, reward) in enumerate(zip(group.trajectories_G, rewards_G, strict=True)):
                with logtree.scope_header(f"Rollout {t}: total reward {reward:.3f}"):
                    _log_turns(traj, tokenizer)
                    if group.transcript is not None and group.transcript.episodes_G[t].root.children:
                        logtree.log_trace(group.transcript.episodes_G[t], title="Logged by the env")
                    logtree.table_from_dict({"group reward": group.final_rewards_G[t], **group.metrics_G[t]})
            if group.transcript is not None and group.transcript.group_rewards.root.children:
                logtree.log_trace(group.transcript.group_rewards, title="Logged by compute_group_rewards")


def write_transcript(path: Path, title: str, groups_P: Sequence[TrajectoryGroup],
                     builders_P: Sequence[EnvGroupBuilder], tokenizer: Any, num_groups: int) -> Path | None:
    """A report page of the first ``num_groups`` groups at ``path`` (None, and no file, when there are none)."""
    if num_groups <= 0 or not groups_P:
        return None
    with logtree.init_trace(title, path=path):
        log_group_transcripts(groups_P, builders_P, tokenizer, num_groups)
    return path
