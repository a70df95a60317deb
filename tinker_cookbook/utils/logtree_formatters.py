"""Formatters for ``logtree.log_formatter``: objects that render themselves as HTML and bring their CSS.

``ConversationFormatter(messages)`` shows a conversation one message per row, coloured by role, with reasoning
collapsed and tool calls spelled out; its JSON export keeps the messages as data.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tinker_cookbook.renderers.messages import Content, Message


def _part_html(part: Any) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        return f'<span class="lt-text-part">{html.escape(part["text"])}</span>'
    if kind == "thinking":
        return (f'<details class="lt-thinking-part"><summary>thinking</summary>'
                f'<pre>{html.escape(part["thinking"])}</pre></details>')
    if kind == "image":
        return '<span class="lt-image-part">[image]</span>'
    raise ValueError(f"cannot show a content part of type {kind!r}; known types: text, thinking, image")


def _content_html(content: Content) -> str:
    if isinstance(content, str):
        return f'<span class="lt-text-part">{html.escape(content)}</span>'
    return "\n".join(_part_html(part) for part in content)


def _tool_calls_html(message: Message) -> str:
    out = []
    for call in message.get("tool_calls", []):
        out.append(f'<div class="lt-tool-call-part"><span class="lt-tool-call-label">tool call:</span> '
                   f"<code>{html.escape(call.function.name)}({html.escape(call.function.arguments)})</code></div>")
    for bad in message.get("unparsed_tool_calls", []):
        out.append(f'<div class="lt-unparsed-tool-call-part"><span class="lt-tool-call-label">unparsed tool call:'
                   f'</span> <code>{html.escape(bad.raw_text)}</code><div class="lt-error">{html.escape(bad.error)}'
                   f"</div></div>")
    return "".join(out)


def _jsonable(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message["role"]}
    content = message["content"]
    out["content"] = content if isinstance(content, str) else [
        {**p, "image": "[image]"} if p.get("type") == "image" else dict(p) for p in content]
    if message.get("tool_calls"):
        out["tool_calls"] = [c.model_dump() for c in message["tool_calls"]]
    return out


@dataclass
class ConversationFormatter:
    """A conversation, one message per row, each labelled and coloured by its role."""

    messages: Sequence[Message]

    def to_html(self) -> str:
        rows = []
        for message in self.messages:
            role = html.escape(message["role"])
            rows.append(f'<div class="lt-message lt-message-{role}"><span class="lt-message-role">{role}:</span>'
                        f'<div class="lt-message-content">{_content_html(message["content"])}'
                        f"{_tool_calls_html(message)}</div></div>")
        return '<div class="lt-conversation">\n' + "\n".join(rows) + "\n</div>"

    def to_data(self) -> dict[str, Any]:
        return {"type": "conversation", "messages": [_jsonable(m) for m in self.messages]}

    def get_css(self) -> str:
        return CONVERSATION_CSS


CONVERSATION_CSS = """
.lt-conversation { display: flex; flex-direction: column; gap: .3em; margin: .4em 0; }
.lt-message { padding: .3em .6em; border-radius: 6px; border-left: 4px solid #999; background: #f6f6f6; }
.lt-message-system { border-color: #888; background: #f1f1f1; }
.lt-message-user { border-color: #2a6; background: #eef7f0; }
.lt-message-assistant { border-color: #36c; background: #eef2fb; }
.lt-message-tool { border-color: #c80; background: #fbf5ea; }
.lt-message-role { font-weight: 600; margin-right: .4em; }
.lt-message-content { white-space: pre-wrap; word-break: break-word; }
.lt-thinking-part summary { color: #666; cursor: pointer; }
.lt-tool-call-label { font-weight: 600; } .lt-error { color: #b00; }
"""
