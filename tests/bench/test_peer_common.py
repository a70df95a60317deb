"""The pure logic of the peer benchmarks (``bench/peer_common.py``): goals and verdicts, the supervised rows both
sides train on, and the RL problems and rewards both sides see. The peers themselves (TRL, llama-cpp-python) are
only in the bench-only environment; the one test that needs TRL is skipped where it is absent."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# bench/ is not part of the installed package: import it from this checkout whatever the runner's path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.peer_common import (  # noqa: E402
    Goal,
    arithmetic_problems,
    arithmetic_reward,
    datum_to_row,
    not_worse,
    parse_result,
    token_mean_nll,
)


def test_goal_verdicts_in_both_directions() -> None:
    speed = Goal("tokens/s", 1.5)
    assert speed.met(1.5) and not speed.met(1.49)
    assert "= 2.00x (goal >= 1.5x): met" in speed.line(300.0, 150.0, "tok/s")
    assert "NOT met" in speed.line(100.0, 150.0, "tok/s")
    memory = Goal("peak RSS", 0.6, higher_is_better=False)
    assert memory.met(0.6) and not memory.met(0.61)
    assert "= 0.50x (goal <= 0.6x): met" in memory.line(1.0, 2.0, "GB")


def test_not_worse_is_a_one_sided_tolerance() -> None:
    assert not_worse(1.005, 1.0, 0.01)
    assert not_worse(0.5, 1.0, 0.01)
    assert not not_worse(1.02, 1.0, 0.01)


def test_parse_result_takes_the_last_result_line() -> None:
    out = 'noise\nRESULT {"a": 1}\nmore\nRESULT {"a": 2}\n'
    assert parse_result(out) == {"a": 2}
    assert parse_result("nothing here") is None


def test_datum_to_row_trains_exactly_the_weighted_targets() -> None:
    # Sequence 5 6 7 8: inputs 5 6 7, targets 6 7 8; only 7 and 8 are weighted (the "assistant" part).
    row = datum_to_row([5, 6, 7], [6, 7, 8], [0.0, 0.5, 0.5])
    assert row == {"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}
    # Transformers' loss predicts labels[t + 1] from position t: the pairs it trains are the Datum's weighted ones.
    trained = [(row["input_ids"][t], row["labels"][t + 1]) for t in range(3) if row["labels"][t + 1] != -100]
    assert trained == [(6, 7), (7, 8)]


def test_datum_to_row_refuses_what_a_row_cannot_express() -> None:
    with pytest.raises(ValueError, match="lengths differ"):
        datum_to_row([1, 2], [2, 3, 4], [1.0, 1.0])
    with pytest.raises(ValueError, match="shifted by one"):
        datum_to_row([1, 2, 3], [9, 3, 4], [1.0, 1.0, 1.0])


def test_token_mean_nll_counts_only_weighted_targets() -> None:
    total, count = token_mean_nll([-1.0, -2.0, -0.5], [0.0, 0.3, 0.7])
    assert (total, count) == (2.5, 2)


def test_sl_basic_rows_match_their_datums() -> None:
    """Every training Datum of sl_basic's first batch becomes a row with one label per positive weight."""
    from recipes import sl_basic

    config = sl_basic.blueprint({"model_name": "tinker-cookbook/tiny-smollm2"}).apply({"log_path": "/tmp/x"}).make()
    train, _ = config.dataset_builder()
    for datum in train.get_batch(0):
        tokens = datum.model_input.to_ints()
        targets, weights = datum.loss_fn_inputs["target_tokens"].tolist(), datum.loss_fn_inputs["weights"].tolist()
        row = datum_to_row(tokens, targets, weights)
        assert row["input_ids"][:-1] == tokens
        assert sum(label != -100 for label in row["labels"]) == sum(w > 0 for w in weights) > 0


def test_arithmetic_problems_are_rl_basics() -> None:
    from tinker_cookbook import renderers
    from tinker_cookbook.rl.arithmetic_env import ArithmeticDataset
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderer = renderers.get_renderer("chatml", get_tokenizer("HuggingFaceTB/SmolLM2-135M-Instruct"))
    dataset = ArithmeticDataset(8, 8, renderer, n_batches=3, max_operand=9, seed=0)
    for index in range(3):
        envs = [builder.env_thunk() for builder in dataset.get_batch(index)]  # type: ignore[attr-defined]
        assert arithmetic_problems(index, 8, 9) == [(env.x, env.y) for env in envs]


def test_arithmetic_reward() -> None:
    assert arithmetic_reward("3 + 4 = 7", 3, 4, stopped=True) == (1.0, True)
    assert arithmetic_reward("7", 3, 4, stopped=False) == (pytest.approx(0.9), True)
    assert arithmetic_reward("It is 8.", 3, 4, stopped=True) == (0.0, False)
    assert arithmetic_reward("no number", 3, 4, stopped=False) == (pytest.approx(-0.1), False)


def test_trl_padding_free_rows_see_each_other_without_flash_attention() -> None:
    """What the SFT bench reports about TRL's padding-free mode: with the attention a CPU has (sdpa, eager), the rows
    concatenated into one sequence attend to the rows before them, so the mode trains on other rows' context. The
    first row, with nothing before it, matches the padded batch; the second does not."""
    pytest.importorskip("trl")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    rows = [datum_to_row([1, 5, 9, 4], [5, 9, 4, 7], [0, 1, 1, 1]), datum_to_row([2, 8], [8, 3], [1, 1])]
    keys = ("input_ids", "attention_mask", "position_ids")
    with torch.no_grad():
        padded = DataCollatorForLanguageModeling(pad_token_id=0)(rows)
        padded_logits = model(**{k: v for k, v in padded.items() if k in keys}).logits
        flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
        flat_logits = model(**{k: v for k, v in flat.items() if k in keys}).logits[0]
    # fp32 rounding of the same computation is ~1e-6; context from another row moves logits by ~1e-2 here.
    torch.testing.assert_close(flat_logits[:5], padded_logits[0], atol=1e-5, rtol=0)
    assert (flat_logits[5:] - padded_logits[1, :3]).abs().max() > 1e-3
