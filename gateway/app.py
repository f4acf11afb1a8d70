"""The ASGI application: the realtime WebSocket route, WebRTC calls and client secrets next to the HTTP API
routes, behind the admission guard."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from omni_gateway.gateway import http
from omni_gateway.gateway.auth import ClientSecrets
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.demo import demo_routes
from omni_gateway.gateway.guard import Guard
from omni_gateway.gateway.realtime.client_secrets import client_secrets_route
from omni_gateway.gateway.realtime.endpoint import probe_vad, realtime_route
from omni_gateway.gateway.realtime.voice_capacity import VoiceCapacity
from omni_gateway.gateway.realtime.webrtc_calls import Calls
from omni_gateway.gateway.realtime.webrtc_routes import call_routes
from omni_gateway.omni.protocol import OmniBackend
from starlette.applications import Starlette
from starlette.middleware import Middleware


def create_app(backend: OmniBackend, config: GatewayConfig | None = None) -> Starlette:
    """``app.state`` carries the backend, the config, the voice admission window, the client secrets and the
    live WebRTC calls for routes and embedding applications.

    The guard admits every request (Host, API key, Origin, limits, health); the routes behind it check none
    of that again. One ``VoiceCapacity`` per app: the realtime sessions feed it their spoken replies and the
    guard asks it before admitting another voice session.
    """
    config = config or GatewayConfig()

    def healthy() -> bool:
        ok: bool = backend.health().ok
        return ok

    caps = backend.capabilities
    voice = "audio" in caps.input_modalities or "audio" in caps.output_modalities
    capacity = VoiceCapacity(config.voice_admission_rtf)
    vad_factory = probe_vad(backend)
    secrets = ClientSecrets()
    calls = Calls(backend, config, vad_factory, capacity)
    routes = [
        realtime_route(backend, config, vad_factory, capacity, secrets, calls),
        client_secrets_route(backend, config, vad_factory, secrets),
        *call_routes(calls, secrets),
        *http.routes(backend, config),
        *demo_routes(),
    ]
    guard = Middleware(Guard, config=config, healthy=healthy, voice=voice, capacity=capacity, secrets=secrets)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await calls.hang_up_all()  # live WebRTC calls end with the server, not after it

    app = Starlette(routes=routes, middleware=[guard], lifespan=lifespan)
    app.state.backend = backend
    app.state.config = config
    app.state.voice_capacity = capacity
    app.state.client_secrets = secrets
    app.state.calls = calls
    return app
