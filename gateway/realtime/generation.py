"""Starting and ending a backend generation stream, shared by responses and prepared replies."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from omni_gateway.gateway.realtime.truncation import PromptWindow, Truncation
from omni_gateway.omni.protocol import OmniBackend, OmniRequest

log = logging.getLogger(__name__)


async def close_generation(backend: OmniBackend, stream: Any, request_id: str, *, exhausted: bool) -> None:
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


async def fit_request(backend: OmniBackend, request: OmniRequest, truncation: Truncation,
                      window: PromptWindow) -> OmniRequest:
    """``request`` without the oldest conversation messages that the session's ``window`` leaves out
    (``gateway.realtime.truncation``). Unchanged when truncation is disabled, the backend states no
    context window, or counting fails (the backend then refuses an over-long prompt itself)."""
    limit = backend.capabilities.max_context_tokens
    if not truncation.enabled or limit <= 0:
        return request
    try:
        # Counting renders and tokenizes the prompt: CPU work kept off the event loop.
        messages, dropped = await asyncio.to_thread(window.fit, request.messages, backend.count_tokens, limit,
                                                    request.sampling.max_tokens, truncation)
    except Exception:
        log.exception("counting the prompt tokens of %s failed; sending it uncut", request.request_id)
        return request
    if not dropped:
        return request
    log.debug("%s: the prompt leaves out the %d oldest conversation messages (%d-token context)",
              request.request_id, dropped, limit)
    return dataclasses.replace(request, messages=messages)
