"""The registry of sequence ids that provenance spans are checked against."""

from __future__ import annotations

import pytest

from tinker_cookbook.tinker import provenance, types
from tinker_cookbook.tinker.errors import BadRequestError


def _response(*lengths: int) -> types.SampleResponse:
    return types.SampleResponse(sequences=[types.SampledSequence(stop_reason="length", tokens=list(range(n)))
                                           for n in lengths])


def _datum(sequence_id: str, prompt: int, sampled: int) -> types.Datum:
    n = prompt + sampled - 1
    return types.Datum(model_input=types.ModelInput.from_ints([1] * n),
                       loss_fn_inputs={"target_tokens": [1] * n, "weights": [1.0] * n}).with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=sequence_id, length=prompt),
                     types.SampledProvenanceSpan(sequence_id=sequence_id, length=sampled - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sequence_id, offset=1, length=prompt - 1),
                        types.SampledProvenanceSpan(sequence_id=sequence_id, length=sampled)])


def test_attach_gives_fresh_ids_keeps_given_ones_and_records_lengths() -> None:
    registry = provenance.SequenceRegistry()
    response = _response(3, 2)
    response.sequences[1].sequence_id = "seq-from-server"
    attached = registry.attach(4, response)
    ids = [s.sequence_id for s in attached.sequences]
    assert ids[0] and ids[0].startswith("seq-") and ids[1] == "seq-from-server"
    registry.check([_datum(ids[0], prompt=4, sampled=3), _datum("seq-from-server", prompt=4, sampled=2)])
    with pytest.raises(BadRequestError, match=r"data\[0\]\.model_input_spans\[0\] covers positions \[0, 5\) of the "
                                              r"prompt of 'seq-from-server', which has 4"):
        registry.check([_datum("seq-from-server", prompt=5, sampled=2)])
    with pytest.raises(BadRequestError, match=r"loss_fn_input_spans\[1\] covers positions \[0, 3\) of the sampled"):
        registry.check([_datum("seq-from-server", prompt=4, sampled=3)])


def test_the_least_recently_used_ids_are_forgotten_beyond_capacity() -> None:
    registry = provenance.SequenceRegistry(capacity=2)
    registry.record(["a", "b"], 4, _response(2, 2))
    registry.check([_datum("a", 4, 2)])  # a is now the most recently used
    registry.record(["c"], 4, _response(2))
    registry.check([_datum("a", 4, 2), _datum("c", 4, 2)])
    with pytest.raises(BadRequestError, match=r"sequence_id='b' is not a sequence sampled here .* last 2 are kept"):
        registry.check([_datum("b", 4, 2)])


def test_data_without_provenance_or_not_a_list_passes_to_the_engine_checks() -> None:
    registry = provenance.SequenceRegistry()
    plain = types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": [2, 3]})
    registry.check([plain])
    registry.check("not a list")  # the engine names what is wrong with it


def test_a_prompt_whose_image_length_only_the_model_knows_bounds_only_the_sampled_tokens() -> None:
    image = types.ImageChunk(data=b"\x89PNG", format="png")  # no expected_tokens: the model decides its length
    prompt = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2]), image])
    assert provenance.prompt_length(prompt) is None
    assert provenance.prompt_length(types.ModelInput.from_ints([1, 2, 3])) == 3
    registry = provenance.SequenceRegistry()
    sequence_id = registry.attach(provenance.prompt_length(prompt), _response(3)).sequences[0].sequence_id
    assert sequence_id is not None
    registry.check([_datum(sequence_id, prompt=40, sampled=3)])  # any prompt span length is accepted
    with pytest.raises(BadRequestError, match=r"covers positions \[0, 4\) of the sampled tokens"):
        registry.check([_datum(sequence_id, prompt=40, sampled=4)])
