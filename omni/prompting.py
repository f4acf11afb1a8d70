"""Turn an ``OmniRequest`` into what the engine takes: prompt token ids (text and vision alike) and SamplingParams."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.sampling_params import SamplingParams, StructuredOutputs
from omni_gateway.omni.protocol import (
    AudioPart,
    ImagePart,
    InvalidInput,
    Message,
    OmniRequest,
    OutputConstraint,
    SamplingOptions,
    TextPart,
    VideoPart,
)
from omni_gateway.omni.tools import ToolCallFormat, template_tool, tool_call_format


class ChatRenderer(Protocol):
    """Conversation -> prompt text with the model's chat template (``AsyncEngine.render_chat``)."""

    def __call__(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str: ...


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def convert_ids_to_tokens(self, ids: int) -> str: ...


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Used where the client leaves a knob unset (the realtime API has no temperature at all)."""

    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 512


class UnsupportedInput(InvalidInput):
    """The request carries a part the loaded models cannot take (e.g. an image for a text-only LLM)."""

    code = "unsupported_modality"


def prompt_ids(
    request: OmniRequest,
    tokenizer: Tokenizer,
    render: ChatRenderer,
    *,
    system_prompt: str | None,
    allow_images: bool = False,
) -> list[int]:
    """The prompt token ids of a conversation: the one renderer of text and vision prompts alike.
    A raw prompt is tokenized as it is; otherwise ``system_prompt`` goes first unless the conversation has one."""
    if request.raw_prompt is not None:
        return list(tokenizer.encode(request.raw_prompt))
    messages = chat_messages(request, allow_images=allow_images)
    if system_prompt and not any(m["role"] == "system" for m in messages):
        messages.insert(0, {"role": "system", "content": system_prompt})
    try:
        tools = [template_tool(t) for t in request.tools] or None
        text = render(messages, tools=tools, add_generation_prompt=request.add_generation_prompt)
    except InvalidRequest as exc:  # the engine's refusal of the conversation (e.g. no messages at all)
        raise InvalidInput(str(exc)) from None
    # The template already holds the special tokens (BOS, role markers); don't add them twice.
    return list(tokenizer.encode(text, add_special_tokens=False))


def chat_messages(request: OmniRequest, *, allow_images: bool = False) -> list[dict[str, Any]]:
    """OpenAI-style chat messages with string content, in the shape HF chat templates expect.

    Audio parts must already carry their transcript: the pipeline runs ASR before this.
    """
    out: list[dict[str, Any]] = []
    for message in request.messages:
        text = _message_text(message, allow_images=allow_images)
        entry: dict[str, Any] = {"role": message.role, "content": text}
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _json_or_text(c.arguments)},
                }
                for c in message.tool_calls
            ]
        if message.role == "tool" and message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        out.append(entry)
    return out


def _message_text(message: Message, *, allow_images: bool) -> str:
    pieces: list[str] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            pieces.append(part.text)
        elif isinstance(part, AudioPart):
            if part.transcript is None:
                raise AssertionError("audio parts are transcribed before prompting")
            pieces.append(part.transcript)
        elif isinstance(part, (ImagePart, VideoPart)):
            if not allow_images:
                kind = "image" if isinstance(part, ImagePart) else "video"
                raise UnsupportedInput(
                    f"the loaded model takes text and audio input only; got an {kind} part "
                    f"(serve a vision-language model to send images)"
                )
        else:  # pragma: no cover - the Part union is closed
            raise TypeError(f"unknown message part {type(part).__name__}")
    return "".join(pieces)


def _json_or_text(arguments: str) -> Any:
    # Chat templates (Qwen, Llama 3) render arguments with tojson; hand them the parsed object.
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def sampling_params(
    options: SamplingOptions,
    defaults: SamplingDefaults,
    *,
    stop_token_ids: tuple[int, ...] = (),
    structured_outputs: StructuredOutputs | None = None,
) -> SamplingParams:
    """Map the OpenAI-level options onto the engine's SamplingParams (raises InvalidInput on bad values)."""
    try:
        return _sampling_params(options, defaults, stop_token_ids, structured_outputs)
    except InvalidRequest as exc:
        raise InvalidInput(str(exc)) from None


def structured_outputs(request: OmniRequest, tools: ToolCallFormat | None = None) -> StructuredOutputs | None:
    """The engine constraint of a request: its output constraint, else (with tools offered) the structural
    tag of calls in the ``tools`` format (Hermes by default), else none. Raises InvalidInput naming the
    field of a malformed one."""
    constraint = request.sampling.constraint
    try:
        if constraint is not None:
            return _constraint(constraint)
        if request.tools:
            tag = (tools or tool_call_format(None)).grammar(
                request.tools, required=request.tool_choice == "required", parallel=request.parallel_tool_calls
            )
            return None if tag is None else StructuredOutputs(structural_tag=json.dumps(tag, ensure_ascii=False))
    except InvalidRequest as exc:
        raise InvalidInput(f"Invalid '{constraint_param(request)}': {exc}", param=constraint_param(request)) from None
    return None


def constraint_param(request: OmniRequest) -> str:
    """The request field a constraint came from, named when it cannot be compiled."""
    return request.sampling.constraint.param if request.sampling.constraint is not None else "tools"


def _constraint(c: OutputConstraint) -> StructuredOutputs:
    if c.kind == "json":
        return StructuredOutputs(json=c.spec)
    if c.kind == "json_object":
        return StructuredOutputs(json_object=True)
    if c.kind == "regex":
        return StructuredOutputs(regex=c.spec)
    if c.kind == "choice":
        return StructuredOutputs(choice=c.choices)
    return StructuredOutputs(grammar=c.spec)


def _sampling_params(
    options: SamplingOptions,
    defaults: SamplingDefaults,
    stop_token_ids: tuple[int, ...],
    structured: StructuredOutputs | None,
) -> SamplingParams:
    return SamplingParams(
        n=options.n,
        temperature=defaults.temperature if options.temperature is None else options.temperature,
        top_p=defaults.top_p if options.top_p is None else options.top_p,
        top_k=options.top_k or 0,
        min_p=options.min_p or 0.0,
        presence_penalty=options.presence_penalty or 0.0,
        frequency_penalty=options.frequency_penalty or 0.0,
        repetition_penalty=options.repetition_penalty or 1.0,
        seed=options.seed,
        max_tokens=defaults.max_tokens if options.max_tokens is None else options.max_tokens,
        stop=options.stop,
        stop_token_ids=stop_token_ids,
        logprobs=options.logprobs,
        structured_outputs=structured,
    )
