"""OpenAI-compatible HTTP API, mounted next to the realtime WebSocket route by ``gateway.app``.

Where it differs from OpenAI's API, on purpose:
- images in chat messages are base64 data URIs only: the server fetches no URLs;
- chat ``input_audio`` in WAV is decoded here, mp3 travels as ``AudioPart.encoded`` for the model
  side to decode; transcription uploads must be PCM WAV (no decoder of compressed audio runs here);
- speech comes as wav (the default, streamed with an open-ended header), pcm or flac;
- a named ``tool_choice`` is called exactly once, whatever ``parallel_tool_calls`` says;
- the audio endpoints accept any ``model`` name: there is one recogniser and one voice model.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from omni_gateway.gateway.http import audio, chat, completions, images, ops
from omni_gateway.gateway.http.endpoint import endpoint
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.omni.protocol import OmniBackend
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

if TYPE_CHECKING:  # gateway.config imports HttpLimits from this package
    from omni_gateway.gateway.config import GatewayConfig

__all__ = ["HttpLimits", "routes"]


def routes(backend: OmniBackend, config: GatewayConfig) -> list[BaseRoute]:
    """Every HTTP route of the OpenAI API this server answers, bound to ``backend``.

    ``config.http`` bounds bodies, media and sampling parameters; the guard in front of the app checks the
    API key (every route but /health) and the requests in flight.
    """
    limits = config.http

    def bind(path: str, handler: Callable[..., Awaitable[Response]], method: str, *, limited: bool = False) -> Route:
        async def call(request: Request) -> Response:
            return await (handler(request, backend, limits) if limited else handler(request, backend))

        return Route(path, endpoint(path, call), methods=[method])

    return [
        bind("/health", ops.health, "GET"),
        bind("/metrics", ops.metrics, "GET"),
        bind("/v1/models", ops.list_models, "GET"),
        bind("/v1/models/{model:path}", ops.get_model, "GET"),
        bind("/v1/chat/completions", chat.chat_completions, "POST", limited=True),
        bind("/v1/completions", completions.completions, "POST", limited=True),
        bind("/v1/audio/transcriptions", audio.transcriptions, "POST", limited=True),
        bind("/v1/audio/speech", audio.speech, "POST", limited=True),
        bind("/v1/images/generations", images.image_generations, "POST", limited=True),
    ]
