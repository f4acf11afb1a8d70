"""The ASGI application: the realtime WebSocket route next to the HTTP API routes, behind the admission guard."""

from __future__ import annotations

from omni_gateway.gateway import http
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.demo import demo_routes
from omni_gateway.gateway.guard import Guard
from omni_gateway.gateway.realtime.endpoint import probe_vad, realtime_route
from omni_gateway.omni.protocol import OmniBackend
from starlette.applications import Starlette
from starlette.middleware import Middleware


def create_app(backend: OmniBackend, config: GatewayConfig | None = None) -> Starlette:
    """``app.state`` carries the backend and config for routes and embedding applications.

    The guard admits every request (Host, API key, Origin, limits, health); the routes behind it check none
    of that again.
    """
    config = config or GatewayConfig()

    def healthy() -> bool:
        ok: bool = backend.health().ok
        return ok

    caps = backend.capabilities
    voice = "audio" in caps.input_modalities or "audio" in caps.output_modalities
    routes = [realtime_route(backend, config, probe_vad(backend)), *http.routes(backend, config), *demo_routes()]
    app = Starlette(routes=routes, middleware=[Middleware(Guard, config=config, healthy=healthy, voice=voice)])
    app.state.backend = backend
    app.state.config = config
    return app
