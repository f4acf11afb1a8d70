"""The ``/v1/realtime`` WebSocket handshake: authentication, dialect, subprotocol, session admission."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from omni_gateway.gateway.auth import bearer_token, key_matches
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.realtime.commands import VadFactory
from omni_gateway.gateway.realtime.connection import RealtimeConnection
from omni_gateway.gateway.realtime.settings import Dialect
from omni_gateway.omni.protocol import Health, OmniBackend, VadSettings

log = logging.getLogger(__name__)

KEY_PROTOCOL_PREFIX = "openai-insecure-api-key."
BETA_PROTOCOL = "openai-beta.realtime-v1"


def offered_key(websocket: WebSocket, offered: list[str]) -> str | None:
    token = bearer_token(websocket.headers.get("authorization"))
    if token is not None:
        return token
    return next((p[len(KEY_PROTOCOL_PREFIX):] for p in offered if p.startswith(KEY_PROTOCOL_PREFIX)), None)


def dialect_of(websocket: WebSocket, offered: list[str]) -> Dialect:
    beta_header = "realtime=v1" in websocket.headers.get("openai-beta", "").replace(" ", "").split(",")
    return "beta" if beta_header or BETA_PROTOCOL in offered else "ga"


def chosen_subprotocol(offered: list[str]) -> str | None:
    """Echo ``realtime`` when offered (browsers fail the handshake otherwise); never the key-bearing one."""
    for name in ("realtime", BETA_PROTOCOL):
        if name in offered:
            return name
    return None


def probe_vad(backend: OmniBackend) -> VadFactory | None:
    """The backend's VAD factory if it can build a detector (servers started without VAD cannot)."""
    try:
        backend.new_vad(VadSettings())
    except Exception as exc:  # any failure means: no server-side turn detection on this server
        log.info("voice activity detection unavailable (%s); realtime sessions default to manual turns", exc)
        return None
    return backend.new_vad


async def _deny(websocket: WebSocket, status: int, code: str, message: str, close_code: int) -> None:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": None}}
    try:
        await websocket.send_denial_response(JSONResponse(body, status_code=status))
    except RuntimeError:  # the server lacks the denial-response extension: a close before accept (HTTP 403)
        await websocket.close(code=close_code, reason=message)


async def watch_backend(backend: OmniBackend, connection: RealtimeConnection, period_s: float) -> None:
    """Polls the backend's health; when it stops, the session gets an ``error`` event and a 1011 close
    instead of waiting forever on a model that will never answer."""
    while True:
        await asyncio.sleep(period_s)
        try:
            state = backend.health()
        except Exception:  # a health check that raises is as bad as one that says no
            log.exception("backend health check failed")
            state = Health(ok=False, detail="health check failed")
        if not state.ok:
            connection.backend_stopped()
            return


def realtime_route(backend: OmniBackend, config: GatewayConfig, vad_factory: VadFactory | None,
                   on_session: Callable[[int], None] = lambda delta: None) -> WebSocketRoute:
    open_sessions = 0

    async def endpoint(websocket: WebSocket) -> None:
        nonlocal open_sessions
        offered = list(websocket.scope.get("subprotocols") or [])
        if config.api_key is not None and not key_matches(offered_key(websocket, offered), config.api_key):
            await _deny(websocket, 401, "invalid_api_key", "Incorrect or missing API key: send 'Authorization: "
                        "Bearer <key>' or the 'openai-insecure-api-key.<key>' subprotocol.", 1008)
            return
        if open_sessions >= config.max_sessions:
            await _deny(websocket, 503, "server_overloaded", f"This server already serves {config.max_sessions} "
                        "realtime sessions; try again later.", 1013)
            return
        await websocket.accept(subprotocol=chosen_subprotocol(offered))
        open_sessions += 1
        on_session(1)
        try:
            # ?intent=transcription opens a session that only transcribes (GA clients, livekit's STT)
            intent = websocket.query_params.get("intent", "realtime")
            connection = RealtimeConnection(websocket, backend, config, dialect_of(websocket, offered), vad_factory,
                                            intent)
            watcher = asyncio.create_task(watch_backend(backend, connection, config.health_poll_s))
            try:
                await connection.run()
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
        finally:
            open_sessions -= 1
            on_session(-1)

    return WebSocketRoute("/v1/realtime", endpoint)
