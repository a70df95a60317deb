"""``tinker-cookbook chat`` driven through a pseudo-terminal: two turns, a save, a reset, Ctrl-C during a reply."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tinker_cookbook import renderers, tinker
from tinker_cookbook.chat import ChatSettings, ChatTarget, Conversation, reply
from tinker_cookbook.tinker import types

pexpect = pytest.importorskip("pexpect")
REPO = Path(__file__).resolve().parents[2]


def greedy_reply(checkpoint: str, messages: list[renderers.Message], max_tokens: int) -> str:
    """What one greedy reply of ``max_tokens`` should say, sampled in one request (chat asks a few tokens at a time)."""
    client = tinker.ServiceClient().create_sampling_client(model_path=checkpoint)
    renderer = renderers.get_renderer("qwen3", client.get_tokenizer())
    prompt = renderer.build_generation_prompt(messages)
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=renderer.get_stop_sequences())
    tokens = client.sample(prompt, 1, params).result().sequences[0].tokens
    return renderers.get_text_content(renderer.parse_response(tokens)[0])


def test_chat_in_a_terminal(qwen3_checkpoint, tmp_path: Path):
    saved = tmp_path / "conversation.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    child = pexpect.spawn(sys.executable, ["-m", "tinker_cookbook.cli", "chat", qwen3_checkpoint, "--temperature", "0",
                                           "--max-tokens", "10", "--chunk-tokens", "1"], cwd=str(tmp_path), env=env, encoding="utf-8",
                          timeout=120)
    try:
        child.expect("renderer qwen3")  # the renderer the run recorded
        for text in ("hello there", "and again"):
            child.expect_exact("you> ")
            child.sendline(text)
            child.expect_exact("assistant> ")
        child.expect_exact("you> ")
        child.sendline(f"/save {saved}")
        child.expect_exact("saved 4 messages")
        child.sendline("/reset")
        child.expect_exact("(conversation reset)")
        # a long reply at temperature 1 (greedy, this random model repeats a byte that never completes a character)
        for line in ("/temperature 1", "/max-tokens 100000"):
            child.expect_exact("you> ")
            child.sendline(line)
        child.expect_exact("you> ")
        child.sendline("a long one please")
        child.expect_exact("assistant> ")
        child.expect(r"\S")  # text is streaming
        child.sendintr()
        child.expect_exact("[stopped]")
        child.expect_exact("you> ")  # still in the chat
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    row = json.loads(saved.read_text())
    first, second = row["messages"][1]["content"], row["messages"][3]["content"]
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant"]
    assert first == greedy_reply(qwen3_checkpoint, [{"role": "user", "content": "hello there"}], 10)
    history = [*row["messages"][:2], {"role": "user", "content": "and again"}]
    assert second == greedy_reply(qwen3_checkpoint, history, 10)


class _ScriptedSampler:
    """Answers with fixed tokens, ``max_tokens`` at a time: checks that the chunked requests continue the reply."""

    def __init__(self, reply_tokens: list[int], prompt_len: int) -> None:
        self.reply, self.prompt_len, self.requests = reply_tokens, prompt_len, 0

    def sample(self, prompt, num_samples, sampling_params):
        self.requests += 1
        done = len(prompt.to_ints()) - self.prompt_len
        tokens = self.reply[done: done + sampling_params.max_tokens]
        stop = 151645 in tokens
        seq = types.SampledSequence(stop_reason="stop" if stop else "length", tokens=tokens)
        return tinker.APIFuture.completed(types.SampleResponse(sequences=[seq]))


def test_reply_streams_over_chunked_requests(capsys):
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    tokenizer = get_tokenizer("tinker-cookbook/tiny-qwen3")
    renderer = renderers.get_renderer("qwen3_instruct", tokenizer)
    conversation = Conversation(settings=ChatSettings(chunk_tokens=3, max_tokens=100))
    conversation.messages.append({"role": "user", "content": "hi"})
    prompt_len = len(renderer.build_generation_prompt(conversation.full()).to_ints())
    answer = tokenizer.encode("The capital of France is Paris, of course.") + [151645]
    sampler = _ScriptedSampler(answer, prompt_len)
    message = reply(ChatTarget(sampler, renderer, "scripted"), conversation, conversation.settings, sys.stdout)
    assert message["content"] == "The capital of France is Paris, of course."
    assert sampler.requests == -(-len(answer) // 3)  # ceil: one request per 3 tokens, none after the stop
    assert capsys.readouterr().out == "assistant> The capital of France is Paris, of course.\n"
