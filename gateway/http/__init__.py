"""OpenAI-compatible HTTP API, mounted next to the realtime WebSocket route by ``gateway.app``.

Where it differs from OpenAI's API, on purpose:
- images in chat messages are base64 data URIs only: the server fetches no URLs;
- chat ``input_audio`` in WAV is decoded here, mp3 travels as ``AudioPart.encoded`` for the model
  side to decode; transcription uploads must be PCM WAV (no decoder of compressed audio runs here);
- speech comes as wav (the default, streamed with an open-ended header), pcm or flac;
- a named ``tool_choice`` is called exactly once, whatever ``parallel_tool_calls`` says;
- the audio endpoints accept any ``model`` name: there is one recogniser and one voice model;
- /v1/responses and Anthropic's /v1/messages run as chat completions (``responses_request``,
  ``messages_request`` rewrite them for ``parse_chat``); responses are stored in memory only, and no
  built-in tool runs;
- /v1/embeddings takes ``dimensions`` only as the model's own vector size.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from omni_gateway.gateway.http import audio, chat, completions, embeddings, images, lora, messages, ops, responses
from omni_gateway.gateway.http.endpoint import endpoint
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.responses_store import ResponseStore
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
    store = ResponseStore(config.max_stored_responses)

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
        bind("/v1/embeddings", embeddings.embeddings, "POST", limited=True),
        bind("/v1/messages", messages.create, "POST", limited=True),
        bind("/v1/responses", functools.partial(responses.create, store=store), "POST", limited=True),
        bind("/v1/responses/{response_id}", functools.partial(responses.retrieve, store=store), "GET"),
        bind("/v1/responses/{response_id}", functools.partial(responses.delete, store=store), "DELETE"),
        bind("/v1/load_lora_adapter", lora.load_lora_adapter, "POST", limited=True),
        bind("/v1/unload_lora_adapter", lora.unload_lora_adapter, "POST", limited=True),
    ]
