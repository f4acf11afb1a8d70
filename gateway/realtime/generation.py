"""Around a backend generation stream: fitting its prompt before, and closing it after."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from omni_gateway.gateway.realtime.truncation import PromptFit
from omni_gateway.omni.protocol import Message, OmniBackend, OmniRequest

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


async def fit_prompt(fit: PromptFit, request: OmniRequest) -> tuple[OmniRequest, tuple[Message, ...] | None]:
    """``request`` without the oldest conversation messages that ``fit`` leaves out, and those messages;
    unchanged (and None) when counting fails, so the backend refuses an over-long prompt itself."""
    try:
        # Counting renders and tokenizes the prompt: CPU work kept off the event loop.
        fitted, cut = await asyncio.to_thread(fit.apply, request)
    except Exception:
        log.exception("counting the prompt tokens of %s failed; sending it uncut", request.request_id)
        return request, None
    if cut:
        log.debug("%s: the prompt leaves out the %d oldest conversation messages (%d-token context)",
                  request.request_id, len(cut), fit.context_tokens)
    return fitted, cut
