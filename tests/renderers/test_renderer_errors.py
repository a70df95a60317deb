"""Bad input gets a clear RendererError that names the problem and the fix."""

from __future__ import annotations

import pytest

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers import Message, ToolCall, TrainOnWhat, get_renderer
from tinker_cookbook.renderers.base import FunctionBody
from tinker_cookbook.tokenizer_utils import Tokenizer

USER: Message = {"role": "user", "content": "Hi"}
ASSISTANT: Message = {"role": "assistant", "content": "Hello"}
CALL = ToolCall(id="c1", function=FunctionBody(name="f", arguments="{}"))


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer: Tokenizer):
    return get_renderer("qwen3", qwen3_tokenizer)


def test_unknown_renderer_lists_valid_names(qwen3_tokenizer: Tokenizer) -> None:
    with pytest.raises(RendererError, match=r"unknown renderer name 'qwen9'.*'chatml'.*'qwen3_vl_instruct'"):
        get_renderer("qwen9", qwen3_tokenizer)
    # A known format on a tokenizer without its special tokens names what is missing.
    with pytest.raises(RendererError, match=r"harmony's special tokens.*'<\|start\|>'.*gpt-oss's tokenizer"):
        get_renderer("gpt_oss_no_sysprompt", qwen3_tokenizer)


@pytest.mark.parametrize("build", ["build_generation_prompt", "build_supervised_example"])
def test_empty_conversation(qwen3, build: str) -> None:
    with pytest.raises(RendererError, match="conversation is empty"):
        getattr(qwen3, build)([])


def test_unknown_role(qwen3) -> None:
    with pytest.raises(
        RendererError, match=r"messages\[1\]\['role'\] is 'robot'.*'system', 'user', 'assistant', 'tool'"
    ):
        qwen3.build_generation_prompt([USER, {"role": "robot", "content": "beep"}])


def test_malformed_message_and_part(qwen3) -> None:
    with pytest.raises(RendererError, match=r"messages\[0\] must be a dict with 'role' and 'content'"):
        qwen3.build_generation_prompt([{"role": "user"}])
    with pytest.raises(RendererError, match=r"messages\[0\]\['content'\]\[0\] must be a TextPart"):
        qwen3.build_generation_prompt([{"role": "user", "content": [{"type": "audio", "audio": b""}]}])


@pytest.mark.parametrize("renderer_name", ["qwen3", "qwen3_instruct", "llama3", "role_colon", "chatml"])
def test_image_for_text_only_renderer(request: pytest.FixtureRequest, renderer_name: str) -> None:
    tokenizer = request.getfixturevalue(
        "llama3_tokenizer" if renderer_name == "llama3" else "qwen3_tokenizer"
    )
    renderer = get_renderer(renderer_name, tokenizer)
    image_message: Message = {"role": "user", "content": [{"type": "image", "image": b"\x89PNG"}]}
    with pytest.raises(
        RendererError, match=r"messages\[0\] has an image part but .* is text-only; use the qwen3_vl"
    ):
        renderer.build_generation_prompt([image_message])


def test_tool_message_without_matching_call(qwen3) -> None:
    orphan: Message = {"role": "tool", "content": "42"}
    with pytest.raises(
        RendererError, match=r"messages\[1\] is a tool result but no earlier assistant message"
    ):
        qwen3.build_generation_prompt([USER, orphan])
    with pytest.raises(RendererError, match=r"messages\[2\] is a tool result but no earlier"):
        qwen3.build_generation_prompt([USER, ASSISTANT, orphan])
    # More results than calls.
    with pytest.raises(RendererError, match=r"messages\[3\] is a tool result"):
        qwen3.build_generation_prompt([USER, {**ASSISTANT, "tool_calls": [CALL]}, orphan, orphan])
    wrong_id: Message = {"role": "tool", "content": "42", "tool_call_id": "c9"}
    with pytest.raises(RendererError, match=r"'tool_call_id'\] is 'c9' but .* ids \['c1'\]"):
        qwen3.build_generation_prompt([USER, {**ASSISTANT, "tool_calls": [CALL]}, wrong_id])


def test_customized_without_trainable(qwen3) -> None:
    with pytest.raises(
        RendererError, match=r"CUSTOMIZED needs a 'trainable' bool .* messages\[0\] \(role 'user'\)"
    ):
        qwen3.build_supervised_example([USER, {**ASSISTANT, "trainable": True}], TrainOnWhat.CUSTOMIZED)


def test_unknown_train_on_what(qwen3) -> None:
    with pytest.raises(
        RendererError, match=r"train_on_what='everything' is not one of \['last_assistant_message'"
    ):
        qwen3.build_supervised_example([USER, ASSISTANT], "everything")


def test_disable_thinking_refuses_to_train_reasoning(qwen3_tokenizer: Tokenizer) -> None:
    renderer = get_renderer("qwen3_disable_thinking", qwen3_tokenizer)
    reasoned: Message = {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}]}
    with pytest.raises(RendererError, match=r"renders no reasoning, but messages\[1\] is trained"):
        renderer.build_supervised_example([USER, reasoned])
    # As untrained history it is fine (the template drops it).
    renderer.build_generation_prompt([USER, reasoned, USER])


@pytest.mark.parametrize("renderer_name", ["role_colon", "chatml"])
def test_formats_without_tools_or_thinking(smollm2_tokenizer: Tokenizer, renderer_name: str) -> None:
    renderer = get_renderer(renderer_name, smollm2_tokenizer)
    with pytest.raises(RendererError, match="has no tool-calling format"):
        renderer.build_generation_prompt([USER, {**ASSISTANT, "tool_calls": [CALL]}])
    with pytest.raises(RendererError, match="has no tool-calling format"):
        renderer.create_conversation_prefix_with_tools([{"name": "f", "description": "", "parameters": {}}])
    thinking: Message = {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}
    with pytest.raises(RendererError, match="has thinking parts but .* has no reasoning format"):
        renderer.build_generation_prompt([USER, thinking])


def test_empty_tool_list(qwen3) -> None:
    with pytest.raises(RendererError, match="tools is empty"):
        qwen3.create_conversation_prefix_with_tools([])
