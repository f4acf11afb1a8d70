"""Ending a backend generation stream, shared by responses and prepared replies."""
from __future__ import annotations

import logging
from typing import Any

from omni.protocol import OmniBackend

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
