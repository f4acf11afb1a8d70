"""The ``/v1/realtime`` WebSocket handshake: dialect and subprotocol (the guard has admitted the socket).

With ``?call_id=`` the socket joins a live WebRTC call instead of opening a session of its own; opened with a
client secret, its session starts with the configuration bound to the secret.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING

from omni_gateway.gateway.auth import ClientSecrets, is_client_secret
from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.guard import presented_key
from omni_gateway.gateway.http.lora import served_adapters
from omni_gateway.gateway.realtime.client_secrets import configure
from omni_gateway.gateway.realtime.commands import VadFactory, new_id
from omni_gateway.gateway.realtime.connection import CLOSE_POLICY as _CLOSE_POLICY
from omni_gateway.gateway.realtime.connection import RealtimeConnection
from omni_gateway.gateway.realtime.errors import RealtimeError
from omni_gateway.gateway.realtime.settings import Dialect
from omni_gateway.gateway.realtime.voice_capacity import VoiceCapacity
from omni_gateway.omni.protocol import Health, OmniBackend, VadSettings
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

if TYPE_CHECKING:  # webrtc_calls imports watch_backend from here
    from omni_gateway.gateway.realtime.webrtc_calls import Calls

log = logging.getLogger(__name__)

BETA_PROTOCOL = "openai-beta.realtime-v1"


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


def _chosen_model(backend: OmniBackend, asked: str | None) -> str | None:
    """The connection's ``?model=``: the served model or a LoRA adapter over it. Without LoRA the server has
    one model, whatever the client names (OpenAI's clients send their own); with it an unknown name is refused."""
    caps = backend.capabilities
    if asked is None or not caps.serves_lora:
        return None
    if asked == caps.model or asked in served_adapters(backend):
        return asked
    served = ", ".join(f"'{m}'" for m in (caps.model, *sorted(served_adapters(backend))))
    raise RealtimeError(
        "model_not_found", f"The model {shown(asked)} does not exist; this server serves {served}.", "model"
    )


def realtime_route(
    backend: OmniBackend,
    config: GatewayConfig,
    vad_factory: VadFactory | None,
    capacity: VoiceCapacity | None = None,
    secrets: ClientSecrets | None = None,
    calls: Calls | None = None,
) -> WebSocketRoute:
    """The route; every session's spoken replies feed ``capacity``, the admission the guard consults."""

    async def endpoint(websocket: WebSocket) -> None:
        offered = list(websocket.scope.get("subprotocols") or [])
        await websocket.accept(subprotocol=chosen_subprotocol(offered))
        token = presented_key(websocket.scope)
        call_id = websocket.query_params.get("call_id")
        if call_id is not None:
            if calls is None:
                await websocket.close(code=1008, reason="this server takes no WebRTC calls")
            elif is_client_secret(token):  # steering a call is the server's, as OpenAI's sideband connection
                await websocket.close(code=1008, reason="joining a call takes the API key, not a client secret")
            else:
                await calls.join(websocket, call_id)
            return
        # ?intent=transcription opens a session that only transcribes (GA clients, livekit's STT)
        intent = websocket.query_params.get("intent", "realtime")
        model = websocket.query_params.get("model")
        try:
            model = _chosen_model(backend, model)
        except RealtimeError as error:
            event = {"event_id": new_id("event"), "type": "error", "error": error.body(None)}
            await websocket.send_text(json.dumps(event))
            await websocket.close(code=_CLOSE_POLICY, reason="model_not_found")
            return
        connection = RealtimeConnection(
            websocket, backend, config, dialect_of(websocket, offered), vad_factory, intent, capacity, model
        )
        if secrets is not None and is_client_secret(token):
            secret, _ = secrets.check(token)  # the guard let it through: it is live
            if secret is not None and secret.session is not None:  # checked when minted, as a GA session
                refused = configure(connection.session, [secret.session])
                if refused is not None:
                    log.info("a client secret's session did not apply to this session: %s", refused)
        watcher = asyncio.create_task(watch_backend(backend, connection, config.health_poll_s))
        try:
            await connection.run()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    return WebSocketRoute("/v1/realtime", endpoint)
