"""OpenAI-compatible HTTP API, mounted next to the realtime WebSocket route by ``gateway.app``."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.http import audio, chat, completions, images, ops
from gateway.http.endpoint import endpoint
from gateway.http.limits import HttpLimits
from omni.protocol import OmniBackend

__all__ = ["HttpLimits", "routes"]


def routes(backend: OmniBackend, config: Any) -> list[BaseRoute]:
    """Every HTTP route of the OpenAI API this server answers, bound to ``backend``.

    ``config`` is the gateway configuration: ``api_key`` (when set, every route but /health wants
    ``Authorization: Bearer <key>``) and optionally ``http_limits`` (an ``HttpLimits``).
    """
    limits = HttpLimits.of(config)
    api_key = getattr(config, "api_key", None)

    def bind(path: str, handler: Callable[..., Awaitable[Response]], method: str, *, open_: bool = False,
             limited: bool = False) -> Route:
        async def call(request: Request) -> Response:
            return await (handler(request, backend, limits) if limited else handler(request, backend))

        return Route(path, endpoint(path, call, api_key=None if open_ else api_key), methods=[method])

    return [
        bind("/health", ops.health, "GET", open_=True),
        bind("/metrics", ops.metrics, "GET"),
        bind("/v1/models", ops.list_models, "GET"),
        bind("/v1/models/{model:path}", ops.get_model, "GET"),
        bind("/v1/chat/completions", chat.chat_completions, "POST", limited=True),
        bind("/v1/completions", completions.completions, "POST", limited=True),
        bind("/v1/audio/transcriptions", audio.transcriptions, "POST", limited=True),
        bind("/v1/audio/speech", audio.speech, "POST", limited=True),
        bind("/v1/images/generations", images.image_generations, "POST", limited=True),
    ]
