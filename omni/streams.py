"""The three output streams of a turn: written text (with tool calls), speech, and images.

Each yields protocol ``OutputChunk``s; a refusal the client caused becomes an ``Error`` chunk, anything
else propagates as an exception (a server error).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from omni_gateway.engine.errors import EngineDead, EngineOverloaded, InvalidConstraint, InvalidRequest
from omni_gateway.omni.heads.dit.errors import ImageGenerationError
from omni_gateway.omni.prompting import constraint_param
from omni_gateway.omni.protocol import (
    Done,
    Error,
    InvalidInput,
    OmniRequest,
    OutputChunk,
    TextDelta,
    ToolCallArguments,
    ToolCallDelta,
    Usage,
)
from omni_gateway.omni.tools import ArgumentsDelta, CallStart, CallStream, StreamEvent, ToolCallFormat, tool_name

if TYPE_CHECKING:
    from omni_gateway.engine.outputs import StreamDelta
    from omni_gateway.engine.sampling_params import SamplingParams
    from omni_gateway.omni.collaborators import Engine, ImageHead, SpeechHead

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    token_ids: list[int]
    embed_spans: tuple[Any, ...] = ()  # engine.core.sequence.EmbedSpan for image/video placeholders
    num_image_tokens: int = 0
    num_audio_tokens: int = 0


async def written(
    engine: Engine, request: OmniRequest, prompt: Prompt, params: SamplingParams, tools: ToolCallFormat
) -> AsyncIterator[OutputChunk]:
    """The answer as text deltas; with tools, each choice's text goes through a reader of the ``tools``
    format, so content streams as it comes and each call as its start, its argument pieces and the
    whole call. A forced answer is calls only: none of its text is content; a call repeating an earlier one
    ends its choice there, as complete calls, and once every choice is over the engine request is closed
    (aborted), so no more tokens are spent."""
    tool_names = frozenset(tool_name(t) for t in request.tools)
    forced = request.tool_choice == "required"
    parsers: dict[int, CallStream] = {}
    finals: list[StreamDelta] = []
    try:
        async with contextlib.aclosing(_deltas(engine, request, prompt, params)) as deltas:
            async for delta in deltas:
                if delta.error is not None:
                    yield Error("engine_error", delta.error, status=500)
                    return
                parser = parsers.get(delta.index)
                if parser is not None and parser.ended:
                    continue  # a choice that repeated a call is over; the others go on
                if tool_names:
                    if parser is None:
                        parser = parsers[delta.index] = tools.stream(tool_names, forced=forced)
                    events = parser.feed(delta.text) if delta.text else []
                    if delta.finished:
                        events += parser.finish()
                    for chunk in _tool_chunks(events, delta.index):
                        yield chunk
                elif delta.text or delta.logprobs:
                    yield TextDelta(delta.text, index=delta.index, logprobs=_logprobs(engine, delta))
                if delta.finished or (parser is not None and parser.ended):
                    finals.append(delta)  # its token counts so far: the usage of an ended choice
                    reason = delta.finish_reason or "stop"
                    if parser is not None and parser.calls and (reason == "stop" or parser.ended):
                        reason = "tool_calls"
                    stop = delta.stop_reason if isinstance(delta.stop_reason, str) else None
                    yield Done(reason, index=delta.index, stop_sequence=stop)
                    if len(finals) == params.n:
                        break  # every choice is over: leaving closes (aborts) the engine request
    except (InvalidRequest, EngineOverloaded, EngineDead) as exc:
        yield refusal(exc, constraint_param(request) if isinstance(exc, InvalidConstraint) else None)
        return
    yield usage(finals, prompt)


def _tool_chunks(events: list[StreamEvent], index: int) -> list[OutputChunk]:
    chunks: list[OutputChunk] = []
    for event in events:
        if isinstance(event, str):
            chunks.append(TextDelta(event, index=index))
        elif isinstance(event, ArgumentsDelta):
            chunks.append(ToolCallArguments(event.call_id, event.name, event.delta, index=index))
        elif isinstance(event, CallStart):
            chunks.append(ToolCallArguments(event.call_id, event.name, "", index=index))
        else:
            chunks.append(ToolCallDelta(event.call.call_id, event.call.name, event.call.arguments, index=index))
    return chunks


async def spoken(
    engine: Engine,
    tts: SpeechHead | None,
    request: OmniRequest,
    prompt: Prompt,
    params: SamplingParams,
    cancel: asyncio.Event,
    tools: ToolCallFormat,
) -> AsyncIterator[OutputChunk]:
    """The answer as speech: the text deltas feed the voice, which speaks clause by clause as they arrive.
    With tools, only content is spoken; the calls go out as they close, between audio chunks."""
    if tts is None:
        yield Error("unsupported_modality", "audio output needs a speech synthesis model (start with --tts)")
        return
    finals: list[StreamDelta] = []
    failure: list[Error] = []
    names = frozenset(tool_name(t) for t in request.tools)
    parser = tools.stream(names, forced=request.tool_choice == "required") if names else None
    calls: list[OutputChunk] = []

    def said(text: str, finished: bool) -> str:
        if parser is None:
            return text
        events = (parser.feed(text) if text else []) + (parser.finish() if finished else [])
        calls.extend(c for c in _tool_chunks(events, 0) if not isinstance(c, TextDelta))
        return "".join(e for e in events if isinstance(e, str))

    async def text() -> AsyncIterator[str]:
        try:
            async with contextlib.aclosing(_deltas(engine, request, prompt, params)) as deltas:
                async for delta in deltas:
                    if delta.error is not None:
                        failure.append(Error("engine_error", delta.error, status=500))
                        return
                    if delta.index != 0:
                        continue  # one voice per response: extra choices are not spoken
                    words = said(delta.text, delta.finished)
                    if words:
                        yield words
                    ended = parser is not None and parser.ended
                    if delta.finished or ended:
                        finals.append(delta)
                    if cancel.is_set() or ended:
                        return  # a repeated call ended the answer: leaving closes (aborts) the engine request
        except (InvalidRequest, EngineOverloaded, EngineDead) as exc:
            failure.append(refusal(exc))

    samples = 0
    async for chunk in tts.stream(text(), request.audio):
        if cancel.is_set():
            break
        while calls:
            yield calls.pop(0)
        samples += len(chunk.pcm16) // 2
        yield chunk
    while calls:
        yield calls.pop(0)
    if failure:
        yield failure[0]
        return
    reason = finals[0].finish_reason if finals else "abort"
    if parser is not None and parser.calls and (reason == "stop" or parser.ended):
        reason = "tool_calls"
    yield Done(reason or "stop")
    # Output audio tokens are counted as OpenAI does for its realtime models: 1 token per 50 ms.
    counted = usage(finals, prompt)
    yield dataclasses.replace(counted, output_audio_tokens=round(samples / request.audio.sample_rate * 20))


async def drawn(
    image_head: ImageHead | None, request: OmniRequest, cancel: asyncio.Event
) -> AsyncIterator[OutputChunk]:
    """Image previews and finals of the users' text, from the DiT head."""
    if image_head is None:
        yield Error("unsupported_modality", "image output needs an image model (start with --image-model DIR)")
        return
    prompt = "\n".join(m.text for m in request.messages if m.role == "user").strip()
    if not prompt:
        yield Error("invalid_request", "image generation needs a text prompt in a user message")
        return
    try:
        async for chunk in image_head.generate(prompt, request.image, cancel):
            yield chunk
    except ImageGenerationError as exc:
        log.exception("image generation failed")
        yield Error("image_generation_failed", str(exc), status=500)
        return
    except InvalidInput as exc:
        yield refusal(exc)
        return
    yield Done("abort" if cancel.is_set() else "stop")


_STREAM_END = object()


async def merged(*streams: AsyncIterator[OutputChunk]) -> AsyncIterator[OutputChunk]:
    """Chunks of several streams as they come. A small queue keeps each producer at the consumer's pace;
    closing the merged stream closes every source."""
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=8)

    async def pump(stream: AsyncIterator[OutputChunk]) -> None:
        try:
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    await queue.put(chunk)
        except Exception as exc:  # handed to the consumer, which re-raises it
            await queue.put(exc)
            return
        await queue.put(_STREAM_END)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is _STREAM_END:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def refusal(exc: InvalidInput | InvalidRequest | EngineOverloaded | EngineDead, param: str | None = None) -> Error:
    """The error chunk of a refusal the client is told about: its own request's fault (400), or no capacity
    (503). ``param`` names the request field at fault where the caller knows it."""
    if isinstance(exc, EngineOverloaded):
        return Error("overloaded", str(exc), status=503)
    if isinstance(exc, EngineDead):
        return Error("engine_dead", str(exc), status=503)
    if isinstance(exc, InvalidInput):
        return Error(exc.code, str(exc), status=exc.status, param=exc.param)
    message = f"Invalid '{param}': {exc}" if param else str(exc)
    return Error("invalid_request", message, status=400, param=param)  # the engine's InvalidRequest


def usage(finals: list[StreamDelta], prompt: Prompt) -> Usage:
    if not finals:
        return Usage(input_image_tokens=prompt.num_image_tokens, input_audio_tokens=prompt.num_audio_tokens)
    return Usage(
        input_tokens=finals[0].num_prompt_tokens,
        cached_tokens=finals[0].num_cached_tokens,
        output_tokens=sum(d.num_output_tokens for d in finals),
        input_image_tokens=prompt.num_image_tokens,
        input_audio_tokens=prompt.num_audio_tokens,
    )


async def _deltas(
    engine: Engine, request: OmniRequest, prompt: Prompt, params: SamplingParams
) -> AsyncIterator[StreamDelta]:
    kwargs: dict[str, Any] = {"embed_spans": prompt.embed_spans} if prompt.embed_spans else {}
    if request.session_id is not None:
        kwargs["session_id"] = request.session_id
    async with contextlib.aclosing(
        engine.generate(prompt.token_ids, params, request_id=request.request_id, priority=request.priority, **kwargs)
    ) as deltas:
        async for delta in deltas:
            yield delta


def _logprobs(engine: Engine, delta: StreamDelta) -> tuple[tuple[str, float, tuple[tuple[str, float], ...]], ...]:
    if not delta.logprobs:
        return ()
    tok = engine.tokenizer
    return tuple(
        (tok.decode([lp.token_id]), lp.logprob, tuple((tok.decode([t]), v) for t, v in lp.top)) for lp in delta.logprobs
    )
