"""The text layout of each renderer's conversations, written out as a Jinja chat template (for the tokenizer of a
merged model and GGUF metadata) and as an Ollama Modelfile template, so that a model trained with a renderer is
prompted the same way wherever it runs.

One ``ChatFormat`` per renderer describes both; ``tests/weights/test_chat_format.py`` checks that
``tokenizer.apply_chat_template`` gives exactly the renderer's tokens. The templates cover text conversations
(system, user, assistant turns); tool calls, images and thinking blocks in history are the renderer's alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tinker_cookbook.exceptions import ConfigurationError


@dataclass(frozen=True)
class ChatFormat:
    """``bos`` + one ``turn`` per message (``{role}`` and ``{content}`` filled in) + ``generation_prompt``."""

    turn: str
    generation_prompt: str
    bos: str = ""
    role_names: tuple[tuple[str, str], ...] = ()
    """Renames of roles in the text (``user`` -> ``User``); others appear as they are."""
    default_system: str | None = None
    """A system message the renderer adds when the conversation has none."""

    def role(self, role: str) -> str:
        return dict(self.role_names).get(role, role)

    def jinja(self) -> str:
        """A Hugging Face chat template (Jinja) producing the renderer's text."""
        before, after = self.turn.split("{content}")
        lines = [self.bos and "{{- " + json.dumps(self.bos) + " }}"]
        if self.default_system is not None:
            first = before.format(role=self.role("system")) + self.default_system + after.format(role=self.role("system"))
            lines.append("{%- if not messages or messages[0]['role'] != 'system' %}{{- " + json.dumps(first)
                         + " }}{%- endif %}")
        names = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in self.role_names) + "}"
        lines += [
            "{%- set names = " + names + " %}",
            "{%- for message in messages %}",
            "{%- set role = names.get(message['role'], message['role']) %}",
            "{{- " + _jinja_text(before) + " + message['content'] + " + _jinja_text(after) + " }}",
            "{%- endfor %}",
            "{%- if add_generation_prompt %}{{- " + json.dumps(self.generation_prompt) + " }}{%- endif %}",
        ]
        return "".join(line for line in lines if line)

    def ollama(self) -> str:
        """An Ollama Modelfile TEMPLATE (Go text/template over ``.Messages``) producing the renderer's text."""
        before, after = self.turn.split("{content}")
        out = [self.bos]
        if self.default_system is not None:
            system = self.role("system")
            out.append("{{- if or (not .Messages) (ne (index .Messages 0).Role \"system\") }}"
                       + before.format(role=system) + self.default_system + after.format(role=system) + "{{- end }}")
        out.append("{{- range .Messages }}")
        for role in ("system", "user", "assistant"):
            out.append(f'{{{{- if eq .Role "{role}" }}}}' + before.format(role=self.role(role)) + "{{ .Content }}"
                       + after.format(role=self.role(role)) + "{{- end }}")
        out.append("{{- end }}" + self.generation_prompt)
        return "".join(out)


def _jinja_text(piece: str) -> str:
    """A Jinja string expression for ``piece`` with ``{role}`` standing for the variable ``role``."""
    parts = piece.split("{role}")
    return " + role + ".join(json.dumps(p) for p in parts)


_CHATML = "<|im_start|>{role}\n{content}<|im_end|>\n"
_SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_QWEN3 = ChatFormat(turn=_CHATML, generation_prompt="<|im_start|>assistant\n")
_QWEN3_NO_THINKING = ChatFormat(turn=_CHATML, generation_prompt="<|im_start|>assistant\n<think>\n\n</think>\n\n")

CHAT_FORMATS: dict[str, ChatFormat] = {
    "role_colon": ChatFormat(turn="{role}: {content}\n\n", generation_prompt="Assistant:", bos="<|begin_of_text|>",
                             role_names=(("system", "System"), ("user", "User"), ("assistant", "Assistant"))),
    "llama3": ChatFormat(turn="<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
                         generation_prompt="<|start_header_id|>assistant<|end_header_id|>\n\n",
                         bos="<|begin_of_text|>"),
    "qwen3": _QWEN3,
    "qwen3_instruct": _QWEN3,
    "qwen3_vl": _QWEN3,
    "qwen3_vl_instruct": _QWEN3,
    "qwen3_disable_thinking": _QWEN3_NO_THINKING,
    "chatml": ChatFormat(turn=_CHATML, generation_prompt="<|im_start|>assistant\n", default_system=_SMOLLM2_SYSTEM),
}
"""Renderer name -> its conversation layout."""


def chat_format(renderer_name: str) -> ChatFormat:
    try:
        return CHAT_FORMATS[renderer_name]
    except KeyError:
        raise ConfigurationError(
            f"renderer_name={renderer_name!r} has no chat template for exported models; known: "
            f"{', '.join(sorted(CHAT_FORMATS))}. Pass one of them (the run's renderer is used when recorded)") from None
