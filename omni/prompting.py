"""Turn an ``OmniRequest`` into what the engine takes: chat messages for the template and SamplingParams."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.protocol import AudioPart, ImagePart, Message, OmniRequest, SamplingOptions, TextPart, VideoPart


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Used where the client leaves a knob unset (the realtime API has no temperature at all)."""

    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 512


class UnsupportedInput(ValueError):
    """The request carries a part the loaded models cannot take (e.g. an image for a text-only LLM)."""


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
                {"id": c.call_id, "type": "function",
                 "function": {"name": c.name, "arguments": _json_or_text(c.arguments)}}
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
                    f"(serve a vision-language model to send images)")
        else:  # pragma: no cover - the Part union is closed
            raise TypeError(f"unknown message part {type(part).__name__}")
    return "".join(pieces)


def _json_or_text(arguments: str) -> Any:
    # Chat templates (Qwen, Llama 3) render arguments with tojson; hand them the parsed object.
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def sampling_params(options: SamplingOptions, defaults: SamplingDefaults, *, stop_token_ids: tuple[int, ...] = ()
                    ) -> SamplingParams:
    """Map the OpenAI-level options onto the engine's SamplingParams (raises InvalidRequest on bad values)."""
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
    )
