"""Backend output chunks -> chat.completion bodies and chat.completion.chunk SSE objects. Pure."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from typing import Any

from omni_gateway.gateway.http.chat_request import ChatCall
from omni_gateway.gateway.http.errors import from_backend
from omni_gateway.gateway.http.wav import encode_wav
from omni_gateway.omni.protocol import (
    AudioChunk,
    Done,
    Error,
    OutputChunk,
    TextDelta,
    ToolCallArguments,
    ToolCallDelta,
    Usage,
)


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": usage.input_audio_tokens},
        "completion_tokens_details": {"audio_tokens": usage.output_audio_tokens, "reasoning_tokens": 0},
    }


def chat_logprobs(entries: tuple[Any, ...], top: int) -> list[dict[str, Any]]:
    return [
        {
            "token": token,
            "logprob": logprob,
            "bytes": list(token.encode()),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in alts[:top]],
        }
        for token, logprob, alts in entries
    ]


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    started: bool = False


class ChatAssembler:
    """Folds the chunk stream of one chat call; ``feed`` also returns the SSE chunks to send for it."""

    def __init__(self, call: ChatCall, created: int, audio_expires_s: int) -> None:
        self.call = call
        self.created = created
        self.choices = [_Choice() for _ in range(call.request.sampling.n)]
        self.usage: Usage | None = None
        self.audio_id = f"audio_{uuid.uuid4().hex}"
        self.audio_expires_at = created + audio_expires_s
        self.pcm = bytearray()
        self.sample_rate = 24000

    @property
    def wants_audio(self) -> bool:
        return self.call.audio_format is not None

    def feed(self, chunk: OutputChunk) -> list[dict[str, Any]]:
        """Record ``chunk``; an ``Error`` chunk raises the ``ApiError`` it maps to."""
        if isinstance(chunk, Error):
            raise from_backend(chunk)
        if isinstance(chunk, Usage):
            self.usage = chunk
            return []
        if isinstance(chunk, AudioChunk):
            # a spoken answer's text is the transcript its audio chunks carry
            self.pcm += chunk.pcm16
            self.sample_rate = chunk.sample_rate
            self.choices[0].text.append(chunk.transcript)
            audio = {"id": self.audio_id, "data": base64.b64encode(chunk.pcm16).decode()}
            if chunk.transcript:
                audio["transcript"] = chunk.transcript
            return self._delta(0, {"audio": audio})
        index = chunk.index if isinstance(chunk, (TextDelta, Done, ToolCallArguments, ToolCallDelta)) else 0
        choice = self._choice(index)
        if isinstance(chunk, TextDelta):
            if self.wants_audio:  # the same words arrive again as the audio's transcript
                return []
            choice.text.append(chunk.text)
            logprobs = chat_logprobs(chunk.logprobs, self.call.top_logprobs) if self.call.logprobs else None
            if logprobs:
                choice.logprobs.extend(logprobs)
            return self._delta(
                index, {"content": chunk.text}, {"content": logprobs, "refusal": None} if logprobs else None
            )
        if isinstance(chunk, ToolCallArguments):
            # The first piece of a call carries its id and name; the rest only more arguments.
            known = [i for i, c in enumerate(choice.tool_calls) if c["id"] == chunk.call_id]
            if known:
                choice.tool_calls[known[0]]["function"]["arguments"] += chunk.delta
                if not chunk.delta:
                    return []
                return self._delta(index, {"tool_calls": [{"index": known[0], "function": {"arguments": chunk.delta}}]})
            call = {"id": chunk.call_id, "type": "function", "function": {"name": chunk.name, "arguments": chunk.delta}}
            choice.tool_calls.append(call)
            return self._delta(index, {"tool_calls": [{"index": len(choice.tool_calls) - 1, **_copy(call)}]})
        if isinstance(chunk, ToolCallDelta):
            streamed = [c for c in choice.tool_calls if c["id"] == chunk.call_id]
            if streamed:  # its pieces went out already; the whole call is what the body reports
                streamed[0]["function"]["arguments"] = chunk.arguments
                return []
            call = {
                "id": chunk.call_id,
                "type": "function",
                "function": {"name": chunk.name, "arguments": chunk.arguments},
            }
            choice.tool_calls.append(call)
            return self._delta(index, {"tool_calls": [{"index": len(choice.tool_calls) - 1, **_copy(call)}]})
        if isinstance(chunk, Done):
            choice.finish_reason = self._finish_reason(choice, chunk.finish_reason)
            out = []
            if self.wants_audio:
                out += self._delta(index, {"audio": {"id": self.audio_id, "expires_at": self.audio_expires_at}})
            return out + [
                self._chunk([{"index": index, "delta": {}, "logprobs": None, "finish_reason": choice.finish_reason}])
            ]
        return []  # image chunks cannot occur: chat asks for text and audio only

    def _choice(self, index: int) -> _Choice:
        if not 0 <= index < len(self.choices):
            raise from_backend(Error("internal_error", f"backend answered choice {index} of {len(self.choices)}", 500))
        return self.choices[index]

    @staticmethod
    def _finish_reason(choice: _Choice, reason: str) -> str:
        if choice.tool_calls and reason == "stop":
            return "tool_calls"
        return "stop" if reason == "abort" else reason

    def _delta(self, index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        choice = self.choices[index]
        if not choice.started:
            choice.started = True
            delta = {"role": "assistant", "content": None if self.wants_audio else "", **delta}
        return [self._chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}])]

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.call.request.request_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.call.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def usage_chunk(self) -> dict[str, Any] | None:
        """The trailing chunk ``stream_options.include_usage`` asks for."""
        if not self.call.stream.include_usage:
            return None
        return {**self._chunk([]), "usage": usage_body(self.usage or Usage())}

    def body(self) -> dict[str, Any]:
        """The non-streaming chat.completion response."""
        return {
            "id": self.call.request.request_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.call.model,
            "system_fingerprint": None,
            "choices": [self._choice_body(i, c) for i, c in enumerate(self.choices)],
            "usage": usage_body(self.usage or Usage()),
        }

    def _choice_body(self, index: int, choice: _Choice) -> dict[str, Any]:
        text = "".join(choice.text)
        message: dict[str, Any] = {"role": "assistant", "content": None if self.wants_audio else text, "refusal": None}
        if choice.tool_calls:
            message["tool_calls"] = choice.tool_calls
            message["content"] = message["content"] or None
        if self.wants_audio:
            audio = (
                bytes(self.pcm) if self.call.audio_format == "pcm16" else encode_wav(bytes(self.pcm), self.sample_rate)
            )
            message["audio"] = {
                "id": self.audio_id,
                "data": base64.b64encode(audio).decode(),
                "expires_at": self.audio_expires_at,
                "transcript": text,
            }
        logprobs = {"content": choice.logprobs, "refusal": None} if self.call.logprobs else None
        return {
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason or "stop",
        }


def _copy(call: dict[str, Any]) -> dict[str, Any]:
    """A call as sent in a chunk: later pieces must not change a chunk already built."""
    return {**call, "function": dict(call["function"])}
