"""An Inspect AI model provider backed by a Tinker sampling client and a renderer.

``InspectAPIFromTinkerSampling`` turns Inspect's chat messages into the renderer's prompt, samples from a
``tinker.SamplingClient`` and parses the sampled tokens back into an assistant message. Inspect runs many samples
concurrently; the engine's sampler batches the concurrent requests, so ``max_connections`` is high by default.

Inspect's CLI finds the provider through this package's ``inspect_ai`` entry point (see ``pyproject.toml``)::

    inspect eval example-data/evals/contact_cards.py --model tinker-cookbook/HuggingFaceTB/SmolLM2-135M-Instruct
    inspect eval task.py --model tinker-cookbook/tinker://RUN/sampler_weights/final -M renderer_name=chatml

The model part is a base model name or a ``tinker://`` sampler path. Model args (``-M``): ``renderer_name``
(default: the renderer stored with the checkpoint's training run, else the model's recommended one),
``include_reasoning``, ``verbose``, ``max_connections``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
    Content,
    ContentImage,
    ContentReasoning,
    ContentText,
    GenerateConfig,
    ModelAPI,
    ModelCall,
    ModelOutput,
    ModelUsage,
    StopReason,
    modelapi,
)
from inspect_ai.tool import ToolCall as InspectToolCall
from inspect_ai.tool import ToolChoice, ToolInfo

from tinker_cookbook import model_info, renderers, tinker
from tinker_cookbook.checkpoint_utils import get_renderer_name_from_checkpoint
from tinker_cookbook.exceptions import ConfigurationError, RendererError
from tinker_cookbook.renderers.stops import cut_at_stop_strings as _cut_at_stop_strings
from tinker_cookbook.renderers.stops import merge_stop_sequences

logger = logging.getLogger(__name__)

PROVIDER_NAME = "tinker-cookbook"
"""The provider part of ``--model tinker-cookbook/<model>``."""

UPSTREAM_PROVIDER_NAME = "tinker-sampling"
"""The name the upstream cookbook registers; kept so that its commands work unchanged."""

DEFAULT_MAX_CONNECTIONS = 64
"""Concurrent generate calls; the sampler decodes them as one batch, so more is faster up to memory limits."""

TINKER_PATH_PREFIX = "tinker://"

# Generation settings the engine has no equivalent for; a request that sets them gets one warning per field.
_UNSUPPORTED_FIELDS = ("frequency_penalty", "presence_penalty", "logit_bias", "best_of", "logprobs", "top_logprobs",
                       "response_schema")
_warned_fields: set[str] = set()


# ---------------------------------------------------------------------------------------------------------
# Inspect messages -> renderer messages
# ---------------------------------------------------------------------------------------------------------


def _content_to_renderer(content: str | list[Content]) -> renderers.Content:
    if isinstance(content, str):
        return content
    parts: list[renderers.ContentPart] = []
    for part in content:
        if isinstance(part, ContentText):
            parts.append(renderers.TextPart(type="text", text=part.text))
        elif isinstance(part, ContentReasoning):
            if not part.redacted:
                parts.append(renderers.ThinkingPart(type="thinking", thinking=part.reasoning))
        elif isinstance(part, ContentImage):
            parts.append(renderers.ImagePart(type="image", image=part.image))
        else:
            raise RendererError(
                f"message content of type {part.type!r} cannot be rendered for a Tinker model; "
                "only text, reasoning and images are supported"
            )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)  # type: ignore[typeddict-item]  # all parts are TextPart here
    return parts


def _tool_call_to_renderer(call: InspectToolCall) -> renderers.ToolCall:
    return renderers.ToolCall(
        id=call.id, function=renderers.FunctionBody(name=call.function, arguments=json.dumps(call.arguments))
    )


def inspect_messages_to_renderer(messages: Sequence[ChatMessage]) -> list[renderers.Message]:
    """Inspect's chat messages as the renderer's ``Message`` dicts (tool calls and tool results included)."""
    out: list[renderers.Message] = []
    for message in messages:
        converted: dict[str, Any] = {"role": message.role, "content": _content_to_renderer(message.content)}
        if isinstance(message, ChatMessageAssistant) and message.tool_calls:
            converted["tool_calls"] = [_tool_call_to_renderer(call) for call in message.tool_calls]
        elif isinstance(message, ChatMessageTool):
            if message.error is not None:
                converted["content"] = f"Error: {message.error.message}"
            if message.tool_call_id is not None:
                converted["tool_call_id"] = message.tool_call_id
            if message.function is not None:
                converted["name"] = message.function
        elif not isinstance(message, ChatMessageSystem | ChatMessageUser | ChatMessageAssistant):
            raise RendererError(f"unsupported Inspect message role {message.role!r}")
        out.append(converted)  # type: ignore[arg-type]  # a Message TypedDict built field by field
    return out


def tool_info_to_spec(tool: ToolInfo) -> renderers.ToolSpec:
    """An Inspect tool declaration as the renderer's ``ToolSpec`` (JSON schema of the arguments object)."""
    return renderers.ToolSpec(
        name=tool.name, description=tool.description, parameters=tool.parameters.model_dump(exclude_none=True)
    )


def _with_tools(renderer: renderers.Renderer, messages: list[renderers.Message],
                tools: Sequence[ToolInfo]) -> list[renderers.Message]:
    """``messages`` behind the renderer's tool declaration (which takes over a leading system message)."""
    system_prompt = ""
    if messages and messages[0]["role"] == "system":
        system_prompt = renderers.get_text_content(messages[0])
        messages = messages[1:]
    prefix = renderer.create_conversation_prefix_with_tools([tool_info_to_spec(t) for t in tools], system_prompt)
    return [*prefix, *messages]


# ---------------------------------------------------------------------------------------------------------
# GenerateConfig -> SamplingParams, sampled tokens -> Inspect choice
# ---------------------------------------------------------------------------------------------------------


def sampling_params_from_config(config: GenerateConfig, stop: list[str] | list[int]) -> tinker.SamplingParams:
    """Inspect's generation settings as Tinker ``SamplingParams`` (unset fields take the API's defaults)."""
    for name in _UNSUPPORTED_FIELDS:
        if getattr(config, name, None) not in (None, False) and name not in _warned_fields:
            _warned_fields.add(name)
            logger.warning("GenerateConfig.%s is not supported by the tinker-cookbook provider; ignored", name)
    return tinker.SamplingParams(
        max_tokens=config.max_tokens,
        temperature=1.0 if config.temperature is None else config.temperature,
        top_p=1.0 if config.top_p is None else config.top_p,
        top_k=-1 if config.top_k is None else config.top_k,
        seed=config.seed,
        stop=stop,
    )


def _tool_calls_to_inspect(message: renderers.Message) -> list[InspectToolCall] | None:
    calls: list[InspectToolCall] = []
    for index, call in enumerate(message.get("tool_calls") or []):
        try:
            arguments = json.loads(call.function.arguments)
            error = None if isinstance(arguments, dict) else "the arguments are not a JSON object"
        except json.JSONDecodeError as exc:
            arguments, error = {}, f"the arguments are not valid JSON: {exc}"
        calls.append(InspectToolCall(id=call.id or f"call_{index}", function=call.function.name,
                                     arguments=arguments if isinstance(arguments, dict) else {}, parse_error=error))
    for index, unparsed in enumerate(message.get("unparsed_tool_calls") or []):
        calls.append(InspectToolCall(id=f"unparsed_{index}", function="", arguments={},
                                     parse_error=f"{unparsed.error}: {unparsed.raw_text}"))
    return calls or None


def sequence_to_choice(renderer: renderers.Renderer, sequence: tinker.SampledSequence, stop_seqs: Sequence[str],
                       model: str, include_reasoning: bool = False) -> ChatCompletionChoice:
    """Parse sampled tokens into an Inspect choice; the text ends before the first of Inspect's ``stop_seqs``."""
    parsed, _termination = renderer.parse_response(list(sequence.tokens))
    text, cut = _cut_at_stop_strings(renderers.get_text_content(parsed), stop_seqs)
    thinking = renderers.get_thinking_content(parsed)
    content: str | list[Content] = text
    if include_reasoning and thinking:
        content = [ContentReasoning(reasoning=thinking), ContentText(text=text)]
    tool_calls = None if cut else _tool_calls_to_inspect(parsed)
    stop_reason: StopReason = "stop"
    if tool_calls:
        stop_reason = "tool_calls"
    elif sequence.stop_reason == "length" and not cut:
        stop_reason = "max_tokens"
    message = ChatMessageAssistant(content=content, tool_calls=tool_calls, model=model, source="generate")
    return ChatCompletionChoice(message=message, stop_reason=stop_reason)


# ---------------------------------------------------------------------------------------------------------
# The model API
# ---------------------------------------------------------------------------------------------------------


def resolve_renderer_name(renderer_name: str | None, base_model: str, model_path: str | None = None,
                          service_client: tinker.ServiceClient | None = None) -> str:
    """``renderer_name`` if given, else the one stored with ``model_path``'s training run, else the model's own."""
    if renderer_name:
        return renderer_name
    if model_path is not None and service_client is not None:
        stored = get_renderer_name_from_checkpoint(service_client, model_path)
        if stored:
            return stored
    try:
        return model_info.get_recommended_renderer_name(base_model)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"no renderer for {base_model!r}: {exc}. Pass renderer_name (on Inspect's CLI: -M renderer_name=NAME; "
            f"valid names: {renderers.get_registered_renderer_names()})"
        ) from exc


def _create_sampling_client(service_client: tinker.ServiceClient, model_path: str | None,
                            base_model: str) -> tinker.SamplingClient:
    try:
        if model_path is not None:
            return service_client.create_sampling_client(model_path=model_path)
        return service_client.create_sampling_client(base_model=base_model)
    except tinker.TinkerError as exc:
        what = f"model path {model_path!r}" if model_path is not None else f"base model {base_model!r}"
        # the engine's message for an unknown base model already says how to make one available
        fix = ("; pass a sampler_weights path from the run's checkpoints.jsonl (its sampler_path), e.g. "
               "tinker://RUN/sampler_weights/final" if model_path is not None else "")
        raise ConfigurationError(f"cannot sample from {what}: {exc}{fix}") from exc


class InspectAPIFromTinkerSampling(ModelAPI):
    """An Inspect ``ModelAPI`` that samples through a Tinker sampling client and a renderer.

    Give either ``sampling_client`` (used as is) or a model to load: ``model_path`` / a ``model_name`` starting
    with ``tinker://`` (a sampler checkpoint), or a base ``model_name``. ``renderer_name`` defaults to the one
    stored with the checkpoint's training run, else the base model's recommended renderer. With both
    ``sampling_client`` and ``model_path``, the path only names the model (in Inspect's logs) and finds the renderer.
    """

    def __init__(
        self,
        model_name: str | None = None,
        renderer_name: str | None = None,
        model_path: str | None = None,
        sampling_client: tinker.SamplingClient | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_vars: list[str] | None = None,
        config: GenerateConfig = GenerateConfig(),
        verbose: bool = False,
        include_reasoning: bool = False,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        **model_args: Any,
    ) -> None:
        if model_args:
            raise ConfigurationError(
                f"unknown model args for the {PROVIDER_NAME} provider: {sorted(model_args)}; valid: renderer_name, "
                "model_path, include_reasoning, verbose, max_connections"
            )
        if model_name is not None and model_name.startswith(TINKER_PATH_PREFIX):
            if model_path is not None and model_path != model_name:
                raise ConfigurationError(
                    f"model_name={model_name!r} and model_path={model_path!r} name different checkpoints; "
                    "pass only one"
                )
            model_path, model_name = model_name, None
        if model_path is not None and not model_path.startswith(TINKER_PATH_PREFIX):
            raise ConfigurationError(
                f"model_path={model_path!r} is not a {TINKER_PATH_PREFIX} path; pass a sampler path such as "
                "tinker://RUN/sampler_weights/final, or a base model as model_name"
            )
        if max_connections < 1:
            raise ConfigurationError(f"max_connections={max_connections} must be at least 1")

        service_client: tinker.ServiceClient | None = None
        if sampling_client is None:
            if model_path is None and not model_name:
                raise ConfigurationError(
                    "InspectAPIFromTinkerSampling needs sampling_client, model_path or model_name; e.g. "
                    "--model tinker-cookbook/HuggingFaceTB/SmolLM2-135M-Instruct"
                )
            try:
                service_client = tinker.ServiceClient(base_url=base_url)
            except tinker.BadRequestError as exc:
                raise ConfigurationError(f"base_url={base_url!r}: {exc}") from exc
            sampling_client = _create_sampling_client(service_client, model_path, model_name or "")
        elif model_path is not None:
            service_client = tinker.ServiceClient()
        base_model = sampling_client.get_base_model()
        if model_name and model_path is None and model_name != base_model:
            logger.warning("model_name=%r differs from the sampling client's base model %r; using %r for the "
                           "tokenizer and renderer", model_name, base_model, base_model)

        super().__init__(model_name=model_path or base_model, base_url=base_url, api_key=api_key,
                         api_key_vars=api_key_vars or [], config=config)
        self.sampling_client = sampling_client
        self.base_model = base_model
        self.renderer_name = resolve_renderer_name(renderer_name, base_model, model_path, service_client)
        self.tokenizer = sampling_client.get_tokenizer()
        self.renderer = renderers.get_renderer(self.renderer_name, self.tokenizer, model_name=base_model)
        model_info.warn_if_renderer_not_recommended(base_model, self.renderer_name)
        self.verbose = verbose
        self.include_reasoning = include_reasoning
        self._max_connections = max_connections
        _tag_as_provider(self)

    def max_connections(self) -> int:
        return self._max_connections

    def build_prompt(self, input: Sequence[ChatMessage], tools: Sequence[ToolInfo],
                     tool_choice: ToolChoice | None = None) -> tinker.ModelInput:
        """The renderer's generation prompt for ``input`` (tools declared unless ``tool_choice`` is "none")."""
        messages = inspect_messages_to_renderer(input)
        if tools and tool_choice != "none":
            messages = _with_tools(self.renderer, messages, tools)
        return self.renderer.build_generation_prompt(messages)

    async def generate(self, input: list[ChatMessage], tools: list[ToolInfo], tool_choice: ToolChoice,
                       config: GenerateConfig) -> tuple[ModelOutput, ModelCall]:
        prompt = self.build_prompt(input, tools, tool_choice)
        stop_seqs = list(config.stop_seqs or [])
        stop = merge_stop_sequences(self.renderer.get_stop_sequences(), stop_seqs, self.tokenizer)
        params = sampling_params_from_config(config, stop)
        start = time.perf_counter()
        response = await self.sampling_client.sample_async(
            prompt=prompt, num_samples=config.num_choices or 1, sampling_params=params
        )
        elapsed = time.perf_counter() - start
        choices = [sequence_to_choice(self.renderer, seq, stop_seqs, self.model_name, self.include_reasoning)
                   for seq in response.sequences]
        output_tokens = sum(len(seq.tokens) for seq in response.sequences)
        usage = ModelUsage(input_tokens=prompt.length, output_tokens=output_tokens,
                           total_tokens=prompt.length + output_tokens)
        # What Inspect's log viewer shows as the raw call: the rendered prompt and the sampled text.
        prompt_text = self.tokenizer.decode(prompt.to_ints())
        sampled = [{"text": self.tokenizer.decode(list(seq.tokens)), "num_tokens": len(seq.tokens),
                    "stop_reason": seq.stop_reason} for seq in response.sequences]
        if self.verbose:
            logger.info("prompt:\n%s", prompt_text)
            for seq in sampled:
                logger.info("response (%s):\n%s", seq["stop_reason"], seq["text"])
        call = ModelCall.create(
            request={"prompt": prompt_text, "renderer": self.renderer_name,
                     "sampling_params": params.model_dump(), "num_samples": config.num_choices or 1},
            response={"sequences": sampled}, time=elapsed,
        )
        return ModelOutput(model=self.model_name, choices=choices, usage=usage, time=elapsed), call


def _tag_as_provider(api: ModelAPI) -> None:
    """Give an instance built directly (as in the docs' grader example) the registry tag Inspect's ``Model`` needs.

    Instances that ``get_model`` builds through the registered provider are tagged by Inspect itself (again, after
    this). Inspect has no public call for this; ``inspect-ai`` is pinned, and tests/eval builds one directly.
    """
    from inspect_ai._util.registry import RegistryInfo, registry_tag

    registry_tag(type(api), api, RegistryInfo(type="modelapi", name=PROVIDER_NAME))


# Registration with Inspect's model registry. Inspect's CLI imports this module through the package's
# ``inspect_ai`` entry point, so ``--model tinker-cookbook/...`` resolves without importing anything first.
@modelapi(name=PROVIDER_NAME)
def _tinker_cookbook_provider() -> type[ModelAPI]:
    return InspectAPIFromTinkerSampling


@modelapi(name=UPSTREAM_PROVIDER_NAME)
def _tinker_sampling_provider() -> type[ModelAPI]:
    return InspectAPIFromTinkerSampling
