"""trajectory_to_data merging/splitting, advantage centring and constant-reward group removal, on hand-made data."""

import pytest
from rl_helpers import ac, ob, single_turn_group, transition

from tinker_cookbook.rl.data_processing import (
    assemble_training_data,
    compute_advantages,
    datum_for_training,
    remove_constant_reward_groups,
    trajectory_to_data,
)
from tinker_cookbook.rl.types import Trajectory


def _arrays(datum):
    inputs = {k: v.tolist() for k, v in datum.loss_fn_inputs.items()}
    return datum.model_input.to_ints(), inputs


def test_single_turn_datum_is_shifted_with_zero_prompt_advantage():
    traj = Trajectory([transition(ob(10, 11, 12), ac([20, 21], [-0.5, -0.25]), 1.0, True)], ob())
    [datum] = trajectory_to_data(traj, 0.75)
    tokens, inputs = _arrays(datum)
    # Full sequence S = 10 11 12 20 21; inputs S[:-1], targets S[1:].
    assert tokens == [10, 11, 12, 20]
    assert inputs["target_tokens"] == [11, 12, 20, 21]
    assert inputs["logprobs"] == [0.0, 0.0, -0.5, -0.25]
    assert inputs["advantages"] == [0.0, 0.0, 0.75, 0.75]
    assert inputs["mask"] == [0.0, 0.0, 1.0, 1.0]


def test_extending_turns_merge_and_non_extending_turn_splits():
    # Turn 2's observation = turn 1's ob + action + new tokens (extends); turn 3's drops the earlier action.
    t1 = transition(ob(1, 2), ac([3, 4], [-1.0, -2.0]))
    t2 = transition(ob(1, 2, 3, 4, 5), ac([6], [-3.0]))
    t3 = transition(ob(1, 2, 5, 7), ac([8, 9], [-4.0, -5.0]), 1.0, True)
    data = trajectory_to_data(Trajectory([t1, t2, t3], ob()), -0.5)
    assert len(data) == 2
    tokens0, inputs0 = _arrays(data[0])
    assert tokens0 == [1, 2, 3, 4, 5]
    assert inputs0["target_tokens"] == [2, 3, 4, 5, 6]
    assert inputs0["mask"] == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert inputs0["logprobs"] == [0.0, -1.0, -2.0, 0.0, -3.0]
    assert inputs0["advantages"] == [0.0, -0.5, -0.5, 0.0, -0.5]
    tokens1, inputs1 = _arrays(data[1])
    assert tokens1 == [1, 2, 5, 7, 8]
    assert inputs1["target_tokens"] == [2, 5, 7, 8, 9]
    assert inputs1["mask"] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert inputs1["logprobs"] == [0.0, 0.0, 0.0, -4.0, -5.0]


def test_mismatched_action_logprobs_are_an_error():
    traj = Trajectory([transition(ob(1), ac([2, 3], [-1.0]), 0.0, True)], ob())
    with pytest.raises(ValueError, match="2 tokens but 1 logprobs"):
        trajectory_to_data(traj, 0.0)


def test_advantages_are_centred_per_group():
    groups = [single_turn_group([1.0, 0.0, 0.0, 1.0]), single_turn_group([0.2, 0.5, 0.8])]
    adv = compute_advantages(groups)
    assert adv[0] == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert adv[1] == pytest.approx([-0.3, 0.0, 0.3])
    assert sum(adv[1]) == pytest.approx(0.0)


def test_group_rewards_are_added_to_step_rewards():
    group = single_turn_group([1.0, 0.0])
    group.final_rewards_G = [0.5, -0.5]
    assert group.get_total_rewards() == [1.5, -0.5]
    assert compute_advantages([group])[0] == pytest.approx([1.0, -1.0])


def test_constant_reward_groups_are_removed():
    mixed, all_one, all_zero = (single_turn_group(r) for r in ([1.0, 0.0], [1.0, 1.0], [0.0, 0.0]))
    assert remove_constant_reward_groups([all_one, mixed, all_zero]) == [mixed]
    assert remove_constant_reward_groups([all_one, all_zero]) == []


def test_assemble_records_sources_and_training_datums_drop_mask():
    groups = [single_turn_group([1.0, 0.0]), single_turn_group([0.0, 0.0, 1.0])]
    data, sources = assemble_training_data(groups, compute_advantages(groups))
    assert [(s.group_idx, s.traj_idx) for s in sources] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert data[0].loss_fn_inputs["advantages"].tolist() == [0.0, 0.5]
    assert set(datum_for_training(data[0]).loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
