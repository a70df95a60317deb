"""Conversations to datums with the real SmolLM2 tokenizer and the chatml renderer, and the file dataset."""

import json

import pytest
from sl_helpers import TINY_MODEL, card_conversation

from tinker_cookbook import renderers
from tinker_cookbook.exceptions import ConfigurationError, DataError
from tinker_cookbook.supervised.chat_datasets import example_conversations_path, get_chat_dataset_builder
from tinker_cookbook.supervised.data import (
    FromConversationFileBuilder,
    SupervisedDatasetFromHFDataset,
    conversation_to_datum,
)
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.tokenizer_utils import get_tokenizer


@pytest.fixture(scope="module")
def renderer():
    return renderers.get_renderer("chatml", get_tokenizer(TINY_MODEL))


def _common(**kwargs):
    args = dict(model_name_for_tokenizer=TINY_MODEL, renderer_name="chatml", max_length=128, batch_size=4)
    args.update(kwargs)
    return ChatDatasetBuilderCommonConfig(**args)


def test_datum_trains_exactly_the_assistant_reply(renderer):
    messages = card_conversation(3)["messages"]
    datum = conversation_to_datum(messages, renderer, max_length=None)
    targets = datum.loss_fn_inputs["target_tokens"].tolist()
    weights = datum.loss_fn_inputs["weights"].tolist()
    trained = renderer.tokenizer.decode([t for t, w in zip(targets, weights) if w > 0])
    assert trained.startswith("Name: Person 3\nAge: 23\nCity: Town3")
    assert trained.endswith("<|im_end|>")  # the end-of-turn token is learned, so the model knows when to stop
    assert sum(weights) == pytest.approx(1.0)  # mean reduction
    # every trained token is the same weight (1 / number of trained tokens)
    assert len({round(w, 7) for w in weights if w > 0}) == 1


def test_no_trainable_tokens_is_a_clear_error(renderer):
    messages = [{"role": "user", "content": "hello"}]
    with pytest.raises(DataError, match="no trainable tokens under train_on_what=all_assistant_messages"):
        conversation_to_datum(messages, renderer, max_length=None)


def test_max_length_shorter_than_the_prompt_is_a_clear_error(renderer):
    with pytest.raises(DataError, match="max_length=8 is shorter than the prompt"):
        conversation_to_datum(card_conversation(1)["messages"], renderer, max_length=8)
    # a max_length inside the reply truncates it instead
    full = conversation_to_datum(card_conversation(1)["messages"], renderer, max_length=None)
    cut = conversation_to_datum(card_conversation(1)["messages"], renderer, max_length=full.model_input.length - 2)
    assert cut.model_input.length == full.model_input.length - 3


def test_file_builder_splits_and_batches(conversations_file):
    train, test = FromConversationFileBuilder(common_config=_common(), file_path=str(conversations_file),
                                              test_size=4)()
    assert len(train) == 16 // 4 and test is not None and len(test) == 1 and len(test.get_batch(0)) == 4
    train.set_epoch(0)
    first = [d.model_input.to_ints() for d in train.get_batch(0)]
    train.set_epoch(1)
    other = [d.model_input.to_ints() for d in train.get_batch(0)]
    train.set_epoch(0)
    assert [d.model_input.to_ints() for d in train.get_batch(0)] == first  # same epoch, same batch
    assert other != first  # epochs are reshuffled


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


@pytest.mark.parametrize("bad_line, why", [
    ("{not json", "not a conversation"),
    ('{"text": "no messages here"}', "not a conversation"),
    ('{"messages": [{"role": "robot", "content": "x"}]}', "role='robot'"),
    ('{"messages": [{"role": "user", "content": "only a question"}]}', "no trainable tokens"),
])
def test_bad_line_is_reported_with_file_and_line_or_skipped(tmp_path, bad_line, why):
    path = tmp_path / "data.jsonl"
    good = [json.dumps(card_conversation(i)) for i in range(8)]
    _write(path, good[:3] + [bad_line] + good[3:])
    builder = FromConversationFileBuilder(common_config=_common(), file_path=str(path))
    with pytest.raises(DataError, match=rf"data.jsonl:4: .*{why}.*on_invalid_line=skip"):
        builder()
    skipping = FromConversationFileBuilder(common_config=_common(), file_path=str(path), on_invalid_line="skip")
    train, _ = skipping()
    assert len(train) == 8 // 4


def test_too_few_rows_for_a_batch(conversations_file):
    with pytest.raises(DataError, match="fewer than batch_size=32"):
        FromConversationFileBuilder(common_config=_common(batch_size=32), file_path=str(conversations_file))()


def test_dataset_skips_or_raises_rows_that_fail_to_map():
    def to_datum(row):
        raise DataError("broken row")

    raising = SupervisedDatasetFromHFDataset([1, 2], 2, map_fn=to_datum, row_name=lambda i: f"item {i}")
    with pytest.raises(DataError, match="item 0: broken row"):
        raising.get_batch(0)
    assert SupervisedDatasetFromHFDataset([1, 2], 2, map_fn=to_datum, on_invalid_row="skip").get_batch(0) == []


def test_named_datasets(monkeypatch):
    assert example_conversations_path().is_file()
    builder = get_chat_dataset_builder("example", _common())
    assert isinstance(builder, FromConversationFileBuilder) and builder.test_size > 0
    with pytest.raises(ConfigurationError, match="dataset='no_such_set' is not a known dataset"):
        get_chat_dataset_builder("no_such_set", _common())
    with pytest.raises(ConfigurationError, match="no such file"):
        get_chat_dataset_builder("missing.jsonl", _common())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConfigurationError, match="could not be loaded.*dataset=example"):
        get_chat_dataset_builder("HuggingFaceH4/no_robots", _common())()


def test_example_data_is_valid_and_every_conversation_trains():
    lines = example_conversations_path().read_text().splitlines()
    assert len(lines) >= 300
    train, test = get_chat_dataset_builder("example", _common(max_length=256))()
    assert test is not None and len(test.get_batch(0)) >= 40
    assert len(train) * 4 + len(test.get_batch(0)) == len(lines)
