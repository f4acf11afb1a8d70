"""Backend output chunks -> text_completion bodies and streamed chunks. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omni_gateway.gateway.http.chat_response import usage_body
from omni_gateway.gateway.http.completion_request import CompletionCall
from omni_gateway.gateway.http.errors import from_backend
from omni_gateway.omni.protocol import Done, Error, OutputChunk, TextDelta, Usage


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[str, float]] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    length: int = 0
    finish_reason: str | None = None


class CompletionAssembler:
    """Choice ``prompt_index * n + index`` answers prompt ``prompt_index``, as OpenAI numbers them."""

    def __init__(self, call: CompletionCall, created: int) -> None:
        self.call = call
        self.created = created
        self.n = call.requests[0].sampling.n
        self.choices = [_Choice() for _ in range(len(call.prompts) * self.n)]
        self.usage = Usage()

    def feed(self, prompt_index: int, chunk: OutputChunk) -> list[dict[str, Any]]:
        if isinstance(chunk, Error):
            raise from_backend(chunk)
        if isinstance(chunk, Usage):
            u = self.usage
            self.usage = Usage(
                input_tokens=u.input_tokens + chunk.input_tokens,
                output_tokens=u.output_tokens + chunk.output_tokens,
                cached_tokens=u.cached_tokens + chunk.cached_tokens,
            )
            return []
        if not isinstance(chunk, (TextDelta, Done)):
            return []
        if not 0 <= chunk.index < self.n:
            raise from_backend(Error("internal_error", f"backend answered choice {chunk.index} of {self.n}", 500))
        number = prompt_index * self.n + chunk.index
        choice = self.choices[number]
        out = self._echo(number, prompt_index)
        if isinstance(chunk, Done):
            choice.finish_reason = "stop" if chunk.finish_reason == "abort" else chunk.finish_reason
            return out + [self._chunk(number, "", None, choice.finish_reason)]
        logprobs = self._logprobs(choice, chunk)
        choice.text.append(chunk.text)
        choice.length += len(chunk.text)
        return out + [self._chunk(number, chunk.text, logprobs, None)]

    def _echo(self, number: int, prompt_index: int) -> list[dict[str, Any]]:
        """The prompt, once, ahead of a choice's first text when ``echo`` is set."""
        choice = self.choices[number]
        if not self.call.echo or choice.text:
            return []
        prompt = self.call.prompts[prompt_index]
        choice.text.append(prompt)
        choice.length = len(prompt)
        return [self._chunk(number, prompt, None, None)]

    def _logprobs(self, choice: _Choice, chunk: TextDelta) -> dict[str, Any] | None:
        if self.call.logprobs is None:
            return None
        piece: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = choice.length
        for token, logprob, alts in chunk.logprobs:
            top = {t: lp for t, lp in alts[: self.call.logprobs]}
            for key, value in (
                ("tokens", token),
                ("token_logprobs", logprob),
                ("top_logprobs", top),
                ("text_offset", offset),
            ):
                piece[key].append(value)
            offset += len(token)
        choice.tokens += piece["tokens"]
        choice.token_logprobs += piece["token_logprobs"]
        choice.top_logprobs += piece["top_logprobs"]
        choice.text_offset += piece["text_offset"]
        return piece

    def _chunk(
        self, index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None
    ) -> dict[str, Any]:
        return {
            "id": self.call.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.call.model,
            "system_fingerprint": None,
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        }

    def usage_chunk(self) -> dict[str, Any] | None:
        if not self.call.stream.include_usage:
            return None
        return {
            "id": self.call.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.call.model,
            "choices": [],
            "usage": usage_body(self.usage),
        }

    def body(self) -> dict[str, Any]:
        choices = []
        for i, c in enumerate(self.choices):
            logprobs = (
                {
                    "tokens": c.tokens,
                    "token_logprobs": c.token_logprobs,
                    "top_logprobs": c.top_logprobs,
                    "text_offset": c.text_offset,
                }
                if self.call.logprobs is not None
                else None
            )
            choices.append(
                {"index": i, "text": "".join(c.text), "logprobs": logprobs, "finish_reason": c.finish_reason or "stop"}
            )
        return {
            "id": self.call.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.call.model,
            "system_fingerprint": None,
            "choices": choices,
            "usage": usage_body(self.usage),
        }
