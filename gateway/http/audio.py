"""POST /v1/audio/transcriptions (multipart WAV upload) and POST /v1/audio/speech (streamed audio)."""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import AsyncIterator

import anyio
import numpy as np
import soundfile
from omni_gateway.gateway.http.audio_request import SpeechCall, parse_speech, parse_transcription_form
from omni_gateway.gateway.http.endpoint import read_body, read_json
from omni_gateway.gateway.http.errors import ApiError, internal, invalid
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.streaming import CancellableStream, sse_event, unless_disconnected
from omni_gateway.gateway.http.wav import decode_wav, is_wav, wav_header
from omni_gateway.omni.protocol import AudioChunk, OmniBackend
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Message as AsgiMessage
from starlette.types import Receive

log = logging.getLogger("omni_gateway.gateway.http")
_MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}


async def transcriptions(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    # the whole upload is bounded before python-multipart sees it, then replayed to the form parser
    raw = await read_body(request, limits.max_body_bytes)
    replayed = Request(request.scope, _replay(raw))
    try:
        async with replayed.form(max_files=1, max_fields=16) as form:
            call = parse_transcription_form(form, backend.capabilities)
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise invalid(
                    "Missing required parameter: 'file' (the audio upload).", "file", "missing_required_parameter"
                )
            data = await upload.read()
    except (MultiPartException, HTTPException):  # the parser's own wording is not shown to clients
        raise invalid("The body is not a valid multipart/form-data upload.", code="invalid_multipart") from None
    if not is_wav(data):
        raise invalid(
            "'file' must be a PCM WAV file; this server decodes no other upload format. Convert "
            "first, e.g. ffmpeg -i in.mp3 -ac 1 -ar 16000 out.wav",
            "file",
            "unsupported_audio_format",
        )
    pcm16, rate = await anyio.to_thread.run_sync(
        lambda: decode_wav(data, max_seconds=limits.max_audio_seconds, param="file")
    )
    result = await unless_disconnected(
        request, lambda: backend.transcribe(pcm16, rate, language=call.language, prompt=call.prompt)
    )
    if call.response_format == "text":
        return PlainTextResponse(result.text)
    if call.response_format == "verbose_json":
        return JSONResponse(
            {
                "task": "transcribe",
                "language": result.language or call.language or "",
                "duration": result.duration_s,
                "text": result.text,
                "usage": {"type": "duration", "seconds": result.duration_s},
            }
        )
    return JSONResponse({"text": result.text, "usage": {"type": "duration", "seconds": result.duration_s}})


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> AsgiMessage:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def speech(request: Request, backend: OmniBackend, limits: HttpLimits) -> Response:
    call = parse_speech(await read_json(request, limits.max_body_bytes), backend.capabilities, limits)
    stream = aiter(backend.synthesize(call.text, call.options))

    async def close() -> None:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()

    try:  # wait for the first chunk so a failing voice model answers with an error status, not broken audio
        first = await unless_disconnected(request, lambda: anext(stream, None))
        if call.response_format == "flac":
            return Response(
                await unless_disconnected(request, lambda: _flac(first, stream)), media_type=_MEDIA_TYPES["flac"]
            )
    except BaseException:
        await close()
        raise
    response: Response
    if call.sse:
        response = CancellableStream(_speech_events(first, stream), cleanup=close)
    else:
        response = CancellableStream(
            _audio_bytes(call, first, stream), cleanup=close, media_type=_MEDIA_TYPES[call.response_format]
        )
    return response


async def _chunks(first: AudioChunk | None, stream: AsyncIterator[AudioChunk]) -> AsyncIterator[AudioChunk]:
    """The chunks that carry audio (a transcript-only chunk has nothing for this endpoint)."""
    if first is None:
        return
    if first.pcm16:
        yield first
    async for chunk in stream:
        if chunk.pcm16:
            yield chunk


async def _audio_bytes(
    call: SpeechCall, first: AudioChunk | None, stream: AsyncIterator[AudioChunk]
) -> AsyncIterator[bytes]:
    if call.response_format == "wav":
        yield wav_header(first.sample_rate if first else call.options.sample_rate)
    try:
        async for chunk in _chunks(first, stream):
            yield chunk.pcm16
    except Exception:  # the status line is sent: ending the body early is all that is left
        log.exception("speech synthesis failed mid-stream")


async def _speech_events(first: AudioChunk | None, stream: AsyncIterator[AudioChunk]) -> AsyncIterator[bytes]:
    try:
        async for chunk in _chunks(first, stream):
            yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(chunk.pcm16).decode()})
    except ApiError as error:
        yield sse_event(error.body())
        return
    except Exception:
        log.exception("speech synthesis failed mid-stream")
        yield sse_event(internal().body())
        return
    yield sse_event({"type": "speech.audio.done"})


async def _flac(first: AudioChunk | None, stream: AsyncIterator[AudioChunk]) -> bytes:
    pcm = bytearray()
    rate = first.sample_rate if first else 24000
    async for chunk in _chunks(first, stream):
        pcm += chunk.pcm16
    out = io.BytesIO()
    soundfile.write(out, np.frombuffer(bytes(pcm), dtype="<i2"), rate, format="FLAC", subtype="PCM_16")
    return out.getvalue()
