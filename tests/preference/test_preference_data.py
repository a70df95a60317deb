"""Comparison types, the JSONL pair format and its errors, rendering pairs into datums, hub builders offline."""

from __future__ import annotations

import json

import pytest
from pref_helpers import TINY_MODEL, dpo_builder, pair_row, write_pairs

from tinker_cookbook.exceptions import ConfigurationError, DataError, DataValidationError
from tinker_cookbook.preference import preference_datasets
from tinker_cookbook.preference.preference_datasets import (
    DPODatasetBuilder,
    ExampleComparisonBuilder,
    comparison_to_datums,
    parse_hh_transcript,
    parse_pair_row,
)
from tinker_cookbook.preference.types import Comparison, LabeledComparison
from tinker_cookbook.renderers import get_renderer
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.tokenizer_utils import get_tokenizer

USER = [{"role": "user", "content": "Say hi in capitals."}]


def _reply(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_labeled_comparison_chosen_rejected_swap_and_tie():
    labeled = LabeledComparison(Comparison(USER, _reply("HI"), _reply("hi")), "A")
    assert labeled.chosen == _reply("HI") and labeled.rejected == _reply("hi")
    swapped = labeled.swap()
    assert swapped.label == "B" and swapped.chosen == _reply("HI") and swapped.comparison.completion_A == _reply("hi")
    with pytest.raises(DataValidationError, match="tie"):
        _ = LabeledComparison(labeled.comparison, "Tie").chosen
    with pytest.raises(DataValidationError, match="label='C'"):
        LabeledComparison(labeled.comparison, "C")  # type: ignore[arg-type]


def test_parse_pair_row_accepts_strings_messages_and_lists():
    from_strings = parse_pair_row({"prompt": "Say hi.", "chosen": "HI", "rejected": "hi", "extra": 1})
    assert from_strings.comparison.prompt_conversation == [{"role": "user", "content": "Say hi."}]
    assert from_strings.chosen == _reply("HI") and from_strings.rejected == _reply("hi")
    system = {"role": "system", "content": "Be brief."}
    from_messages = parse_pair_row({"prompt": [system, *USER], "chosen": _reply("HI")[0], "rejected": _reply("hi")})
    assert from_messages.comparison.prompt_conversation == [system, *USER]


def _renderer():
    return get_renderer("chatml", get_tokenizer(TINY_MODEL))


def test_comparison_to_datums_weights_only_the_completion():
    chosen, rejected = comparison_to_datums(LabeledComparison.from_pair(USER, _reply("HI"), _reply("hi there")),
                                            _renderer(), max_length=None)
    tokenizer = get_tokenizer(TINY_MODEL)
    for datum, text in ((chosen, "HI"), (rejected, "hi there")):
        targets = datum.loss_fn_inputs["target_tokens"].tolist()
        weights = datum.loss_fn_inputs["weights"].tolist()
        assert set(weights) == {0.0, 1.0}  # reduction "none": a token sum, not a mean
        trained = [t for t, w in zip(targets, weights, strict=True) if w]
        assert tokenizer.decode(trained) == text + "<|im_end|>"  # the completion and its stop token, nothing else
    # the prompts are the same tokens
    n_prompt = chosen.loss_fn_inputs["weights"].tolist().index(1.0)
    assert chosen.model_input.to_ints()[:n_prompt] == rejected.model_input.to_ints()[:n_prompt]


@pytest.mark.parametrize(("row", "message"), [
    ({"prompt": "Say hi.", "chosen": "HI"}, r"missing \['rejected'\]"),
    ({"prompt": "Say hi.", "rejected": "hi"}, r"missing \['chosen'\]"),
    ({"prompt": "Say hi.", "chosen": "same", "rejected": "same"}, "identical"),
    ({"prompt": "Say hi.", "chosen": "  ", "rejected": "hi"}, "chosen completion is empty"),
    ({"prompt": "Say hi.", "chosen": "HI", "rejected": ""}, "rejected completion is empty"),
    ({"prompt": "word " * 200, "chosen": "HI", "rejected": "hi"}, "max_length=64 is shorter than the prompt"),
    ({"prompt": [{"role": "assistant", "content": "x"}], "chosen": "HI", "rejected": "hi"}, "must end with a user"),
    ({"prompt": "Say hi.", "chosen": 3, "rejected": "hi"}, "'chosen' must be a string"),
    (["not", "an", "object"], "expected a JSON object"),
])
def test_a_bad_line_is_an_error_naming_file_and_line(tmp_path, row, message):
    path = write_pairs(tmp_path / "pairs.jsonl", 3)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=message) as info:
        dpo_builder(str(path), max_length=64)()
    assert f"{path}:4:" in str(info.value) and "on_invalid_line=skip" in str(info.value)


def test_invalid_json_and_the_skip_flag(tmp_path):
    path = write_pairs(tmp_path / "pairs.jsonl", 4)
    lines = path.read_text().splitlines()
    lines[1] = '{"prompt": "broken'
    lines[2] = json.dumps({**pair_row(2), "rejected": pair_row(2)["chosen"]})  # identical
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{path}:2: not valid JSON"):
        dpo_builder(str(path))()
    train, test = dpo_builder(str(path), on_invalid_line="skip")()
    assert test is None and len(train) == 1 and len(train.get_batch(0)) == 4  # 2 good pairs, 4 datums


def test_truncation_that_makes_the_pair_identical_is_an_error(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "Count.", "chosen": "one two three " * 20 + "A",
                                "rejected": "one two three " * 20 + "B"}) + "\n")
    with pytest.raises(DataError, match="identical .*raise max_length"):
        dpo_builder(str(path), batch_size=1, max_length=40)()


def test_test_split_batches_and_interleaving(tmp_path):
    train_path = write_pairs(tmp_path / "train.jsonl", 10)
    test_path = write_pairs(tmp_path / "test.jsonl", 3, start=100)
    train, test = dpo_builder(str(train_path), batch_size=4, test_path=str(test_path))()
    assert len(train) == 2  # 10 pairs -> 2 full batches of 4 pairs
    assert test is not None and len(test) == 1 and len(test.get_batch(0)) == 6
    batch = train.get_batch(0)
    tokenizer = get_tokenizer(TINY_MODEL)
    for chosen, rejected in zip(batch[0::2], batch[1::2], strict=True):
        c_text = tokenizer.decode(chosen.model_input.to_ints())
        r_text = tokenizer.decode(rejected.model_input.to_ints())
        assert "equals" in r_text and "equals" not in c_text  # [chosen, rejected] order within each pair
        assert c_text.split("<|im_start|>assistant")[0] == r_text.split("<|im_start|>assistant")[0]
    split_train, split_test = dpo_builder(str(train_path), batch_size=4, test_size=2)()
    assert len(split_train) == 2 and split_test is not None and len(split_test.get_batch(0)) == 4


def test_the_example_set_loads_and_its_test_prompts_are_unseen():
    train, test = ExampleComparisonBuilder()()
    assert test is not None and len(train) >= 150 and len(test) >= 48
    train_prompts = {str(train.get(i).comparison.prompt_conversation) for i in range(len(train))}
    assert not any(str(test.get(i).comparison.prompt_conversation) in train_prompts for i in range(len(test)))
    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=TINY_MODEL, max_length=256, batch_size=8)
    train_ds, test_ds = DPODatasetBuilder(common_config=common, comparison_builder=ExampleComparisonBuilder())()
    assert len(train_ds) == len(train) // 8 and test_ds is not None


def test_hub_builders_fail_fast_offline_with_the_alternative(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("hhh", "helpsteer3", "ultrafeedback"):
        builder = getattr(preference_datasets, name)()
        with pytest.raises(ConfigurationError, match=rf"dataset={name} needs .*dataset=example.*dataset=jsonl"):
            builder()


def test_hh_transcripts_parse_into_a_pair():
    row = {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Bye\n\nAssistant: Goodbye, take care.",
           "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Bye\n\nAssistant: Whatever."}
    labeled = preference_datasets.hh_row_to_comparison(row)
    assert [m["role"] for m in labeled.comparison.prompt_conversation] == ["user", "assistant", "user"]
    assert labeled.chosen == _reply("Goodbye, take care.") and labeled.rejected == _reply("Whatever.")
    with pytest.raises(DataError, match="not a Human/Assistant transcript"):
        parse_hh_transcript("no turns here")
