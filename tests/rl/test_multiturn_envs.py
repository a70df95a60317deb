"""Multi-turn envs with scripted players and answerers (no model): rewards, termination, format handling, the
answerer's view, observations that extend turn by turn and the datums they train as."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from functools import partial

import pytest
from rl_helpers import FakeRenderer, ScriptedPolicy

from tinker_cookbook import tinker
from tinker_cookbook.completers import MessageCompleter, StopCondition, TokenCompleter, TokensWithLogprobs
from tinker_cookbook.rl.data_processing import trajectory_to_data
from tinker_cookbook.rl.metric_util import compute_trajectory_metrics
from tinker_cookbook.rl.multiturn.guess_number import (
    FORMAT_HINT,
    GuessNumberDataset,
    GuessNumberEnv,
    parse_number_guess,
)
from tinker_cookbook.rl.multiturn.message_env import EnvFromMessageEnv
from tinker_cookbook.rl.multiturn.twenty_questions import (
    ANSWERER_PROMPT,
    TwentyQuestionsDataset,
    TwentyQuestionsEnv,
    epoch_words,
    load_words,
    normalize_word,
    parse_guess,
    split_words,
    word_list_file,
)
from tinker_cookbook.rl.rollouts import do_group_rollout, do_single_rollout
from tinker_cookbook.rl.types import Trajectory


def run(coro):
    return asyncio.run(coro)



class TextPolicy(TokenCompleter):
    """Replies with fixed texts in turn, as real tokens of ``renderer`` ending in its stop token.

    ``split_chars``: tokenize character by character (a valid but non-canonical tokenization, as a sampler can
    produce); ``cut_off``: the turn indices whose reply lacks the stop token (hit the token limit).
    """

    def __init__(self, renderer, replies: Sequence[str], split_chars: bool = False,
                 cut_off: Sequence[int] = ()) -> None:
        self.renderer, self.replies = renderer, list(replies)
        self.split_chars, self.cut_off = split_chars, set(cut_off)
        self.calls = 0

    async def __call__(self, model_input: tinker.ModelInput, stop: StopCondition, *,
                       max_tokens: int | None = None) -> TokensWithLogprobs:
        turn, text = self.calls, self.replies[self.calls % len(self.replies)]
        self.calls += 1
        if self.split_chars:
            tokens = [t for ch in text for t in self.renderer.encode(ch)]
        else:
            tokens = self.renderer.encode(text)
        if turn in self.cut_off:
            return TokensWithLogprobs(tokens, [-0.5] * len(tokens), "length")
        tokens.append(self.renderer.get_stop_sequences()[0])
        return TokensWithLogprobs(tokens, [-0.5] * len(tokens), "stop")


class ScriptedAnswerer(MessageCompleter):
    """Answers every question with ``answer`` and records the conversations it was shown."""

    def __init__(self, answer: str = "Yes.") -> None:
        self.answer = answer
        self.seen: list[list[dict]] = []

    async def __call__(self, messages):
        self.seen.append([dict(m) for m in messages])
        return {"role": "assistant", "content": self.answer}


def rollout(env, policy) -> Trajectory:
    return run(do_single_rollout(policy, env))


# ---------------------------------------------------------------------------------------------------------
# Guess the number
# ---------------------------------------------------------------------------------------------------------


def test_guess_number_feedback_reward_and_episode_metrics(chatml):
    env = EnvFromMessageEnv(chatml, GuessNumberEnv(target=10, low=1, high=16, max_turns=6))
    traj = rollout(env, TextPolicy(chatml, ["Guess: 8", "Guess: 12", "Guess: 10"]))
    assert [t.reward for t in traj.transitions] == [0.0, 0.0, 1.0]
    assert [t.episode_done for t in traj.transitions] == [False, False, True]
    assert [t.logs.get("feedback") for t in traj.transitions] == ["Too low.", "Too high.", None]
    assert chatml.decode(traj.transitions[1].ob.to_ints()).endswith("user\nToo low.<|im_end|>\n<|im_start|>assistant\n")
    final = traj.transitions[-1].metrics
    assert final["episode/success"] == 1.0 and final["episode/guesses_used"] == 3
    assert final["episode/format_errors"] == 0 and final["episode/turns"] == 3
    assert all("episode/success" not in t.metrics for t in traj.transitions[:-1])


def test_guess_number_format_failure_is_penalised_and_corrected(chatml):
    env = EnvFromMessageEnv(chatml, GuessNumberEnv(target=3, low=1, high=16, max_turns=6, format_penalty=0.5))
    traj = rollout(env, TextPolicy(chatml, ["I think it is 3", "Guess: 3"]))
    assert [t.reward for t in traj.transitions] == [-0.5, 1.0]
    assert traj.transitions[0].logs["feedback"] == FORMAT_HINT
    assert FORMAT_HINT in chatml.decode(traj.transitions[1].ob.to_ints())
    assert traj.transitions[-1].metrics["episode/format_errors"] == 1
    assert [t.metrics["format"] for t in traj.transitions] == [0.0, 1.0]


def test_guess_number_reply_cut_off_at_the_token_limit_is_a_format_error(chatml):
    env = EnvFromMessageEnv(chatml, GuessNumberEnv(target=3, low=1, high=16, max_turns=2, format_penalty=1.0))
    traj = rollout(env, TextPolicy(chatml, ["Guess: 3 and more"], cut_off=[0, 1]))
    assert [t.reward for t in traj.transitions] == [-1.0, -1.0]
    assert traj.transitions[-1].metrics["episode/cut_off_replies"] == 2


def test_guess_number_ends_after_max_turns_without_reward(chatml):
    env = EnvFromMessageEnv(chatml, GuessNumberEnv(target=16, low=1, high=16, max_turns=3))
    traj = rollout(env, TextPolicy(chatml, ["Guess: 1", "Guess: 2", "Guess: 3", "Guess: 16"]))
    assert len(traj.transitions) == 3 and traj.transitions[-1].episode_done
    assert sum(t.reward for t in traj.transitions) == 0.0
    assert traj.transitions[-1].metrics["episode/success"] == 0.0


def test_parse_number_guess_reads_the_first_guess_line():
    assert parse_number_guess("Guess: 7") == 7
    assert parse_number_guess("hmm\n**Guess:** 12\nGuess: 3") == 12
    assert parse_number_guess("guess : -4.") == -4
    assert parse_number_guess("My guess is 7") is None
    assert parse_number_guess("Guess: seven") is None


def test_guess_number_dataset_is_deterministic_per_batch(chatml):
    data = GuessNumberDataset(chatml, batch_size=3, group_size=2, n_batches=4, low=1, high=1000, max_turns=5,
                              format_penalty=1.0, seed=0)
    targets = [[g.make_game().target for g in data.get_batch(i)] for i in range(4)]
    assert targets == [[g.make_game().target for g in data.get_batch(i)] for i in range(4)]
    assert len({t for batch in targets for t in batch}) > 6
    with pytest.raises(IndexError):
        data.get_batch(4)


# ---------------------------------------------------------------------------------------------------------
# Twenty questions
# ---------------------------------------------------------------------------------------------------------


def test_answerer_sees_only_the_secret_and_the_latest_question(chatml):
    answerer = ScriptedAnswerer("No.")
    env = EnvFromMessageEnv(chatml, TwentyQuestionsEnv("cat", answerer, max_questions=3))
    traj = rollout(env, TextPolicy(chatml, ["Is it a vehicle?", "Is it a plant?", "Is it a rock?"]))
    assert [len(seen) for seen in answerer.seen] == [2, 2]  # the last turn ends the episode: nothing to answer
    for seen, question in zip(answerer.seen, ["Is it a vehicle?", "Is it a plant?"], strict=True):
        assert seen[0] == {"role": "system", "content": ANSWERER_PROMPT.format(word="cat")}
        assert seen[1] == {"role": "user", "content": question}
    assert len(traj.transitions) == 3 and sum(t.reward for t in traj.transitions) == 0.0
    assert traj.transitions[-1].metrics["episode/questions_used"] == 3


def test_right_guess_wins_case_insensitively_and_wrong_guess_is_answered_without_the_answerer(chatml):
    answerer = ScriptedAnswerer("Yes.")
    env = EnvFromMessageEnv(chatml, TwentyQuestionsEnv("Cat", answerer, max_questions=20))
    traj = rollout(env, TextPolicy(chatml, ["Is it an animal?", "Guess: dog", "Sure.\nGuess: The CAT."]))
    assert [t.reward for t in traj.transitions] == [0.0, 0.0, 1.0]
    assert traj.transitions[-1].episode_done
    assert len(answerer.seen) == 1  # only the question went to the answerer
    assert traj.transitions[1].logs["answer"] == "No, the word is not dog."
    assert traj.transitions[-1].metrics["episode/success"] == 1.0


def test_only_the_first_guess_line_of_a_reply_counts():
    assert parse_guess("Guess: dog\nGuess: cat") == "dog"
    assert parse_guess("I think so.\n  guess:  'Apple'!") == "apple"
    assert parse_guess("My guess is cat") is None
    assert normalize_word(" An Apple. ") == "apple"


def test_empty_guess_is_a_format_error_with_a_hint(chatml):
    answerer = ScriptedAnswerer()
    env = EnvFromMessageEnv(chatml, TwentyQuestionsEnv("cat", answerer, max_questions=2, format_penalty=0.25))
    traj = rollout(env, TextPolicy(chatml, ["Guess:", "Guess: cat"]))
    assert [t.reward for t in traj.transitions] == [-0.25, 1.0]
    assert not answerer.seen and traj.transitions[-1].metrics["episode/format_errors"] == 1


@pytest.mark.parametrize("name", ["nouns", "animals"])
def test_word_list_split_is_disjoint_and_epochs_repeat_the_train_words(name):
    words = load_words(word_list_file(name)[0])
    assert len(words) == len(set(words)) > 40 and "penguin" not in words  # penguin is the example game's word
    train, test = split_words(words)
    assert not set(train) & set(test) and len(test) == len(set(words)) // 5
    assert split_words(words) == (train, test)
    two = epoch_words(train, 2, seed=0)
    assert sorted(two[: len(train)]) == sorted(train) == sorted(two[len(train):])
    assert two[: len(train)] != two[len(train):]


def test_twenty_questions_dataset_batches_words_into_groups(chatml):
    game = partial(TwentyQuestionsEnv, answerer=ScriptedAnswerer(), max_questions=4)
    data = TwentyQuestionsDataset(["a", "b", "c", "d", "e"], batch_size=2, group_size=3, renderer=chatml,
                                  make_game=game)
    assert len(data) == 3
    assert [[g.make_game().word for g in data.get_batch(i)] for i in range(3)] == [["a", "b"], ["c", "d"], ["e"]]
    group = run(do_group_rollout(data.get_batch(2)[0], TextPolicy(chatml, ["Guess: e"])))
    assert group.get_total_rewards() == [1.0, 1.0, 1.0]
    metrics = compute_trajectory_metrics([group], [["twenty_questions"]])
    assert metrics["env/all/episode/success"] == 1.0 and metrics["env/all/turns_per_episode"] == 1.0


# ---------------------------------------------------------------------------------------------------------
# Observations across turns and the datums they make
# ---------------------------------------------------------------------------------------------------------


def _episode(chatml, policy):
    env = EnvFromMessageEnv(chatml, GuessNumberEnv(target=9, low=1, high=16, max_turns=4))
    return rollout(env, policy)


def _check_one_datum(traj: Trajectory) -> None:
    for before, after in itertools.pairwise(traj.transitions):
        sampled = before.ob.to_ints() + before.ac.tokens
        assert after.ob.to_ints()[: len(sampled)] == sampled
    [datum] = trajectory_to_data(traj, 1.0)
    mask = datum.loss_fn_inputs["mask"].tolist()
    assert sum(mask) == sum(len(t.ac.tokens) for t in traj.transitions)
    # The final sequence is the last observation plus its action; targets are that sequence shifted by one.
    last = traj.transitions[-1]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == (last.ob.to_ints() + last.ac.tokens)[1:]


def test_turns_merge_into_one_datum_with_the_extension_property(chatml):
    traj = _episode(chatml, TextPolicy(chatml, ["Guess: 4", "Guess: 12", "Guess: 9"]))
    _check_one_datum(traj)
    text = chatml.decode(traj.transitions[2].ob.to_ints())
    assert text.count("<|im_start|>assistant\n") == 3 and text.endswith("Too high.<|im_end|>\n<|im_start|>assistant\n")


def test_non_canonical_and_cut_off_replies_still_extend(chatml):
    # Re-rendering would re-tokenize "Guess: 4" canonically and add the missing stop token; the env keeps the
    # sampled tokens instead, so the episode still trains as one datum.
    traj = _episode(chatml, TextPolicy(chatml, ["Guess: 4", "Guess: 12", "Guess: 9"], split_chars=True, cut_off=[1]))
    assert traj.transitions[1].ac.tokens[-1] != chatml.get_stop_sequences()[0]
    _check_one_datum(traj)
    stop = chatml.get_stop_sequences()[0]
    second_ob = traj.transitions[2].ob.to_ints()
    start = traj.transitions[1].ob.length + len(traj.transitions[1].ac.tokens)
    assert second_ob[start] == stop  # the cut-off reply is closed before the feedback


class RewritingRenderer(FakeRenderer):
    """Renders each prompt from scratch and drops the stop token from earlier replies: no extension property."""

    has_extension_property = False


def test_turns_split_into_datums_without_the_extension_property():
    env = EnvFromMessageEnv(RewritingRenderer(), GuessNumberEnv(target=9, low=1, high=16, max_turns=3))
    traj = rollout(env, ScriptedPolicy(["Guess: 4", "Guess: 12", "Guess: 9"]))
    assert len(traj.transitions) == 3
    data = trajectory_to_data(traj, 1.0)
    assert len(data) == 3
    assert [sum(d.loss_fn_inputs["mask"].tolist()) for d in data] == [len(t.ac.tokens) for t in traj.transitions]


def test_transcript_shows_each_turn_once(chatml, tmp_path):
    from tinker_cookbook.rl.transcripts import write_transcript
    from tinker_cookbook.rl.types import TrajectoryGroup

    env = EnvFromMessageEnv(chatml, GuessNumberEnv(target=9, low=1, high=16, max_turns=3))
    traj = rollout(env, TextPolicy(chatml, ["Guess: 4", "Guess: 12", "Guess: 9"]))
    group = TrajectoryGroup([traj], [0.0], [{}])
    builder = GuessNumberDataset(chatml, 1, 1, 1, 1, 16, 3, 1.0, seed=0).get_batch(0)[0]
    html = write_transcript(tmp_path / "t.html", "t", [group], [builder], chatml.tokenizer, 1).read_text()
    assert html.count("turn 0 prompt") == 1 and "turn 1 prompt" not in html  # later turns show only what is new
    assert html.count("Let&#x27;s play a game") == 1 and "Too low.&lt;|im_end|&gt;" in html


def test_game_rules_example_and_topic_are_shown(chatml):
    game = TwentyQuestionsEnv("owl", ScriptedAnswerer(), max_questions=7, include_example=True, topic="an animal")
    messages = run(game.initial_messages())
    assert "secret word: an animal" in messages[0]["content"] and "7 messages" in messages[0]["content"]
    assert messages[-1]["content"].startswith("Correct!") and "Guess: penguin" in [m["content"] for m in messages]
    numbers = run(GuessNumberEnv(9, 1, 10, include_example=True).initial_messages())
    assert [m["content"] for m in numbers if m["role"] == "assistant"] == ["Guess: 5", "Guess: 8", "Guess: 6"]
    with pytest.raises(ValueError, match="neither a shipped list"):
        word_list_file("no-such-list")


def test_answerer_shares_the_players_loaded_base_model(monkeypatch):
    from tinker_cookbook.engine import models
    from tinker_cookbook.rl.multiturn.twenty_questions import TwentyQuestionsDatasetBuilder

    tiny = "tinker-cookbook/tiny-smollm2"
    loads: list[str] = []
    real_load = models.load_model
    monkeypatch.setattr(models, "load_model", lambda name, *a, **k: loads.append(name) or real_load(name, *a, **k))
    tinker.ServiceClient().create_lora_training_client(tiny, rank=4)
    loaded_for_training = loads.count(tiny)  # 1, or 0 when an earlier test of this process loaded it
    builder = TwentyQuestionsDatasetBuilder(batch_size=1, group_size=1, model_name_for_tokenizer=tiny)
    answerer = builder.make_answerer()
    reply = run(answerer([{"role": "user", "content": "Is it an animal?"}]))
    assert reply["role"] == "assistant"
    assert loads.count(tiny) == loaded_for_training <= 1  # the answerer samples from the same loaded weights


def test_hidden_word_is_removed_from_answers(chatml):
    answerer = ScriptedAnswerer('The answer is "Owls", an owl.')
    plain = run(TwentyQuestionsEnv("owl", answerer).answer("What is it?"))
    hidden = run(TwentyQuestionsEnv("owl", answerer, hide_word_in_answers=True).answer("What is it?"))
    assert plain == 'The answer is "Owls", an owl.'
    assert hidden == 'The answer is "[secret]", an [secret].'
