"""Running one task of a realtime session against the backend (a transcription, a generation with its
prompt fitted off the event loop, an ASR deadline): each outcome goes back to the session, and what the
session answers goes to ``report`` (the connection's dispatch, which waits while the client lags)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from omni_gateway.gateway import metrics
from omni_gateway.gateway.realtime.commands import Generate, Output, Prefill, Transcribe, Work
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.gateway.realtime.truncation import PromptFit
from omni_gateway.omni.protocol import AudioChunk, Message, OmniBackend, OmniRequest, OutputChunk, TextDelta, Usage

log = logging.getLogger(__name__)

Report = Callable[[list[Output]], Awaitable[None]]


async def run_task(backend: OmniBackend, session: RealtimeSession, task_id: str, work: Work, report: Report) -> None:
    try:
        if isinstance(work, Transcribe):
            await _transcribe(backend, session, task_id, work, report)
        elif isinstance(work, Generate):
            await _generate(backend, session, task_id, work, report)
        elif isinstance(work, Prefill):
            await _prefill(backend, session, work)
        else:
            await asyncio.sleep(work.seconds)
            await report(session.on_asr_timeout(work.response_id))
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug here must not leave an unobserved task failure behind
        log.exception("realtime task %s failed", task_id)


class _AsrLoad:
    """Transcriptions under way in this process: a partial one starts only when there are none, so reading
    a turn while it is spoken never queues ahead of a turn that ended."""

    running = 0


async def _transcribe(
    backend: OmniBackend, session: RealtimeSession, task_id: str, job: Transcribe, report: Report
) -> None:
    if job.partial and _AsrLoad.running:
        await report(session.on_partial_transcription(task_id, None))
        return
    _AsrLoad.running += 1
    try:
        result = await backend.transcribe(job.pcm16, job.sample_rate, language=job.language, prompt=job.prompt)
    except Exception as exc:
        if job.partial:
            log.debug("partial transcription of %s failed: %s", task_id, exc)
            await report(session.on_partial_transcription(task_id, None))
            return
        log.warning("transcription of %s failed: %s", task_id, exc)
        await report(session.on_transcription_failed(task_id, "Transcription failed."))
        return
    finally:
        _AsrLoad.running -= 1
    if job.partial:
        await report(session.on_partial_transcription(task_id, result))
    else:
        await report(session.on_transcription(task_id, result))


async def _generate(
    backend: OmniBackend, session: RealtimeSession, task_id: str, work: Generate, report: Report
) -> None:
    """The backend's chunks for ``work.request`` into the session; its backend request is aborted when the
    task is cancelled or fails before the stream's end."""
    stream: AsyncIterator[OutputChunk] | None = None
    exhausted = False
    timer = metrics.TokenTimer("realtime")
    request = dataclasses.replace(work.request, session_id=session.id)  # keeps the session on one replica
    try:
        if work.fit is not None:
            request, cut = await _fit_prompt(work.fit, request)
            if cut is not None:
                await report(session.on_prompt_fitted(task_id, cut))
        stream = backend.generate(request)
        async for chunk in stream:
            if isinstance(chunk, (TextDelta, AudioChunk)):
                timer.tick()
            elif isinstance(chunk, Usage):
                metrics.count_tokens("realtime", chunk.input_tokens, chunk.output_tokens)
            await report(session.on_chunk(task_id, chunk))
            # A rendered clause arrives as a burst of chunks that are all ready, and neither the stream nor
            # the outbox suspends then: without this one burst, and those of every session woken with it,
            # would run in one loop iteration and hold up every other session's events.
            await asyncio.sleep(0)
        exhausted = True
        await report(session.on_stream_end(task_id))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("backend generation failed for %s", task_id)
        await report(session.on_stream_end(task_id, "The backend failed while generating."))
    finally:
        await _close_generation(backend, stream, request.request_id, exhausted=exhausted)


async def _prefill(backend: OmniBackend, session: RealtimeSession, work: Prefill) -> None:
    """Run ``work.request``'s prompt through the backend's one decode path as a one-token text answer
    (``prefill_only``: as the reply in its modalities will compute it), which leaves its KV in the prefix cache;
    the token is dropped. Failures only cost the reply that work."""
    request = dataclasses.replace(
        work.request,
        session_id=session.id,
        prefill_only=True,
        sampling=dataclasses.replace(work.request.sampling, max_tokens=1, constraint=None),
    )
    stream: AsyncIterator[OutputChunk] | None = None
    exhausted = False
    try:
        if work.fit is not None:
            request, _ = await _fit_prompt(work.fit, request)
        stream = backend.generate(request)
        async for _chunk in stream:
            pass
        exhausted = True
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.debug("prefilling %s failed: %s", request.request_id, exc)
    finally:
        await _close_generation(backend, stream, request.request_id, exhausted=exhausted)


async def _close_generation(backend: OmniBackend, stream: Any, request_id: str, *, exhausted: bool) -> None:
    """Close ``stream`` (when it has ``aclose``), then abort ``request_id`` unless the stream ran to its
    end. Runs on the way out of a task, so failures are logged, never raised."""
    aclose = getattr(stream, "aclose", None) if stream is not None else None
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            log.exception("closing the backend stream of %s failed", request_id)
    if not exhausted:
        try:
            await backend.abort(request_id)
        except Exception:
            log.exception("aborting %s failed", request_id)


async def _fit_prompt(fit: PromptFit, request: OmniRequest) -> tuple[OmniRequest, tuple[Message, ...] | None]:
    """``request`` without the oldest conversation messages that ``fit`` leaves out, and those messages;
    unchanged (and None) when counting fails, so the backend refuses an over-long prompt itself."""
    try:
        # Counting renders and tokenizes the prompt: CPU work kept off the event loop.
        fitted, cut = await asyncio.to_thread(fit.apply, request)
    except Exception:
        log.exception("counting the prompt tokens of %s failed; sending it uncut", request.request_id)
        return request, None
    if cut:
        log.debug(
            "%s: the prompt leaves out the %d oldest conversation messages (%d-token context)",
            request.request_id,
            len(cut),
            fit.context_tokens,
        )
    return fitted, cut
