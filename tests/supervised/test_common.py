"""Datum construction: shifts, truncation, reduction, images, and the NLL formula, on hand-made sequences."""

import pytest
import torch

from tinker_cookbook.exceptions import DataError
from tinker_cookbook.supervised.common import (
    compute_mean_nll,
    count_loss_tokens,
    datum_from_model_input_weights,
)
from tinker_cookbook.tinker import types


def _fields(datum: types.Datum) -> tuple[list[int], list[int], list[float]]:
    return (
        datum.model_input.to_ints(),
        datum.loss_fn_inputs["target_tokens"].tolist(),
        datum.loss_fn_inputs["weights"].tolist(),
    )


def test_inputs_right_shifted_targets_left_shifted_mean_reduction():
    # tokens 10 11 12 13, weights 0 0 1 1: inputs drop the last token, targets drop the first,
    # weights follow the targets (0 1 1) and "mean" scales them to sum to 1.
    datum = datum_from_model_input_weights(types.ModelInput.from_ints([10, 11, 12, 13]), [0, 0, 1, 1])
    assert _fields(datum) == ([10, 11, 12], [11, 12, 13], [0.0, 0.5, 0.5])


def test_reduction_none_keeps_raw_weights_and_accepts_tensors():
    datum = datum_from_model_input_weights(
        types.ModelInput.from_ints([10, 11, 12, 13]), torch.tensor([0.0, 0.0, 1.0, 2.0]), reduction="none"
    )
    assert _fields(datum) == ([10, 11, 12], [11, 12, 13], [0.0, 1.0, 2.0])


def test_truncation_keeps_the_first_max_length_positions():
    # max_length 3 keeps 10 11 12 (weights 0 0 1) -> inputs 10 11, targets 11 12, weights 0 1
    datum = datum_from_model_input_weights(types.ModelInput.from_ints([10, 11, 12, 13]), [0, 0, 1, 1], max_length=3)
    assert _fields(datum) == ([10, 11], [11, 12], [0.0, 1.0])


def test_weight_of_the_first_token_never_counts():
    # Nothing predicts position 0, so its weight 1 is dropped; the single target 11 has weight 0.
    with pytest.raises(DataError, match="no trainable tokens"):
        datum_from_model_input_weights(types.ModelInput.from_ints([10, 11]), [1, 0])


def test_image_positions_are_never_targets_and_are_dropped_whole_by_truncation():
    image = types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=2)
    model_input = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1]), image,
                                           types.EncodedTextChunk(tokens=[5, 6])])
    # positions 1 img img 5 6 -> targets img img 5 6 = 0 0 5 6; weights 0 0 1 1 -> mean 0 0 .5 .5
    datum = datum_from_model_input_weights(model_input, [0, 0, 0, 1, 1])
    assert datum.loss_fn_inputs["target_tokens"].tolist() == [0, 0, 5, 6]
    assert datum.loss_fn_inputs["weights"].tolist() == [0.0, 0.0, 0.5, 0.5]
    assert [c.length for c in datum.model_input.chunks] == [1, 2, 1]
    # max_length 4 cuts the last text chunk to [5]: inputs 1 img, targets 0 0 5
    cut = datum_from_model_input_weights(model_input, [0, 0, 0, 1, 1], max_length=4)
    assert cut.loss_fn_inputs["target_tokens"].tolist() == [0, 0, 5]
    assert cut.loss_fn_inputs["weights"].tolist() == [0.0, 0.0, 1.0]
    # max_length 2 would split the image: it is dropped whole, leaving one position, too short to train
    with pytest.raises(DataError, match="at least 2 positions"):
        datum_from_model_input_weights(model_input, [0, 0, 0, 1, 1], max_length=2)


def test_bad_arguments():
    with pytest.raises(DataError, match="weights has 3 entries but model_input has 4"):
        datum_from_model_input_weights(types.ModelInput.from_ints([1, 2, 3, 4]), [0, 1, 1])
    with pytest.raises(DataError, match="reduction='sum'"):
        datum_from_model_input_weights(types.ModelInput.from_ints([1, 2]), [0, 1], reduction="sum")  # type: ignore[arg-type]


def test_compute_mean_nll_hand_value():
    # -(1 * -1 + 3 * -2 + 0 * -5) / (1 + 3 + 0) = 7 / 4
    logprobs = [types.TensorData(data=[-1.0, -2.0], dtype="float32"), torch.tensor([-5.0])]
    weights = [types.TensorData(data=[1.0, 3.0], dtype="float32"), [0.0]]
    assert compute_mean_nll(logprobs, weights) == pytest.approx(1.75)
    assert compute_mean_nll([[-1.0]], [[0.0]]) != compute_mean_nll([[-1.0]], [[0.0]])  # NaN without weight


def test_count_loss_tokens_counts_nonzero_weights():
    data = [datum_from_model_input_weights(types.ModelInput.from_ints([1, 2, 3, 4]), [0, 0, 1, 1]),
            datum_from_model_input_weights(types.ModelInput.from_ints([1, 2, 3]), [0, 1, 1])]
    assert count_loss_tokens(data) == 4
