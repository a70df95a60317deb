"""The ``Renderer`` interface and the token assembly that every renderer shares.

A renderer turns a conversation (a list of ``Message``, see ``renderers.messages``) into model tokens and back:

- ``build_generation_prompt(messages)`` -> ``types.ModelInput`` to sample the next message from;
- ``build_supervised_example(messages)`` -> ``(ModelInput, weights)`` with ``weights`` a 1-D ``torch.float32``
  tensor of one weight per model-input token (image chunks count ``expected_tokens`` tokens, always weight 0);
- ``parse_response(tokens)`` -> ``(Message, ParseTermination)``; the termination is truthy exactly when the
  parse is clean, so ``message, ok = renderer.parse_response(tokens)`` reads naturally.

Each message is rendered separately into a header (role framing) and an output (content and its terminator),
each tokenized on its own. That makes a prompt a token-for-token prefix of the longer conversations that
continue it, which supervised weights, the extension property and KV-cache reuse all rely on. Renderers
put the separator between messages at the start of the next header (``"\\n<|im_start|>user\\n"``) so that a
message's output ends exactly at its stop token. The one cost: content that starts with a newline can
tokenize differently from a chat template's single string at that header boundary (e.g. ``"\\n"`` + ``"\\nHi"``
vs ``"\\n\\nHi"``). Qwen3 strips such newlines where it frames reasoning; elsewhere, keep content free of
leading newlines for template-exact tokens. The message types are re-exported here as well.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from tinker_cookbook.exceptions import RendererError
from tinker_cookbook.renderers.messages import (  # noqa: F401  (re-exported: the reference places them in base)
    KNOWN_ROLES,
    Content,
    ContentPart,
    FunctionBody,
    ImagePart,
    Message,
    ParseTermination,
    Role,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolSpec,
    TrainOnWhat,
    UnparsedToolCall,
    ensure_list,
    format_content_as_string,
    get_text_content,
    get_thinking_content,
    get_tool_calls,
    get_unparsed_tool_calls,
    has_images,
    has_thinking,
    remove_thinking,
    tool_call_from_json,
    validate_conversation,
)
from tinker_cookbook.renderers.tokens import (
    ENCODE_CACHE_MAX_CHARS,
    ENCODE_CACHE_MAX_ENTRIES,
    encode_plain,
    end_of_sequence_token_ids,
    special_tokens,
)
from tinker_cookbook.tinker import types

if TYPE_CHECKING:
    from tinker_cookbook.renderers.streaming import MessageDelta
    from tinker_cookbook.tokenizer_utils import Tokenizer

# ---------------------------------------------------------------------------------------------------------
# Rendering building blocks
# ---------------------------------------------------------------------------------------------------------

Chunk: TypeAlias = types.EncodedTextChunk | types.ImageChunk


@dataclass(frozen=True)
class RenderContext:
    """Where a message sits in the conversation being rendered."""

    idx: int
    is_last: bool
    prev_message: Message | None = None
    next_message: Message | None = None
    last_user_index: int = -1
    """Index of the last user message (renderers may define "user query" more narrowly); -1 if none."""


@dataclass
class RenderedMessage:
    """A message as chunks: ``header`` is the role framing, ``output`` the content and terminator.

    ``stop_overlap`` holds tokens that follow the output only when this is the conversation's last message
    (role_colon's ``"User:"``, which is part of its stop sequence and so is sampled with the message).
    """

    header: list[Chunk] = field(default_factory=list)
    output: list[Chunk] = field(default_factory=list)
    stop_overlap: list[Chunk] = field(default_factory=list)


def _chunk_len(chunk: Chunk) -> int:
    return chunk.length


def _token_keys(chunks: Sequence[Chunk]) -> list[Any]:
    """Per-token comparison keys: token ids, and for images a key per image position."""
    keys: list[Any] = []
    for chunk in chunks:
        if isinstance(chunk, types.EncodedTextChunk):
            keys.extend(int(t) for t in chunk.tokens)
        else:
            keys.extend([("image", hash(chunk.data), chunk.expected_tokens)] * _chunk_len(chunk))
    return keys


def assemble_model_input(chunks: Sequence[Chunk]) -> types.ModelInput:
    """A ModelInput of ``chunks`` with adjacent text chunks merged and empty ones dropped."""
    merged: list[types.ModelInputChunk] = []
    for chunk in chunks:
        if isinstance(chunk, types.EncodedTextChunk):
            if not chunk.tokens:
                continue
            if merged and isinstance(merged[-1], types.EncodedTextChunk):
                merged[-1] = types.EncodedTextChunk(tokens=[*merged[-1].tokens, *chunk.tokens])
                continue
        merged.append(chunk)
    return types.ModelInput(chunks=merged)


def as_train_on_what(value: TrainOnWhat | str) -> TrainOnWhat:
    """``value`` as a TrainOnWhat; a RendererError listing the options for anything else."""
    try:
        return TrainOnWhat(value)
    except ValueError:
        raise RendererError(
            f"train_on_what={value!r} is not one of {[t.value for t in TrainOnWhat]}"
        ) from None


def message_is_trained(
    train_on_what: TrainOnWhat, message: Message, idx: int, messages: Sequence[Message]
) -> bool:
    """Whether the output of ``messages[idx]`` gets weight 1 under ``train_on_what``."""
    role = message["role"]
    if train_on_what == TrainOnWhat.LAST_ASSISTANT_MESSAGE:
        return role == "assistant" and idx == _last_index(messages, "assistant")
    if train_on_what == TrainOnWhat.LAST_ASSISTANT_TURN:
        return role == "assistant" and idx > _last_index(messages, "user")
    if train_on_what == TrainOnWhat.ALL_ASSISTANT_MESSAGES:
        return role == "assistant"
    if train_on_what in (TrainOnWhat.ALL_MESSAGES, TrainOnWhat.ALL_TOKENS):
        return True
    if train_on_what == TrainOnWhat.ALL_USER_AND_SYSTEM_MESSAGES:
        return role in ("user", "system")
    if train_on_what == TrainOnWhat.CUSTOMIZED:
        if "trainable" not in message:
            raise RendererError(
                f"train_on_what=CUSTOMIZED needs a 'trainable' bool on every message; messages[{idx}] "
                f"(role {role!r}) has none. Set message['trainable'] or pick another TrainOnWhat"
            )
        return bool(message["trainable"])
    raise RendererError(f"train_on_what={train_on_what!r} is not one of {[t.value for t in TrainOnWhat]}")


def _last_index(messages: Sequence[Message], role: str) -> int:
    return max((i for i, m in enumerate(messages) if m["role"] == role), default=-1)


# ---------------------------------------------------------------------------------------------------------
# The Renderer interface
# ---------------------------------------------------------------------------------------------------------


class Renderer(abc.ABC):
    """Messages to tokens (for sampling and training) and sampled tokens back to a message.

    Message content is plain text: a special-token string inside it (``<|im_start|>``, ``<|im_end|>``,
    ``<|eot_id|>``, ...) is tokenized as ordinary text, never as the special token, so text from users, datasets
    or tools cannot forge a turn boundary (the official cookbook does the same). Only the renderer's own framing
    produces special tokens. Hugging Face chat templates do map such strings to the special ids; set
    ``special_tokens_in_content = True`` on a renderer (or pass it to ``get_renderer``) to get exactly that
    behaviour back, e.g. to reproduce ``apply_chat_template`` on such content. Content without special-token
    strings is tokenized the same either way.
    """

    special_tokens_in_content: bool = False
    """Opt-out of plain-text content: True parses special-token strings in content as special tokens (HF's
    ``apply_chat_template`` behaviour)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._encode_cache: dict[str, tuple[int, ...]] = {}

    # -- what subclasses define ------------------------------------------------------------------------------

    @abc.abstractmethod
    def render_message(self, message: Message, ctx: RenderContext) -> RenderedMessage:
        """The header and output chunks of one message."""

    @abc.abstractmethod
    def get_stop_sequences(self) -> list[str] | list[int]:
        """What the sampler should stop on: token ids, or strings for renderers without a stop token."""

    @abc.abstractmethod
    def parse_response(self, response: Sequence[int]) -> tuple[Message, ParseTermination]:
        """The assistant message in sampled tokens, and how the response ended."""

    def parse_response_streaming(self, tokens: Iterable[int]) -> Iterator[MessageDelta]:
        """Parse a response while it is sampled: a header, then reasoning/text deltas, then the final message,
        equal to ``parse_response`` of the same tokens (see ``renderers.streaming``)."""
        from tinker_cookbook.renderers.streaming import parse_streaming

        return parse_streaming(self, tokens)

    @property
    def supports_streaming(self) -> bool:
        """Every renderer here streams (``parse_response_streaming``)."""
        return True

    def streaming_fields(self, text: str) -> tuple[str, str]:
        """(reasoning, visible text) of the decoded text of a response so far, for streaming; plain text here."""
        return "", text

    def generation_suffix(self, role: Role, ctx: RenderContext) -> list[Chunk]:
        """What follows the conversation in a generation prompt: the header of an empty ``role`` message."""
        return self.render_message({"role": role, "content": ""}, ctx).header

    @property
    def has_extension_property(self) -> bool:
        """Whether rendering a conversation always extends the rendering of each of its prefixes (see the docs)."""
        return False

    @property
    def disables_thinking(self) -> bool:
        """True for renderers whose format has no reasoning; training a message that reasoned is then an error."""
        return False

    special_token_tool_calls: tuple[str, str] | None = None
    """For formats whose tool calls are framed by special tokens, (the format's name, how it declares tools):
    such a renderer renders and parses calls and results, but declares no tools, and no text prefill can open a
    call. None: the format has no tool calls, or declares tools (and then overrides the two methods below)."""

    def create_conversation_prefix_with_tools(
        self, tools: Sequence[ToolSpec], system_prompt: str = ""
    ) -> list[Message]:
        """Messages that declare ``tools`` (and ``system_prompt``), to put before the conversation."""
        if self.special_token_tool_calls is not None:
            fmt, declaration = self.special_token_tool_calls
            raise RendererError(
                f"the {fmt} renderers do not declare tools ({declaration} is not implemented); they render and parse "
                "tool calls and results. Use a qwen3 or llama3 renderer for tool use"
            )
        raise RendererError(
            f"{type(self).__name__} has no tool-calling format; use a renderer with tool calls (qwen3, qwen3_instruct, "
            "llama3, chatml_tools) for tool use"
        )

    def tool_call_prefix(self, name: str | None = None) -> str:
        """The text that opens an assistant reply with a tool call (to ``name`` when given): a sampler prefilled
        with it must call a tool, which is how a server honours OpenAI's ``tool_choice`` "required" or a named
        function. The reply is parsed from this text plus the sampled tokens."""
        if self.special_token_tool_calls is not None:
            raise RendererError(
                f"the {self.special_token_tool_calls[0]} renderers cannot force a tool call: the format opens one "
                "with special tokens, which a prefill (plain text) cannot hold; sample without tool_choice='required'"
            )
        raise RendererError(
            f"{type(self).__name__} has no tool-calling format; use a renderer with tool calls (qwen3, qwen3_instruct, "
            "llama3, chatml_tools) for tool use"
        )

    def to_openai_message(self, message: Message) -> dict[str, Any]:
        """``message`` as an OpenAI / Hugging Face chat-template dict (text content, ``tool_calls`` as dicts)."""
        out: dict[str, Any] = {"role": message["role"], "content": get_text_content(message)}
        thinking = get_thinking_content(message)
        if thinking is not None:
            out["reasoning_content"] = thinking
        calls = get_tool_calls(message)
        if calls:
            out["tool_calls"] = [
                {
                    "type": "function",
                    "id": c.id,
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ]
        for key in ("tool_call_id", "name"):
            if key in message:
                out[key] = message[key]  # type: ignore[literal-required]
        return out

    # -- tokens ----------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added (special-token strings in it are still parsed)."""
        if not text:
            return []
        cached = self._encode_cache.get(text)
        if cached is not None:
            return list(cached)
        # The Rust tokenizer directly: the same ids as ``tokenizer.encode`` at a fraction of the per-call cost,
        # which matters because every message is encoded in several pieces.
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            ids = list(backend.encode(text, add_special_tokens=False).ids)
        else:
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if len(text) <= ENCODE_CACHE_MAX_CHARS and len(self._encode_cache) < ENCODE_CACHE_MAX_ENTRIES:
            self._encode_cache[text] = tuple(ids)  # headers and separators repeat in every conversation
        return ids

    def text_chunk(self, text: str) -> types.EncodedTextChunk:
        """``text`` as the renderer's own framing: special-token strings in it become special tokens."""
        return types.EncodedTextChunk(tokens=self.encode(text))

    def content_chunk(self, before: str, content: str, after: str = "") -> types.EncodedTextChunk:
        """Framing ``before`` + message ``content`` + framing ``after``, tokenized as one string except that
        special-token strings inside ``content`` stay plain text (see the class docstring)."""
        return self.framed_chunk((before, False), (content, True), (after, False))

    def framed_chunk(self, *pieces: tuple[str, bool]) -> types.EncodedTextChunk:
        """One chunk of ``(text, is_content)`` pieces, tokenized as their concatenation, with special-token
        strings parsed in the framing pieces only.

        Exact because a tokenizer first splits its input at special tokens and encodes the text between them
        independently: this does the same split, but only at the special tokens of framing pieces.
        """
        text = "".join(piece for piece, _ in pieces)
        specials = special_tokens(self.tokenizer)
        if (
            self.special_tokens_in_content
            or specials.pattern is None
            or not any(is_content and specials.pattern.search(piece) for piece, is_content in pieces)
        ):
            return self.text_chunk(text)  # nothing to protect: the ordinary (cached) encoding
        assert specials.pattern is not None
        ids: list[int] = []
        pending = ""
        for piece, is_content in pieces:
            if is_content:
                pending += piece
                continue
            start = 0
            for match in specials.pattern.finditer(piece):
                ids += encode_plain(self.tokenizer, pending + piece[start : match.start()])
                ids.append(specials.ids[match.group()])
                pending, start = "", match.end()
            pending += piece[start:]
        ids += encode_plain(self.tokenizer, pending)
        return types.EncodedTextChunk(tokens=ids)

    def text_chunks(self, *pieces: str) -> list[Chunk]:
        """One chunk per non-empty piece; each piece is tokenized on its own (see the module docstring)."""
        return [self.text_chunk(p) for p in pieces if p]

    @functools.cached_property
    def bos_tokens(self) -> list[int]:
        """What the tokenizer itself puts before a text (Llama's ``<|begin_of_text|>``; nothing for Qwen)."""
        with_special = self.tokenizer.encode("a", add_special_tokens=True)
        plain = self.tokenizer.encode("a", add_special_tokens=False)
        if plain and with_special[-len(plain) :] == plain:
            return list(with_special[: len(with_special) - len(plain)])
        return []

    # -- conversations ---------------------------------------------------------------------------------------

    def prepare_messages(self, messages: Sequence[Message]) -> list[Message]:
        """Hook to adjust a validated conversation before rendering (e.g. insert a default system prompt)."""
        return list(messages)

    def last_user_index(self, messages: Sequence[Message]) -> int:
        return _last_index(messages, "user")

    def _contexts(self, messages: Sequence[Message]) -> list[RenderContext]:
        last_user = self.last_user_index(messages)
        n = len(messages)
        return [
            RenderContext(
                idx=i,
                is_last=i == n - 1,
                prev_message=messages[i - 1] if i > 0 else None,
                next_message=messages[i + 1] if i + 1 < n else None,
                last_user_index=last_user,
            )
            for i in range(n)
        ]

    def _check_supported(self, messages: Sequence[Message]) -> None:
        """Renderer-specific content checks; the default rejects images (only vision renderers accept them)."""
        for i, message in enumerate(messages):
            if has_images(message):
                raise RendererError(
                    f"messages[{i}] has an image part but {type(self).__name__} is text-only; "
                    "use the qwen3_vl or qwen3_vl_instruct renderer with an image processor"
                )

    def _reject_thinking_and_tools(self, messages: Sequence[Message]) -> None:
        """For formats with neither reasoning nor tool calling: say so instead of inventing a format."""
        name = type(self).__name__
        for i, message in enumerate(messages):
            if get_thinking_content(message) is not None:
                raise RendererError(
                    f"messages[{i}] has thinking parts but {name} has no reasoning format; drop them "
                    "(renderers.remove_thinking) or use a qwen3 renderer"
                )
            if message["role"] == "tool" or message.get("tool_calls") or message.get("unparsed_tool_calls"):
                raise RendererError(
                    f"messages[{i}] is a tool call or tool result but {name} has no tool-calling format; "
                    "use a renderer with tool calls (qwen3, qwen3_instruct, llama3, chatml_tools) for tool use"
                )

    def _prepared(self, messages: Sequence[Message], what: str) -> list[Message]:
        validate_conversation(messages, what)
        self._check_supported(messages)
        return self.prepare_messages(messages)

    def build_generation_prompt(
        self, messages: Sequence[Message], role: Role = "assistant", prefill: str | None = None
    ) -> types.ModelInput:
        """The prompt to sample a ``role`` message after ``messages``; ``prefill`` starts that message."""
        msgs = self._prepared(messages, "build_generation_prompt")
        chunks: list[Chunk] = [types.EncodedTextChunk(tokens=self.bos_tokens)]
        for message, ctx in zip(msgs, self._contexts(msgs), strict=True):
            rendered = self.render_message(message, ctx)
            chunks += rendered.header + rendered.output
        suffix_ctx = RenderContext(
            idx=len(msgs), is_last=True, prev_message=msgs[-1], last_user_index=self.last_user_index(msgs)
        )
        chunks += self.generation_suffix(role, suffix_ctx)
        if prefill:
            chunks.append(self.content_chunk("", prefill))  # the start of the message: content, plain text
        return assemble_model_input(chunks)

    def build_supervised_example(
        self, messages: Sequence[Message], train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_MESSAGE
    ) -> tuple[types.ModelInput, torch.Tensor]:
        """The conversation's tokens and a float32 weight per token: 1 on what ``train_on_what`` selects, else 0.

        Headers get weight 1 only with ``ALL_TOKENS``; image tokens always get 0. When the last message is
        trained, everything its generation prompt supplies (such as a prefilled empty ``<think>`` block) is
        prompt and gets weight 0, so the trained part is exactly what the model would sample.
        """
        train_on_what = as_train_on_what(train_on_what)
        msgs = self._prepared(messages, "build_supervised_example")
        chunks: list[Chunk] = []
        weights: list[float] = []
        all_tokens = train_on_what == TrainOnWhat.ALL_TOKENS

        def add(new: list[Chunk], weight: float) -> None:
            for chunk in new:
                chunks.append(chunk)
                w = weight if isinstance(chunk, types.EncodedTextChunk) else 0.0
                weights.extend([w] * _chunk_len(chunk))

        add([types.EncodedTextChunk(tokens=self.bos_tokens)], 1.0 if all_tokens else 0.0)
        last_trained = False
        last_start = 0
        for message, ctx in zip(msgs, self._contexts(msgs), strict=True):
            trained = message_is_trained(train_on_what, message, ctx.idx, msgs)
            if (
                trained
                and self.disables_thinking
                and message["role"] == "assistant"
                and has_thinking(message)
            ):
                raise RendererError(
                    f"{type(self).__name__} renders no reasoning, but messages[{ctx.idx}] is trained and has thinking "
                    "parts; drop them, or use a renderer that keeps thinking (e.g. qwen3)"
                )
            rendered = self.render_message(message, ctx)
            last_start = len(weights)
            add(rendered.header, 1.0 if all_tokens else 0.0)
            add(rendered.output, 1.0 if trained else 0.0)
            if ctx.is_last:
                add(rendered.stop_overlap, 1.0 if trained else 0.0)
                last_trained = trained
        if last_trained and msgs[-1]["role"] == "assistant" and not all_tokens:
            self._zero_generation_suffix(msgs, chunks, weights, last_start)
        return assemble_model_input(chunks), torch.tensor(weights, dtype=torch.float32)

    def _zero_generation_suffix(
        self, msgs: list[Message], chunks: list[Chunk], weights: list[float], last_start: int
    ) -> None:
        """Weight 0 for what the generation prompt supplies before the last message's own tokens (its header
        and any prefill, such as an empty ``<think>`` block): the model never samples those."""
        prefix = msgs[:-1]
        ctx = RenderContext(
            idx=len(prefix),
            is_last=True,
            prev_message=prefix[-1] if prefix else None,
            last_user_index=self.last_user_index(prefix),
        )
        suffix_keys = _token_keys(self.generation_suffix(msgs[-1]["role"], ctx))
        end = last_start + len(suffix_keys)
        if _token_keys(chunks)[last_start:end] == suffix_keys:
            weights[last_start:end] = [0.0] * len(suffix_keys)

    def build_supervised_examples(
        self, messages: Sequence[Message], train_on_what: TrainOnWhat = TrainOnWhat.LAST_ASSISTANT_TURN
    ) -> list[tuple[types.ModelInput, torch.Tensor]]:
        """One example for the whole conversation when the renderer has the extension property; otherwise
        one example per trained assistant message (each rendered as the last message of its prefix, so it is
        trained on exactly the context it would be sampled in)."""
        train_on_what = as_train_on_what(train_on_what)
        assistant_modes = (
            TrainOnWhat.LAST_ASSISTANT_MESSAGE,
            TrainOnWhat.LAST_ASSISTANT_TURN,
            TrainOnWhat.ALL_ASSISTANT_MESSAGES,
        )
        if self.has_extension_property or train_on_what not in assistant_modes:
            return [self.build_supervised_example(messages, train_on_what)]
        validate_conversation(messages, "build_supervised_examples")
        trained = [
            i
            for i, m in enumerate(messages)
            if m["role"] == "assistant" and message_is_trained(train_on_what, m, i, messages)
        ]
        if not trained:
            raise RendererError(
                f"build_supervised_examples: no assistant message is selected by train_on_what={train_on_what.value}"
            )
        return [
            self.build_supervised_example(messages[: i + 1], TrainOnWhat.LAST_ASSISTANT_MESSAGE)
            for i in trained
        ]

    # -- parsing helpers -------------------------------------------------------------------------------------

    @functools.cached_property
    def _end_of_sequence_ids(self) -> frozenset[int]:
        stops = {s for s in self.get_stop_sequences() if isinstance(s, int)}
        return frozenset(end_of_sequence_token_ids(self.tokenizer) - stops)

    def end_of_sequence_ids(self) -> frozenset[int]:
        """Token ids that end a sequence without being this renderer's stop sequence (computed once)."""
        return self._end_of_sequence_ids

    def split_at_stop_token(self, response: Sequence[int]) -> tuple[list[int], ParseTermination]:
        """The tokens before the stop token and how the response ended (for renderers with stop tokens).

        One stop token -> ``STOP_SEQUENCE``; none but an end-of-sequence token -> ``EOS``; neither ->
        ``MALFORMED`` with every token kept. More than one stop token means several responses were passed
        at once, which is a caller error.
        """
        tokens = [int(t) for t in response]
        stops = {s for s in self.get_stop_sequences() if isinstance(s, int)}
        positions = [i for i, t in enumerate(tokens) if t in stops]
        if len(positions) > 1:
            raise RendererError(
                f"parse_response got {len(positions)} stop tokens at positions {positions}; pass the tokens of one "
                "sampled response (the sampler stops at the first stop token)"
            )
        if positions:
            return tokens[: positions[0]], ParseTermination.STOP_SEQUENCE
        eos = self.end_of_sequence_ids()
        for i, t in enumerate(tokens):
            if t in eos:
                return tokens[:i], ParseTermination.EOS
        return tokens, ParseTermination.MALFORMED

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=False))
