"""WebRTC calls in the guard's count of realtime sessions, on the raw ASGI interface: a call counts from its placing
until it ends, against the per-key and server limits and as a voice session; a WebSocket joining a call does not
count as a second voice session."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.guard import CALL_HOLD, Guard, SessionHold

HOST = [(b"host", b"127.0.0.1:8000")]


def place_scope() -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/v1/realtime/calls", "headers": HOST, "client": ("1.2.3.4", 1)}


def ws_scope(query: bytes = b"") -> dict[str, Any]:
    return {
        "type": "websocket",
        "path": "/v1/realtime",
        "query_string": query,
        "headers": HOST,
        "client": ("1.2.3.4", 2),
        "extensions": {"websocket.http.response": {}},
    }


class Server:
    """A guard over an app that places every call it is asked to (keeping the hold) unless told to fail, and
    holds WebSockets open until ``hang_up``."""

    def __init__(self, config: GatewayConfig, place: bool = True) -> None:
        self.place = place
        self.calls: list[SessionHold] = []
        self.open_sockets = asyncio.Event()
        self.guard = Guard(self.app, config=config, healthy=lambda: True, voice=True)

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self.open_sockets.wait()
            return
        hold: SessionHold = scope[CALL_HOLD]
        if self.place:
            hold.kept = True
            self.calls.append(hold)
        await send({"type": "http.response.start", "status": 201 if self.place else 400, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def request(self, scope: dict[str, Any]) -> tuple[int | None, dict[str, Any] | None]:
        """The status the guard or the app answered, and the guard's error body if it refused (None, None: a
        WebSocket the app took and closed without a word)."""
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "websocket.connect"} if scope["type"] == "websocket" else {"type": "http.request"}

        async def send(message: Any) -> None:
            sent.append(dict(message))

        await self.guard(scope, receive, send)
        if not sent:
            return None, None
        start = sent[0]
        body = sent[1].get("body") if len(sent) > 1 else b""
        return start["status"], json.loads(body)["error"] if body else None

    async def open_socket(self, query: bytes = b"") -> asyncio.Task[Any]:
        task = asyncio.create_task(self.request(ws_scope(query)))
        await asyncio.sleep(0.01)  # inside the app: counted
        return task


def test_a_live_call_counts_against_the_keys_sessions_until_it_ends() -> None:
    async def scenario() -> None:
        server = Server(GatewayConfig(max_sessions_per_key=1))
        assert (await server.request(place_scope()))[0] == 201
        assert server.guard.sessions.total() == 1 and server.guard.voice_sessions == 1  # the request ended
        status, error = await server.request(place_scope())
        assert status == 429 and error is not None and error["code"] == "rate_limit_exceeded"
        status, _ = await server.request(ws_scope())
        assert status == 429  # a WebSocket session of the same key too
        server.calls[0].release()
        server.calls[0].release()  # the call ends once, however often it says so
        assert server.guard.sessions.total() == 0 and server.guard.voice_sessions == 0
        assert (await server.request(place_scope()))[0] == 201

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_call_is_refused_at_the_server_session_cap_and_a_refused_offer_frees_its_slot() -> None:
    async def scenario() -> None:
        server = Server(GatewayConfig(max_sessions=1), place=False)
        assert (await server.request(place_scope()))[0] == 400  # the app refused the offer: nothing kept
        assert server.guard.sessions.total() == 0
        socket = await server.open_socket()
        status, error = await server.request(place_scope())
        assert status == 503 and error is not None and error["code"] == "server_overloaded"
        server.open_sockets.set()
        await socket

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_calls_are_voice_sessions_and_a_websocket_joining_one_is_not_a_second() -> None:
    async def scenario() -> None:
        server = Server(GatewayConfig(max_voice_sessions=1))
        assert (await server.request(place_scope()))[0] == 201
        status, error = await server.request(place_scope())
        assert status == 503 and error is not None and error["code"] == "voice_capacity_reached"
        status, _ = await server.request(ws_scope())
        assert status == 503  # a WebSocket session of its own is one more voice session
        joined = await server.open_socket(b"call_id=rtc_123")
        assert server.guard.voice_sessions == 1 and server.guard.sessions.total() == 2
        server.open_sockets.set()
        assert await joined == (None, None)  # admitted: the guard sent no refusal
        assert server.guard.voice_sessions == 1
        server.calls[0].release()
        assert server.guard.voice_sessions == 0

    asyncio.run(asyncio.wait_for(scenario(), 10))
