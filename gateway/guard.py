"""Admission in front of every route, on the raw ASGI scope: Host, API key, WebSocket Origin, session and
request limits, health. It is the one place each of them is checked, and the one count of open sessions.

Decisions use ``scope["path"]`` (the path the router dispatches on), never a URL rebuilt from the Host
header, so header tricks cannot make a protected route look public. The Host header is checked against an
allow-list on every route: a web page whose name resolves to this machine (DNS rebinding) names itself in
Host, and the Origin check, which compares Origin with Host, cannot catch that alone. Everything refused
here is refused at once with an explicit status (401/403/421/429/503), never queued.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from omni_gateway.gateway import metrics
from omni_gateway.gateway.anthropic_errors import MESSAGES_PATH, anthropic_error
from omni_gateway.gateway.auth import ClientSecrets, bearer_token, is_client_secret, key_matches

if TYPE_CHECKING:  # gateway.config imports host_name from here
    from omni_gateway.gateway.config import GatewayConfig
    from omni_gateway.gateway.realtime.voice_capacity import VoiceCapacity

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
REALTIME_PATH = "/v1/realtime"  # the sessions that use the speech stages
CALLS_PATH = "/v1/realtime/calls"  # WebRTC calls: placed and hung up over HTTP
# The scope key under which a request placing a call finds the session slot the guard counted for it.
CALL_HOLD = "omni_gateway.call_hold"

_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    421: "invalid_request_error",
    429: "rate_limit_error",
    503: "server_error",
}
# The reason each refusal of a WebSocket session is counted under, by its code, unless the refusal names one
# (metrics.REFUSAL_REASONS: a fixed set).
_SESSION_REFUSALS = {
    "host_not_allowed": "host",
    "origin_not_allowed": "origin",
    "invalid_api_key": "api_key",
    "server_unavailable": "backend_down",
    "rate_limit_exceeded": "max_sessions_per_key",
    "server_overloaded": "max_sessions",
    "voice_capacity_reached": "max_voice_sessions",
}
# Without the ASGI denial-response extension a refused handshake can only be a close; servers answer it with 403.
_CLOSE_CODES = {401: 1008, 403: 1008, 429: 1013, 503: 1013}


class SessionHold:
    """The session slot counted for a call being placed. The guard frees it when the request ends unless the
    route ``kept`` it, handing ``release`` to the call, which frees it when the call ends (once, however often
    it is called)."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release
        self.kept = False

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


class Refusal(NamedTuple):
    status: int
    code: str  # the error's ``code``
    message: str
    counted_as: str | None = None  # the refused-sessions reason where the code has several causes


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or any(path == p or path.startswith(p + "/") for p in PUBLIC_PREFIXES)


def _header(scope: Scope, name: bytes) -> str | None:
    key: bytes
    value: bytes
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def presented_key(scope: Scope) -> str | None:
    """The credential of a request: a Bearer header, an ``x-api-key`` header (Anthropic's clients send it), or
    for WebSockets the key-bearing subprotocol."""
    token: str | None = bearer_token(_header(scope, b"authorization")) or _header(scope, b"x-api-key")
    if token is not None or scope["type"] != "websocket":
        return token
    offered = scope.get("subprotocols") or ()
    return next((p[len(KEY_PROTOCOL_PREFIX) :] for p in offered if p.startswith(KEY_PROTOCOL_PREFIX)), None)


def opens_realtime(kind: str, path: str) -> bool:
    """What a client secret may do: open a realtime WebSocket, place a WebRTC call or hang one up."""
    if kind == "websocket":
        return path == REALTIME_PATH
    rest = path.removeprefix(CALLS_PATH)
    return rest == "" or (rest.startswith("/") and rest.endswith("/hangup") and rest.count("/") == 2)


def places_call(scope: Scope) -> bool:
    """A request placing a WebRTC call: a realtime session that outlives its HTTP request."""
    return scope["type"] == "http" and scope.get("path") == CALLS_PATH and scope.get("method") == "POST"


def joins_call(scope: Scope) -> bool:
    """A realtime WebSocket joining a live call (``?call_id=``): the call's session, not one of its own."""
    query = scope.get("query_string") or b""
    return b"call_id" in query and "call_id" in parse_qs(query.decode("latin-1"), keep_blank_values=True)


# One host: a DNS name or IPv4 address (letters, digits, '-', '_', dots), or an IPv6 address in brackets;
# then an optional port of 1 to 5 digits. Nothing else: no spaces, no user info, no second host.
_HOST_HEADER = re.compile(r"(?P<name>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?)(?::[0-9]{1,5})?")


def host_name(value: str) -> str:
    """A Host header value or allow-list entry as compared: lower case, IPv6 in brackets, no trailing dot,
    no port (a rebinding page differs from us in its name, not its port)."""
    name = value.strip().lower()
    if name.startswith("["):
        name = name[: name.find("]") + 1] if "]" in name else name
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    elif ":" in name:  # a bare IPv6 address
        name = f"[{name}]"
    return name.rstrip(".")


def parsed_host(value: str) -> str | None:
    """The name of a Host header that is exactly one host and an optional port, as ``host_name`` compares
    it; None for anything else (spaces, user info, a list, a path, a second port, stray characters)."""
    found = _HOST_HEADER.fullmatch(value)
    if found is None:
        return None
    return host_name(found["name"])


def host_allowed(host: str | None, allowed: tuple[str, ...] | None) -> bool:
    """No Host (HTTP/1.0: not a browser), or one well-formed host that is on the allow-list (any, where
    ``allowed`` is None)."""
    if host is None:
        return True
    name = parsed_host(host)
    return name is not None and (allowed is None or name in allowed)


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

    def __init__(
        self,
        app: App,
        *,
        config: GatewayConfig,
        healthy: Callable[[], bool],
        voice: bool = False,
        capacity: VoiceCapacity | None = None,
        secrets: ClientSecrets | None = None,
    ) -> None:
        self.app = app
        self.secrets = secrets  # the ephemeral keys minted here (None: none are accepted)
        self.config = config
        self.allowed_hosts = config.host_allow_list()
        self.healthy = healthy
        self.voice = voice  # the backend hears or speaks: every realtime session is a voice session
        self.sessions: Counter[str] = Counter()  # open WebSockets per key
        self.voice_sessions = 0
        self.capacity = capacity  # what the admitted voice sessions' replies measure (None: not judged)
        self.requests: Counter[str] = Counter()  # HTTP requests in flight per key (streams count until done)
        self.http_in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        refusal = self._refusal(scope, kind, path)
        if refusal is not None:
            status, code, message, counted_as = refusal
            if kind == "websocket" or places_call(scope):
                metrics.SESSIONS_REFUSED.labels(counted_as or _SESSION_REFUSALS.get(code, code)).inc()
            await (self._deny_websocket if kind == "websocket" else self._deny_http)(
                receive, send, scope, status, code, message
            )
            return
        if is_public(path):
            await self.app(scope, receive, send)
            return
        owner = self._owner(scope)
        counter = self.sessions if kind == "websocket" else self.requests
        counter[owner] += 1
        if kind == "websocket":
            self.voice_sessions += self._is_voice(scope)
            metrics.SESSIONS_ADMITTED.inc()
            metrics.SESSIONS_OPEN.inc()
        else:
            self.http_in_flight += 1
        hold = scope[CALL_HOLD] = self._hold(owner, self._is_voice(scope)) if places_call(scope) else None
        try:
            await self.app(scope, receive, send)
        finally:
            counter[owner] -= 1
            if counter[owner] <= 0:
                del counter[owner]
            if kind == "websocket":
                self.voice_sessions -= self._is_voice(scope)
                metrics.SESSIONS_OPEN.dec()
            else:
                self.http_in_flight -= 1
            if hold is not None and not hold.kept:
                hold.release()

    def _hold(self, owner: str, voice: bool) -> SessionHold:
        """Count a call as an open realtime session of ``owner`` (and a voice session) until it is released."""
        self.sessions[owner] += 1
        self.voice_sessions += voice
        metrics.SESSIONS_ADMITTED.inc()
        metrics.SESSIONS_OPEN.inc()

        def release() -> None:
            self.sessions[owner] -= 1
            if self.sessions[owner] <= 0:
                del self.sessions[owner]
            self.voice_sessions -= voice
            metrics.SESSIONS_OPEN.dec()

        return SessionHold(release)

    def _is_voice(self, scope: Scope) -> bool:
        """A realtime WebSocket of its own or a call: a session the speech stages serve."""
        if not self.voice:
            return False
        if scope["type"] == "websocket":
            return scope.get("path") == REALTIME_PATH and not joins_call(scope)
        return places_call(scope)

    def _owner(self, scope: Scope) -> str:
        """Whom the per-key limits count: the key, or without authentication the client's address."""
        if self.config.api_key is not None:
            return f"key:{self.config.api_key}"
        client = scope.get("client")
        return "client:" + (client[0] if client else "unknown")

    def _refusal(self, scope: Scope, kind: str, path: str) -> Refusal | None:
        host = _header(scope, b"host")
        if not host_allowed(host, self.allowed_hosts):
            return Refusal(
                421 if kind == "http" else 403,
                "host_not_allowed",
                (
                    f"This server does not answer to the host {(host or '')[:100]!r}; its allowed_hosts "
                    "(--allowed-hosts) list the accepted names."
                ),
            )
        if is_public(path):
            return None
        config, http = self.config, self.config.http
        if kind == "websocket":
            origin = _header(scope, b"origin")
            if not origin_allowed(origin, host, config.allowed_origins):
                return Refusal(
                    403,
                    "origin_not_allowed",
                    (
                        f"WebSocket connections from origin {(origin or '')[:200]!r} "
                        "are not allowed; the server's allowed_origins lists the "
                        "accepted ones."
                    ),
                )
        token = presented_key(scope)
        if self.secrets is not None and is_client_secret(token):
            if not opens_realtime(kind, path):
                return Refusal(
                    401,
                    "invalid_api_key",
                    "A client secret opens realtime connections only (the /v1/realtime WebSocket and "
                    "/v1/realtime/calls); this route needs the API key.",
                )
            _, why = self.secrets.check(token)
            if why is not None:
                return Refusal(401, "invalid_api_key", why)
        elif config.api_key is not None and not key_matches(token, config.api_key):
            how = "'Authorization: Bearer <key>', 'x-api-key: <key>'" + (
                " or the 'openai-insecure-api-key.<key>' subprotocol" if kind == "websocket" else ""
            )
            return Refusal(401, "invalid_api_key", f"Incorrect or missing API key. Send it as {how}.")
        if path not in UNGATED_BY_HEALTH and not self.healthy():
            return Refusal(503, "server_unavailable", "The model backend is not running; try again later.")
        owner = self._owner(scope)
        if kind == "websocket" or places_call(scope):
            if self.sessions[owner] >= config.max_sessions_per_key:
                return Refusal(
                    429,
                    "rate_limit_exceeded",
                    (
                        f"This key already has {config.max_sessions_per_key} realtime "
                        "sessions open; close one or try again later."
                    ),
                )
            if self.sessions.total() >= config.max_sessions:
                return Refusal(
                    503,
                    "server_overloaded",
                    (f"This server already serves {config.max_sessions} realtime sessions; try again later."),
                )
            if self._is_voice(scope) and (refused := self._voice_refusal()) is not None:
                return refused
        if kind == "http" and path not in UNGATED_BY_HEALTH:
            if self.requests[owner] >= http.max_requests_per_key:
                return Refusal(
                    429,
                    "rate_limit_exceeded",
                    (f"This key already has {http.max_requests_per_key} requests in flight; wait for one to finish."),
                )
            if self.http_in_flight >= http.max_requests:
                return Refusal(
                    503,
                    "server_overloaded",
                    (f"This server already serves {http.max_requests} requests; try again later."),
                )
        return None

    def _voice_refusal(self) -> Refusal | None:
        """A voice session past ``max_voice_sessions``, or while the admitted ones' replies fall behind real
        time. With no voice session open nothing is falling behind: what the window holds was measured under a
        load that has left."""
        cap = self.config.max_voice_sessions
        if cap is not None and self.voice_sessions >= cap:
            return Refusal(
                503,
                "voice_capacity_reached",
                f"This server's speech stages already serve {cap} voice sessions; try again later.",
            )
        if self.capacity is not None and self.voice_sessions > 0:
            admitted, measured = self.capacity.admits()
            if not admitted:
                return Refusal(
                    503,
                    "voice_capacity_reached",
                    f"This server's speech stages are at capacity ({measured}); try again later.",
                    counted_as="voice_falling_behind",
                )
        return None

    @staticmethod
    def _body(status: int, code: str, message: str) -> bytes:
        return json.dumps(
            {"error": {"message": message, "type": _ERROR_TYPES[status], "param": None, "code": code}}
        ).encode()

    @staticmethod
    def _headers(status: int, body: bytes) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if status in (429, 503):
            headers.append((b"retry-after", b"1"))
        return headers

    async def _deny_http(
        self, receive: Receive, send: Send, scope: Scope, status: int, code: str, message: str
    ) -> None:
        if scope.get("path") == MESSAGES_PATH:
            body = json.dumps(anthropic_error(status, message)).encode()
        else:
            body = self._body(status, code, message)
        await send({"type": "http.response.start", "status": status, "headers": self._headers(status, body)})
        await send({"type": "http.response.body", "body": body})

    async def _deny_websocket(
        self, receive: Receive, send: Send, scope: Scope, status: int, code: str, message: str
    ) -> None:
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        if "websocket.http.response" in (scope.get("extensions") or {}):
            body = self._body(status, code, message)
            await send(
                {"type": "websocket.http.response.start", "status": status, "headers": self._headers(status, body)}
            )
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": _CLOSE_CODES[status], "reason": message[:120]})
