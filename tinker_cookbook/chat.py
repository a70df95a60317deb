"""``tinker-cookbook chat``: talk to a model in the terminal, through any sampling client.

The model is a ``tinker://<run>/sampler_weights/<name>`` checkpoint, a base model name, or a merged model folder
(``tinker-cookbook weights merge``); ``--base-url`` sends checkpoints and base models to a Tinker-protocol server.
Prompts are built by the renderer the run was trained with (else the one recommended for the model) and replies
stop on its stop sequences. Replies stream as they are sampled: the client is asked for a few tokens at a time and
the renderer's streaming parser shows the text that is settled. Ctrl-C stops a reply (what was shown stays in the
conversation); Ctrl-D or ``/exit`` leaves.

Commands: ``/reset`` (forget the conversation), ``/system TEXT`` (set the system message and reset),
``/save FILE.jsonl`` (append the conversation as one ``{"messages": [...]}`` row, the format the supervised recipes
read), ``/temperature T`` and ``/max-tokens N`` (change the flags of the same names), ``/help``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from tinker_cookbook import checkpoint_utils, model_info, renderers, tinker
from tinker_cookbook.exceptions import ConfigurationError
from tinker_cookbook.renderers import Message, Renderer
from tinker_cookbook.tinker import types

PROMPT = "you> "
REPLY_PREFIX = "assistant> "
HELP = ("commands: /reset  /system TEXT  /save FILE.jsonl  /temperature T  /max-tokens N  /exit   "
        "(Ctrl-C stops a reply, Ctrl-D leaves)")


class Sampler(Protocol):
    """What chat needs of a sampling client (``tinker.SamplingClient`` or ``weights.FolderSamplingClient``)."""

    def sample(self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams
               ) -> Any: ...


@dataclass(frozen=True)
class ChatSettings:
    temperature: float = 0.7
    max_tokens: int = 512
    chunk_tokens: int = 8
    """Tokens asked of the client per request: smaller shows text sooner, larger costs fewer requests."""
    seed: int | None = None


@dataclass
class Conversation:
    settings: ChatSettings
    system: str | None = None
    messages: list[Message] = field(default_factory=list)

    def full(self) -> list[Message]:
        head: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def reset(self) -> None:
        self.messages = []


@dataclass(frozen=True)
class ChatTarget:
    sampler: Sampler
    renderer: Renderer
    description: str


def _is_folder(model: str) -> bool:
    return (Path(model).expanduser() / "config.json").is_file()


def open_target(model: str, base_url: str | None = None, renderer_name: str | None = None) -> ChatTarget:
    """The sampling client and renderer for a tinker:// checkpoint, a merged folder or a base model name."""
    if _is_folder(model):
        from tinker_cookbook.weights import FolderSamplingClient

        folder_client = FolderSamplingClient(model)
        name = renderer_name or folder_client.info.get("renderer_name") or _recommended(folder_client.get_base_model())
        renderer = renderers.get_renderer(name, folder_client.get_tokenizer())
        return ChatTarget(folder_client, renderer, f"{model} (transformers, renderer {name})")
    if Path(model).expanduser().exists():
        raise ConfigurationError(f"model={model!r} is a path without config.json; pass a merged model folder, a "
                                 "tinker://<run>/sampler_weights/<name> path or a base model name")
    service = tinker.ServiceClient(base_url=base_url)
    if model.startswith("tinker://"):
        client = service.create_sampling_client(model_path=model)
        stored = checkpoint_utils.get_renderer_name_from_checkpoint(service, model)
        name = renderer_name or stored or _recommended(client.get_base_model())
    else:
        client = service.create_sampling_client(base_model=model)
        name = renderer_name or _recommended(model)
    renderer = renderers.get_renderer(name, client.get_tokenizer(), model_name=client.get_base_model())
    return ChatTarget(client, renderer, f"{model} (renderer {name})")


def _recommended(base_model: str) -> str:
    try:
        return model_info.get_recommended_renderer_name(base_model)
    except Exception as exc:  # noqa: BLE001 - any lookup failure means the same thing to the user
        raise ConfigurationError(f"no renderer is known for {base_model!r} ({exc}); pass --renderer NAME") from None


# Requests run on this thread, so that Ctrl-C (delivered to the main thread) interrupts only the wait for them,
# never the client's own code half-way through a lock; an abandoned request finishes there and is dropped.
_requests = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-sampler")


def _sample(target: ChatTarget, tokens: list[int], params: types.SamplingParams) -> types.SampledSequence:
    return target.sampler.sample(types.ModelInput.from_ints(tokens), 1, params).result().sequences[0]


def sampled_tokens(target: ChatTarget, prompt: list[int], settings: ChatSettings) -> Iterator[int]:
    """The reply's tokens as they are sampled, ``chunk_tokens`` per request, until a stop or ``max_tokens``."""
    generated: list[int] = []
    stop = target.renderer.get_stop_sequences()
    while len(generated) < settings.max_tokens:
        params = types.SamplingParams(max_tokens=min(settings.chunk_tokens, settings.max_tokens - len(generated)),
                                      temperature=settings.temperature, stop=stop,
                                      seed=None if settings.seed is None else settings.seed + len(generated))
        sequence = _requests.submit(_sample, target, prompt + generated, params).result()
        yield from sequence.tokens
        generated += sequence.tokens
        if sequence.stop_reason == "stop" or not sequence.tokens:
            return


def reply(target: ChatTarget, conversation: Conversation, settings: ChatSettings, out: TextIO) -> Message:
    """Stream one assistant reply to ``out``; returns it. Ctrl-C ends it early, keeping what was shown."""
    prompt = target.renderer.build_generation_prompt(conversation.full()).to_ints()
    shown: list[str] = []
    out.write(REPLY_PREFIX)
    out.flush()
    try:
        for delta in target.renderer.parse_response_streaming(sampled_tokens(target, prompt, settings)):
            if isinstance(delta, renderers.StreamingTextDelta):
                shown.append(delta.text)
                out.write(delta.text)
                out.flush()
            elif isinstance(delta, renderers.StreamingMessageComplete):
                out.write("\n")
                return delta.message
    except KeyboardInterrupt:
        out.write(" [stopped]\n")
    except tinker.TinkerError as exc:  # e.g. the conversation outgrew the context window: the chat goes on
        out.write(f"\nError: {exc} (/reset starts a new conversation)\n")
    return {"role": "assistant", "content": "".join(shown)}


def save(conversation: Conversation, path: str) -> Path:
    target = Path(path).expanduser()
    if target.suffix != ".jsonl":
        raise ConfigurationError(f"/save {path}: the file must end in .jsonl (one conversation per line)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"messages": conversation.full()}, ensure_ascii=False) + "\n")
    return target


def command(line: str, conversation: Conversation, out: TextIO) -> bool:
    """Run a ``/command``; returns False to leave."""
    name, _, argument = line.partition(" ")
    argument = argument.strip()
    if name in ("/exit", "/quit"):
        return False
    if name == "/reset":
        conversation.reset()
        out.write("(conversation reset)\n")
    elif name == "/system":
        conversation.system = argument or None
        conversation.reset()
        out.write(f"(system message {'set' if argument else 'cleared'}; conversation reset)\n")
    elif name == "/save":
        if not argument:
            out.write("usage: /save FILE.jsonl\n")
        else:
            try:
                written = save(conversation, argument)
                out.write(f"(saved {len(conversation.full())} messages to {written})\n")
            except (ConfigurationError, OSError) as exc:
                out.write(f"Error: {exc}\n")
    elif name in ("/temperature", "/max-tokens"):
        _set(conversation, name, argument, out)
    else:
        out.write(HELP + "\n")
    return True


def _set(conversation: Conversation, name: str, argument: str, out: TextIO) -> None:
    try:
        if name == "/temperature":
            value: float = float(argument)
            if value < 0:
                raise ValueError
            conversation.settings = dataclasses.replace(conversation.settings, temperature=value)
        else:
            value = int(argument)
            if value < 1:
                raise ValueError
            conversation.settings = dataclasses.replace(conversation.settings, max_tokens=value)
        out.write(f"({name[1:]} = {argument})\n")
    except ValueError:
        out.write(f"usage: {name} {'T (0 or more)' if name == '/temperature' else 'N (1 or more)'}\n")


def run_chat(target: ChatTarget, settings: ChatSettings, system: str | None = None,
             read: Callable[[str], str] = input, out: TextIO = sys.stdout) -> Conversation:
    """The read-reply loop; returns the conversation when the user leaves."""
    conversation = Conversation(settings=settings, system=system)
    out.write(f"Chatting with {target.description}. {HELP}\n")
    while True:
        try:
            line = read(PROMPT).strip()
        except EOFError:
            out.write("\n")
            return conversation
        except KeyboardInterrupt:
            out.write("\n(Ctrl-D or /exit leaves)\n")
            continue
        if not line:
            continue
        if line.startswith("/"):
            if not command(line, conversation, out):
                return conversation
            continue
        conversation.messages.append({"role": "user", "content": line})
        conversation.messages.append(reply(target, conversation, conversation.settings, out))
