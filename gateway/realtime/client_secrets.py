"""``POST /v1/realtime/client_secrets``: an ephemeral key for a browser, and the session configuration bound to it.

The body is OpenAI's (GA): ``{"expires_after": {"anchor": "created_at", "seconds": 10..7200}, "session":
{...}}``, both optional; the answer is ``{"value": "ek_...", "expires_at": ..., "session": {...}}``. The
session configuration is the one ``session.update`` takes: it is checked here by a session of its own (what
``session.update`` would refuse, minting refuses with the same message), and applied, before
``session.created``, to every connection the key opens. The guard lets only the API key mint (a client
secret cannot mint another) and lets a client secret open realtime connections only.
"""

from __future__ import annotations

import json
from typing import Any

from omni_gateway.gateway.auth import DEFAULT_TTL_S, ClientSecrets
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.http.endpoint import endpoint, read_json
from omni_gateway.gateway.http.errors import ApiError, invalid
from omni_gateway.gateway.realtime.commands import Send, VadFactory
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.omni.protocol import OmniBackend
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

MAX_BODY_BYTES = 1 << 20
CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"


def configure(session: RealtimeSession, configs: list[dict[str, Any]]) -> str | None:
    """Apply each configuration as a ``session.update`` before the session opens (the client hears none of
    them: ``session.created`` shows the result); the first refusal's message, None when all applied."""
    for config in configs:
        for out in session.receive({"type": "session.update", "session": config}):
            if isinstance(out, Send) and out.event["type"] == "error":
                message: str = out.event["error"]["message"]
                return message
    return None


def rendered_session(
    backend: OmniBackend, config: GatewayConfig, vad_factory: VadFactory | None, session_config: dict[str, Any] | None
) -> dict[str, Any]:
    """The session a connection opened with ``session_config`` starts with, as ``session.created`` shows it;
    ``ApiError`` 400 with ``session.update``'s message when the configuration is refused."""
    session = RealtimeSession(
        dialect="ga", capabilities=backend.capabilities, vad_factory=vad_factory, limits=config.session
    )
    refused = configure(session, [session_config] if session_config is not None else [])
    if refused is not None:
        raise invalid(refused, param="session", code="invalid_value")
    created = next(out.event for out in session.open() if isinstance(out, Send))
    rendered: dict[str, Any] = created["session"]
    return rendered


def _ttl(body: dict[str, Any]) -> int:
    expires = body.get("expires_after")
    if expires is None:
        return DEFAULT_TTL_S
    if not isinstance(expires, dict) or set(expires) - {"anchor", "seconds"}:
        raise invalid("expires_after must be {'anchor': 'created_at', 'seconds': N}.", param="expires_after")
    if expires.get("anchor", "created_at") != "created_at":
        raise invalid(
            f"Invalid value: {json.dumps(expires.get('anchor'))[:60]}. Supported values are: 'created_at'.",
            param="expires_after.anchor",
            code="invalid_value",
        )
    seconds = expires.get("seconds", DEFAULT_TTL_S)
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise invalid("expires_after.seconds must be an integer.", param="expires_after.seconds", code="invalid_type")
    return seconds


def client_secrets_route(
    backend: OmniBackend, config: GatewayConfig, vad_factory: VadFactory | None, secrets: ClientSecrets
) -> Route:
    async def mint(request: Request) -> Response:
        body = await read_json(request, MAX_BODY_BYTES)
        if not isinstance(body, dict):
            raise invalid("The request body must be a JSON object.", code="invalid_type")
        session = body.get("session")
        if session is not None and not isinstance(session, dict):
            raise invalid("session must be an object.", param="session", code="invalid_type")
        unknown = set(body) - {"expires_after", "session"}
        if unknown:
            raise invalid(f"Unknown parameter: '{sorted(unknown)[0][:60]}'.", param=sorted(unknown)[0][:60])
        ttl = _ttl(body)
        rendered = rendered_session(backend, config, vad_factory, session)
        try:
            secret = secrets.mint(ttl, session)
        except ValueError as exc:
            raise invalid(str(exc), param="expires_after.seconds", code="invalid_value") from None
        except OverflowError as exc:
            raise ApiError(429, str(exc), code="rate_limit_exceeded") from None
        return JSONResponse({"value": secret.value, "expires_at": secret.expires_at, "session": rendered})

    return Route(CLIENT_SECRETS_PATH, endpoint(CLIENT_SECRETS_PATH, mint), methods=["POST"])
