"""The ASGI application: the realtime WebSocket route next to the HTTP API routes, behind the admission guard."""

from __future__ import annotations

from omni_gateway.gateway import http
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.demo import demo_routes
from omni_gateway.gateway.guard import Guard
from omni_gateway.gateway.realtime.endpoint import probe_vad, realtime_route
from omni_gateway.gateway.realtime.voice_capacity import VoiceCapacity
from omni_gateway.omni.protocol import OmniBackend
from starlette.applications import Starlette
from starlette.middleware import Middleware


def create_app(backend: OmniBackend, config: GatewayConfig | None = None) -> Starlette:
    """``app.state`` carries the backend, the config and the voice admission window for routes and embedding
    applications.

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
    routes = [
        realtime_route(backend, config, probe_vad(backend), capacity),
        *http.routes(backend, config),
        *demo_routes(),
    ]
    guard = Middleware(Guard, config=config, healthy=healthy, voice=voice, capacity=capacity)
    app = Starlette(routes=routes, middleware=[guard])
    app.state.backend = backend
    app.state.config = config
    app.state.voice_capacity = capacity
    return app
