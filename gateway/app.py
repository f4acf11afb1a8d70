"""The ASGI application: the realtime WebSocket route next to the HTTP API routes, behind the admission guard."""
from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware

from omni_gateway.gateway import http, metrics
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.demo import demo_routes
from omni_gateway.gateway.guard import Guard
from omni_gateway.gateway.realtime.endpoint import probe_vad, realtime_route
from omni_gateway.omni.protocol import OmniBackend


def create_app(backend: OmniBackend, config: GatewayConfig | None = None) -> Starlette:
    """``app.state`` carries the backend and config for routes and embedding applications."""
    config = config or GatewayConfig()

    def count_session(delta: int) -> None:
        metrics.SESSIONS_OPEN.inc(delta)

    def healthy() -> bool:
        return backend.health().ok

    routes = [realtime_route(backend, config, probe_vad(backend), count_session), *http.routes(backend, config),
              *demo_routes()]
    guard = Middleware(Guard, api_key=config.api_key, allowed_origins=config.allowed_origins,
                       max_sessions_per_key=config.max_sessions_per_key,
                       max_requests_per_key=config.max_requests_per_key,
                       max_http_requests=config.max_http_requests, healthy=healthy)
    app = Starlette(routes=routes, middleware=[guard])
    app.state.backend = backend
    app.state.config = config
    return app
