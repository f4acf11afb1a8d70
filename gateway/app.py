"""The ASGI application: the realtime WebSocket route next to the HTTP API routes."""
from __future__ import annotations

from starlette.applications import Starlette

from gateway import http, metrics
from gateway.config import GatewayConfig
from gateway.realtime.endpoint import probe_vad, realtime_route
from omni.protocol import OmniBackend


def create_app(backend: OmniBackend, config: GatewayConfig | None = None) -> Starlette:
    """``app.state`` carries the backend and config for routes and embedding applications."""
    config = config or GatewayConfig()

    def count_session(delta: int) -> None:
        metrics.SESSIONS_OPEN.inc(delta)

    routes = [realtime_route(backend, config, probe_vad(backend), count_session), *http.routes(backend, config)]
    app = Starlette(routes=routes)
    app.state.backend = backend
    app.state.config = config
    return app
