"""Admission in front of every route, on the raw ASGI scope: API key, WebSocket Origin, per-key limits, health.

Decisions use ``scope["path"]`` (the path the router dispatches on), never a URL rebuilt from the Host
header, so header tricks cannot make a protected route look public. Everything refused here is refused
at once with an explicit status (401/403/429/503), never queued.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from omni_gateway.gateway.auth import bearer_token, key_matches

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

KEY_PROTOCOL_PREFIX = "openai-insecure-api-key."
# /demo serves the browser page, which sends its key in the WebSocket subprotocol; /health is for probes.
PUBLIC_PATHS = ("/health",)
PUBLIC_PREFIXES = ("/demo",)
# Observability stays reachable while the backend is down: that is when it matters most.
UNGATED_BY_HEALTH = ("/health", "/metrics")

_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error", 503: "server_error"}
# Without the ASGI denial-response extension a refused handshake can only be a close; servers answer it with 403.
_CLOSE_CODES = {401: 1008, 403: 1008, 429: 1013, 503: 1013}


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or any(path == p or path.startswith(p + "/") for p in PUBLIC_PREFIXES)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def presented_key(scope: Scope) -> str | None:
    """The credential of a request: a Bearer header, or for WebSockets the key-bearing subprotocol."""
    token = bearer_token(_header(scope, b"authorization"))
    if token is not None or scope["type"] != "websocket":
        return token
    offered = scope.get("subprotocols") or ()
    return next((p[len(KEY_PROTOCOL_PREFIX):] for p in offered if p.startswith(KEY_PROTOCOL_PREFIX)), None)


def origin_allowed(origin: str | None, host: str | None, allowed: tuple[str, ...]) -> bool:
    """No Origin (a non-browser client), the server's own host, or an origin on the allow-list ("*": any)."""
    if origin is None:
        return True
    if "*" in allowed or origin in allowed:
        return True
    if origin == "null" or host is None:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


class Guard:
    """Pure ASGI middleware; ``healthy`` is read per request (cheap: a thread liveness check)."""

    def __init__(self, app: App, *, api_key: str | None, allowed_origins: tuple[str, ...],
                 max_sessions_per_key: int, max_requests_per_key: int, max_http_requests: int,
                 healthy: Callable[[], bool]) -> None:
        self.app = app
        self.api_key = api_key
        self.allowed_origins = allowed_origins
        self.max_sessions_per_key = max_sessions_per_key
        self.max_requests_per_key = max_requests_per_key
        self.max_http_requests = max_http_requests
        self.healthy = healthy
        self.sessions: Counter[str] = Counter()  # open WebSockets per key
        self.requests: Counter[str] = Counter()  # HTTP requests in flight per key (streams count until done)
        self.http_in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if is_public(path):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope, kind, path)
        if refusal is not None:
            status, code, message = refusal
            await (self._deny_websocket if kind == "websocket" else self._deny_http)(
                receive, send, scope, status, code, message)
            return
        owner = self._owner(scope)
        if kind == "websocket":
            self.sessions[owner] += 1
        else:
            self.requests[owner] += 1
            self.http_in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            counter = self.sessions if kind == "websocket" else self.requests
            counter[owner] -= 1
            if counter[owner] <= 0:
                del counter[owner]
            if kind == "http":
                self.http_in_flight -= 1

    def _owner(self, scope: Scope) -> str:
        """Whom the per-key limits count: the key, or without authentication the client's address."""
        if self.api_key is not None:
            return "key:" + self.api_key
        client = scope.get("client")
        return "client:" + (client[0] if client else "unknown")

    def _refusal(self, scope: Scope, kind: str, path: str) -> tuple[int, str, str] | None:
        if kind == "websocket":
            origin = _header(scope, b"origin")
            if not origin_allowed(origin, _header(scope, b"host"), self.allowed_origins):
                return 403, "origin_not_allowed", (f"WebSocket connections from origin {origin[:200]!r} are not "
                                                   "allowed; the server's allowed_origins lists the accepted ones.")
        if self.api_key is not None and not key_matches(presented_key(scope), self.api_key):
            how = "'Authorization: Bearer <key>'" + (
                " or the 'openai-insecure-api-key.<key>' subprotocol" if kind == "websocket" else "")
            return 401, "invalid_api_key", f"Incorrect or missing API key. Send it as {how}."
        if path not in UNGATED_BY_HEALTH and not self.healthy():
            return 503, "server_unavailable", "The model backend is not running; try again later."
        owner = self._owner(scope)
        if kind == "websocket" and self.sessions[owner] >= self.max_sessions_per_key:
            return 429, "rate_limit_exceeded", (f"This key already has {self.max_sessions_per_key} realtime "
                                                "sessions open; close one or try again later.")
        if kind == "http" and path not in UNGATED_BY_HEALTH:
            if self.requests[owner] >= self.max_requests_per_key:
                return 429, "rate_limit_exceeded", (f"This key already has {self.max_requests_per_key} requests "
                                                    "in flight; wait for one to finish.")
            if self.http_in_flight >= self.max_http_requests:
                return 503, "server_overloaded", (f"This server already serves {self.max_http_requests} "
                                                  "requests; try again later.")
        return None

    @staticmethod
    def _body(status: int, code: str, message: str) -> bytes:
        return json.dumps({"error": {"message": message, "type": _ERROR_TYPES[status], "param": None,
                                     "code": code}}).encode()

    @staticmethod
    def _headers(status: int, body: bytes) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if status in (429, 503):
            headers.append((b"retry-after", b"1"))
        return headers

    async def _deny_http(self, receive: Receive, send: Send, scope: Scope, status: int, code: str,
                         message: str) -> None:
        body = self._body(status, code, message)
        await send({"type": "http.response.start", "status": status, "headers": self._headers(status, body)})
        await send({"type": "http.response.body", "body": body})

    async def _deny_websocket(self, receive: Receive, send: Send, scope: Scope, status: int, code: str,
                              message: str) -> None:
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        if "websocket.http.response" in (scope.get("extensions") or {}):
            body = self._body(status, code, message)
            await send({"type": "websocket.http.response.start", "status": status,
                        "headers": self._headers(status, body)})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": _CLOSE_CODES[status], "reason": message[:120]})
