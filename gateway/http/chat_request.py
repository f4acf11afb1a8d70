"""POST /v1/chat/completions body -> a validated ``ChatCall`` (an OmniRequest plus response options). Pure."""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.http.content import parse_messages
from omni_gateway.gateway.http.errors import invalid
from omni_gateway.gateway.http.fields import get_bool, get_int, get_str, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.sampling import StreamOptions, check_model, parse_sampling, parse_stream
from omni_gateway.gateway.http.structured import parse_constraint
from omni_gateway.omni.protocol import AudioOutputOptions, Capabilities, Modality, OmniRequest, ToolChoice

# pcm16 is 24 kHz mono 16-bit little-endian, as in OpenAI's API; streaming supports pcm16 only there too
CHAT_AUDIO_FORMATS = ("wav", "pcm16")
HTTP_PRIORITY = 1


@dataclass(frozen=True, slots=True)
class ChatCall:
    request: OmniRequest
    model: str
    stream: StreamOptions
    logprobs: bool
    top_logprobs: int
    audio_format: str | None  # set when audio output was asked for


def parse_chat(raw: object, caps: Capabilities, limits: HttpLimits, adapters: Collection[str] = ()) -> ChatCall:
    body: dict[str, Any] = require_object(raw, "body")
    model = check_model(body, caps, adapters)
    messages = parse_messages(body.get("messages"), caps, limits)
    stream = parse_stream(body)
    logprobs = get_bool(body, "logprobs")
    top_logprobs = get_int(body, "top_logprobs", lo=0, hi=limits.max_top_logprobs)
    if top_logprobs is not None and not logprobs:
        raise invalid("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
    sampling = parse_sampling(body, limits, logprobs=(top_logprobs or 0) if logprobs else None)
    modalities = _modalities(body, caps)
    audio, audio_format = _audio_output(body, modalities, caps, stream.stream)
    if audio_format is not None and sampling.n > 1:
        raise invalid("'n' must be 1 when audio output is requested.", "n")
    sampling = replace(sampling, constraint=parse_constraint(body, response_format=True))
    tools, tool_choice = _tools(body)
    # A named function is called exactly once, as OpenAI's models do; "required" and "auto" may call in
    # parallel unless the client says otherwise.
    parallel = get_bool(body, "parallel_tool_calls", True) and not isinstance(body.get("tool_choice"), dict)
    if tool_choice == "required" and sampling.constraint is not None:
        raise invalid(
            f"'tool_choice' forces a tool call, which '{sampling.constraint.param}' would constrain too; send one.",
            "tool_choice",
        )
    return ChatCall(
        request=OmniRequest(
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            messages=messages,
            modalities=modalities,
            sampling=sampling,
            audio=audio,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel,
            priority=HTTP_PRIORITY,
            model=model,
        ),
        model=model,
        stream=stream,
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        audio_format=audio_format,
    )


def _modalities(body: dict[str, Any], caps: Capabilities) -> tuple[Modality, ...]:
    value = body.get("modalities")
    if value is None:
        return ("text",)
    if not isinstance(value, list) or not value or any(m not in ("text", "audio") for m in value):
        raise invalid('\'modalities\' must be ["text"] or ["text", "audio"].', "modalities")
    for m in value:
        if m not in caps.output_modalities:
            raise invalid(f"model '{caps.model}' cannot produce {m} output.", "modalities", "unsupported_modality")
    return tuple(dict.fromkeys(value))


def _audio_output(
    body: dict[str, Any], modalities: tuple[Modality, ...], caps: Capabilities, stream: bool
) -> tuple[AudioOutputOptions, str | None]:
    value = body.get("audio")
    if "audio" not in modalities:
        if value is not None:
            raise invalid("'audio' is only allowed when 'modalities' includes \"audio\".", "audio")
        return AudioOutputOptions(), None
    audio = require_object(value, "audio") if value is not None else {}
    voice = get_str(audio, "voice", required=True, param="audio.voice")
    if not caps.offers_voice(voice):
        raise invalid(f"'audio.voice' must be one of {', '.join(caps.voices)}, got {shown(voice)}.", "audio.voice")
    fmt = get_str(audio, "format", required=True, choices=CHAT_AUDIO_FORMATS, param="audio.format")
    if stream and fmt != "pcm16":
        raise invalid("streamed audio output supports 'audio.format' \"pcm16\" only.", "audio.format")
    return AudioOutputOptions(voice=voice, sample_rate=24000), fmt


def _tools(body: dict[str, Any]) -> tuple[tuple[dict[str, Any], ...], ToolChoice]:
    """The tools offered and whether a call is required: "none" offers none; a named function offers
    that one tool and requires its call."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise invalid("'tool_choice' requires 'tools'.", "tool_choice")
        return (), "auto"
    if not isinstance(tools, list):
        raise invalid("'tools' must be an array of function tools.", "tools")
    names = []
    for i, tool in enumerate(tools):
        tool = require_object(tool, f"tools[{i}]")
        get_str(tool, "type", required=True, choices=("function",), param=f"tools[{i}].type")
        fn = require_object(tool.get("function"), f"tools[{i}].function")
        names.append(get_str(fn, "name", required=True, max_len=64, param=f"tools[{i}].function.name"))
        if fn.get("parameters") is not None:
            require_object(fn["parameters"], f"tools[{i}].function.parameters")
    if len(set(names)) != len(names):
        raise invalid("'tools' names a function twice; function names must be unique.", "tools")
    if choice is None or choice == "auto":
        return tuple(tools), "auto"
    if choice == "required":
        if not tools:
            raise invalid("'tool_choice' \"required\" needs at least one tool in 'tools'.", "tool_choice")
        return tuple(tools), "required"
    if choice == "none":
        return (), "auto"
    if isinstance(choice, str):
        raise invalid(
            f'\'tool_choice\' must be "none", "auto", "required" or a named function, got {shown(choice)}.',
            "tool_choice",
        )
    choice = require_object(choice, "tool_choice")
    name = require_object(choice.get("function"), "tool_choice.function").get("name")
    if name not in names:
        raise invalid(f"'tool_choice' names function {shown(name)}, which is not among 'tools'.", "tool_choice")
    return tuple(t for t, n in zip(tools, names) if n == name), "required"
