"""SFT rows in the shapes people have: messages, ShareGPT, Alpaca, prompt/completion; files, in-memory datasets,
hub ids (offline here: a clear error), column mappings and the errors for rows of no known shape."""

import json

import datasets
import pytest
from sl_helpers import TINY_MODEL

from tinker_cookbook import renderers
from tinker_cookbook.exceptions import ConfigurationError, DataError, DataFormatError
from tinker_cookbook.supervised.chat_datasets import (
    FromDatasetBuilder,
    get_chat_dataset_builder,
    rows_dataset,
)
from tinker_cookbook.supervised.data import FromConversationFileBuilder, conversation_to_datum
from tinker_cookbook.supervised.formats import detect_format, row_to_messages
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.tokenizer_utils import get_tokenizer

SYSTEM = "You write contact cards."
QUESTION = "Ada is 36 and lives in Oslo."
ANSWER = "Name: Ada\nAge: 36\nCity: Oslo"
EXPECTED = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": ANSWER}]

ROWS = {
    "messages": {"messages": EXPECTED},
    "sharegpt": {"system": SYSTEM, "conversations": [{"from": "human", "value": QUESTION},
                                                     {"from": "gpt", "value": ANSWER}]},
    "alpaca": {"system": SYSTEM, "instruction": QUESTION, "input": "", "output": ANSWER},
    "prompt_completion": {"system": SYSTEM, "prompt": QUESTION, "completion": ANSWER},
}


def _common(**kwargs):
    args = dict(model_name_for_tokenizer=TINY_MODEL, renderer_name="chatml", max_length=128, batch_size=2)
    args.update(kwargs)
    return ChatDatasetBuilderCommonConfig(**args)


@pytest.mark.parametrize("shape", list(ROWS))
def test_every_shape_is_detected_and_gives_the_same_conversation(shape):
    assert detect_format(ROWS[shape]) == shape
    assert row_to_messages(ROWS[shape]) == EXPECTED
    assert row_to_messages(ROWS[shape], shape) == EXPECTED


def test_alpaca_input_and_conversational_prompt_completion():
    row = {"instruction": "Translate to French.", "input": "cat", "output": "chat"}
    assert row_to_messages(row)[0] == {"role": "user", "content": "Translate to French.\n\ncat"}
    trl = {"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hello"}]}
    assert row_to_messages(trl) == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    sharegpt_roles = {"conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]}
    assert [m["role"] for m in row_to_messages(sharegpt_roles)] == ["user", "assistant"]


def test_a_column_mapping_reads_other_column_names():
    row = {"question": QUESTION, "answer": ANSWER, "id": 7}
    assert row_to_messages(row, columns={"prompt": "question", "completion": "answer"}) == EXPECTED[1:]
    with pytest.raises(DataFormatError, match=r"columns.prompt='query': the row has no column 'query'"):
        row_to_messages(row, columns={"prompt": "query", "completion": "answer"})


@pytest.mark.parametrize("row, message", [
    ({"question": "q", "answer": "a"}, r"keys \['answer', 'question'\] has none of the known shapes.*ShareGPT.*"
                                       r"Alpaca.*prompt/completion.*columns.prompt=question"),
    ("just text", "expected an object"),
    ({"conversations": [{"from": "robot", "value": "x"}]}, r"conversations\[0\].from='robot' is not one of"),
    ({"prompt": 3, "completion": "a"}, "'prompt' must be a string or a list of messages"),
    ({"messages": [{"role": "narrator", "content": "x"}]}, r"messages\[0\].role='narrator'"),
])
def test_rows_of_no_known_shape_name_the_keys_and_the_shapes(row, message):
    with pytest.raises(DataFormatError, match=message):
        row_to_messages(row)
    with pytest.raises(DataFormatError, match=r"format=alpaca needs keys \['instruction', 'output'\]"):
        row_to_messages({"prompt": "p", "completion": "c"}, "alpaca")


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("shape", list(ROWS))
def test_a_jsonl_file_of_each_shape_trains_like_messages(tmp_path, shape):
    renderer = renderers.get_renderer("chatml", get_tokenizer(TINY_MODEL))
    reference = conversation_to_datum(EXPECTED, renderer, 128)
    builder = FromConversationFileBuilder(common_config=_common(), file_path=str(_jsonl(tmp_path / "d.jsonl",
                                                                                         [ROWS[shape]] * 4)))
    train, test = builder()
    assert test is None and len(train) == 2
    datum = train.get_batch(0)[0]
    assert datum.model_input.to_ints() == reference.model_input.to_ints()
    assert datum.loss_fn_inputs["weights"].tolist() == reference.loss_fn_inputs["weights"].tolist()


def test_a_bad_line_names_the_file_line_and_the_shapes(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [ROWS["alpaca"], {"text": "hello"}])
    with pytest.raises(DataError, match=r"d.jsonl:2: not a conversation: a row with keys \['text'\].*Alpaca"):
        FromConversationFileBuilder(common_config=_common(), file_path=str(path))()


def test_csv_and_parquet_files_through_datasets_with_a_column_mapping(tmp_path):
    rows = [{"question": f"{QUESTION} ({i})", "answer": ANSWER} for i in range(6)]
    frame = datasets.Dataset.from_list(rows)
    frame.to_csv(str(tmp_path / "d.csv"))
    frame.to_parquet(str(tmp_path / "d.parquet"))
    for name in ("d.csv", "d.parquet"):
        builder = get_chat_dataset_builder(str(tmp_path / name), _common(), test_size=2)
        assert isinstance(builder, FromDatasetBuilder)
        builder = FromDatasetBuilder(common_config=_common(), source=str(tmp_path / name), test_size=2,
                                     columns={"prompt": "question", "completion": "answer"})
        train, test = builder()
        assert len(train) == 2 and test is not None and len(test.get_batch(0)) == 2
    unmapped = FromDatasetBuilder(common_config=_common(), source=str(tmp_path / "d.csv"))
    with pytest.raises(DataFormatError, match=r"d.csv' row 0: a row with keys \['answer', 'question'\]"):
        unmapped()


def test_an_in_memory_dataset_of_sharegpt_rows():
    rows = datasets.Dataset.from_list([ROWS["sharegpt"]] * 4 + [{"conversations": [{"from": "alien", "value": "x"}]}])
    builder = FromDatasetBuilder(common_config=_common(), source="unused")
    dataset = rows_dataset(builder, rows.select(range(4)), 2, "all_assistant_messages", "auto", "mem")
    assert len(dataset) == 2 and len(dataset.get_batch(1)) == 2
    broken = rows_dataset(builder, rows.select([4, 0]), 2, "all_assistant_messages", "auto", "mem")
    broken.set_epoch(0)
    with pytest.raises(DataError, match=r"mem row 0: conversations\[0\].from='alien'"):
        broken.get_batch(0)  # a row of the wrong shape stops the run, naming the row; it is not skipped


def test_hub_ids_go_through_datasets_and_fail_clearly_offline(monkeypatch):
    builder = get_chat_dataset_builder("someorg/some-sft-set", _common())
    assert isinstance(builder, FromDatasetBuilder) and builder.source == "someorg/some-sft-set"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConfigurationError, match="'someorg/some-sft-set' could not be loaded: the hub is switched off"):
        builder()
    with pytest.raises(ConfigurationError, match="streaming=true reads the first max_rows rows"):
        FromDatasetBuilder(common_config=_common(), source="someorg/big", streaming=True)
