"""Tool use: typed functions as tools, running a model's tool calls, and an agent env for RL.

- ``tools``: ``@tool`` makes a ``Tool`` (name, description, JSON schema, argument checks) of a typed function;
- ``registry``: ``ToolRegistry`` runs a ``ToolCall`` and always answers with a ``tool`` message (errors included);
- ``env``: ``ToolUseEnv``, a ``MessageEnv`` that runs the tool calls of each reply until the model answers, with
  turn and call limits, format penalties and a ``StopReason`` per episode;
- ``search``: the ``search_tool`` recipe's task (BM25 search over an invented encyclopedia).

The renderers with a tool-call format: ``qwen3``, ``qwen3_disable_thinking``, ``qwen3_instruct`` (and the VL
variants), ``llama3`` (Llama 3.1 JSON calls) and ``chatml_tools`` (SmolLM2's ChatML with Qwen-style blocks).
See docs/tool-use.md.
"""

from tinker_cookbook.tool_use.env import Grader, StopReason, ToolUseEnv
from tinker_cookbook.tool_use.registry import ToolCallError, ToolCallOutcome, ToolRegistry, tool_message
from tinker_cookbook.tool_use.tools import Tool, tool

__all__ = [
    "Grader",
    "StopReason",
    "Tool",
    "ToolCallError",
    "ToolCallOutcome",
    "ToolRegistry",
    "ToolUseEnv",
    "tool",
    "tool_message",
]
